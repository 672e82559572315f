"""The commands of README.md and docs/*.md, run verbatim in a fresh clone.

Every line of a ```bash block that starts with ``.venv/bin/snakemake``,
``.venv/bin/dpsinkhorn`` or ``dpsinkhorn`` is taken from README.md and docs/*.md as
written (``[...]`` marks an optional part: run without it). The clone gets this
checkout's ``.venv`` (a link; nothing else) and ``../shared`` (a link to the data
mirror's parent, as the README's ``../shared/data`` expects). PATH holds only the system folders, so
``.venv/bin/...`` must work without an activated venv; bare ``dpsinkhorn`` lines run
as the README says, after ``source .venv/bin/activate``.

Snakemake commands that target ``data/`` run for real; the others as dry runs (-n),
except ``--report`` (it needs finished results). ``dpsinkhorn privacy`` and
``targets`` run for real; other ``dpsinkhorn`` lines (hours of work) are parsed by the
CLI's own parser, so every command and option they use must exist.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from dpsinkhorn.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    """The documented command lines, continuations joined, comments dropped."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    text = "\n".join(page.read_text() for page in pages)
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    commands = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            line = re.sub(r"\[[^\]]*\]", "", line).strip()  # optional parts
            if line.startswith((".venv/bin/snakemake", ".venv/bin/dpsinkhorn", "dpsinkhorn ")):
                commands.append(" ".join(line.split()))
    return commands


@pytest.fixture(scope="module")
def clone(tmp_path_factory, data_mirror) -> Path:
    base = tmp_path_factory.mktemp("readme")
    subprocess.run(["git", "clone", "-q", str(ROOT), str(base / "clone")], check=True)
    (base / "clone" / ".venv").symlink_to(ROOT / ".venv")
    (base / "shared").symlink_to(Path(data_mirror).resolve().parent)
    return base / "clone"


def test_readme_lists_the_commands():
    commands = readme_commands()
    assert sum(c.startswith(".venv/bin/snakemake") for c in commands) >= 8
    assert any(" data/" in c for c in commands)  # one real Snakemake run
    assert ".venv/bin/snakemake --profile slurm" in commands  # the shipped profile, as typed


@pytest.mark.parametrize("command", readme_commands())
def test_readme_command_works_verbatim(clone, command):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(clone.parent)}
    argv = shlex.split(command)
    if argv[0] == ".venv/bin/snakemake":
        if "--report" in argv:
            pytest.skip("--report needs finished results")
        real = any(a.startswith("data/") for a in argv)
        result = subprocess.run(
            # -n right after the program: after a `--` it would be read as a target
            argv if real else [argv[0], "-n", *argv[1:]],
            cwd=clone,
            env=env,
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        if real:
            assert (clone / "data" / "mnist" / "train.npz").is_file()
        return
    if argv[0] == "dpsinkhorn":  # after `source .venv/bin/activate`
        env["PATH"] = f"{clone / '.venv' / 'bin'}:{env['PATH']}"
    if argv[1] in ("privacy", "targets"):
        result = subprocess.run(argv, cwd=clone, env=env, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        return
    with pytest.raises(SystemExit) if "--help" in argv else _nothing():
        build_parser().parse_args(argv[1:])


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
