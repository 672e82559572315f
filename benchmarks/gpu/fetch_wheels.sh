#!/usr/bin/env bash
# Fetch, on a machine with PyPI, the wheels a GPU machine WITHOUT internet needs to run
# dpsinkhorn and its workflow, for that machine's Python (default 3.12, x86-64 Linux).
# Versions are those installed in this project's .venv (so the GPU run uses what CI tests).
# Packages that a PyTorch GPU image already ships (torch, numpy, scipy, pandas, pillow,
# pyyaml, requests, jinja2, ...) are left out: see SKIP. So is pulp (16 MB, the ILP
# scheduler's solver): without it the window runs Snakemake with --scheduler greedy. Pure-Python packages that PyPI
# has only as source are built into wheels here.
#
#   benchmarks/gpu/fetch_wheels.sh [DEST=.whl] [PYTHON_VERSION=3.12]
#
# There: pip install --no-index --no-deps --target /tmp/site DEST/*.whl (benchmarks/gpu/window.py).
set -euo pipefail
DEST=${1:-.whl}
PYVER=${2:-3.12}
VENV_PY=${VENV_PY:-.venv/bin/python}
ROOTS="snakemake snakemake-executor-plugin-slurm geomloss dp-accounting pytorch-fid jsonschema"
SKIP='^(pulp|torch|torchvision|triton|nvidia-.*|cuda-.*|numpy|scipy|pandas|pillow|sympy|networkx|filelock|fsspec|jinja2|markupsafe|packaging|psutil|pyyaml|requests|urllib3|idna|certifi|charset-normalizer|attrs|absl-py|mpmath|tqdm|typing-extensions|wrapt|tabulate|python-dateutil|setuptools|tzdata|six)$'

mkdir -p "$DEST"
# name==version of every installed package the roots depend on (recursively).
"$VENV_PY" - "$ROOTS" > "$DEST/requirements.txt" <<'PY'
import importlib.metadata as md, re, sys
from packaging.requirements import Requirement
seen, stack = {}, sys.argv[1].split()
while stack:
    name = re.sub(r"[-_.]+", "-", stack.pop()).lower()
    if name in seen:
        continue
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        continue
    seen[name] = dist.version
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            stack.append(req.name)
print("\n".join(f"{n}=={v}" for n, v in sorted(seen.items())))
PY
PLATFORMS="--platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any"
while IFS= read -r pin; do
  name=${pin%%==*}
  [[ $name =~ $SKIP ]] && continue
  # shellcheck disable=SC2086
  "$VENV_PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
      --implementation cp $PLATFORMS -d "$DEST" "$pin" 2>/dev/null \
    || "$VENV_PY" -m pip wheel -q --no-deps -w "$DEST" "$pin"   # source only: pure Python
done < "$DEST/requirements.txt"
ls "$DEST"/*.whl | wc -l
du -sh "$DEST"
