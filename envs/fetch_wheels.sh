#!/usr/bin/env bash
# Fetch, on a machine with PyPI, the wheels a machine without internet that has a PyTorch GPU
# image needs to run the workflow, for its Python (default 3.12, x86-64 Linux), at the
# versions of this .venv (what CI tests). What such an image ships (SKIP) and pulp (the ILP
# solver; run Snakemake with --scheduler greedy) are left out; a pure-Python package PyPI has
# only as source is built. There: pip install --no-index --no-deps --target DIR DEST/*.whl
#
#   envs/fetch_wheels.sh [DEST=.whl] [PYTHON_VERSION=3.12]
set -euo pipefail
DEST=${1:-.whl}
PYVER=${2:-3.12}
VENV_PY=${VENV_PY:-.venv/bin/python}
ROOTS="snakemake snakemake-executor-plugin-slurm geomloss dp-accounting pytorch-fid jsonschema"
SKIP='^(pulp|torch|torchvision|triton|nvidia-.*|cuda-.*|numpy|scipy|pandas|pillow|sympy|networkx'
SKIP+='|filelock|fsspec|jinja2|markupsafe|packaging|psutil|pyyaml|requests|urllib3|idna|certifi'
SKIP+='|charset-normalizer|attrs|absl-py|mpmath|tqdm|typing-extensions|wrapt|tabulate'
SKIP+='|python-dateutil|setuptools|tzdata|six)$'
mkdir -p "$DEST"
# shellcheck disable=SC2086
"$VENV_PY" - $ROOTS >"$DEST/requirements.txt" <<'PY'  # the roots' installed dependencies
import importlib.metadata as md, sys
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
seen, stack = {}, sys.argv[1:]
while stack:
    name = canonicalize_name(stack.pop())
    if name in seen:
        continue
    try:
        seen[name] = md.version(name)
    except md.PackageNotFoundError:
        continue
    needs = [Requirement(text) for text in md.requires(name) or []]
    stack += [r.name for r in needs if r.marker is None or r.marker.evaluate({"extra": ""})]
print("\n".join(f"{n}=={v}" for n, v in sorted(seen.items())))
PY
platforms=(manylinux_2_28 manylinux_2_24 manylinux_2_17 manylinux2014)
platforms=("${platforms[@]/%/_x86_64}" any)
while IFS= read -r pin; do
  [[ ${pin%%==*} =~ $SKIP ]] && continue
  "$VENV_PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
    --implementation cp "${platforms[@]/#/--platform=}" -d "$DEST" "$pin" 2>/dev/null \
    || "$VENV_PY" -m pip wheel -q --no-deps -w "$DEST" "$pin"  # source only: pure Python
done <"$DEST/requirements.txt"
du -sh "$DEST"
