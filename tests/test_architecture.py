"""Rules about the package's shape that no single module can check: what Snakemake may
import while it parses the workflow, the pinned environment, and CLI flags that must be
able to override a config file in both directions."""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import tomllib
import yaml
from packaging.requirements import Requirement

from dpsinkhorn import cli
from dpsinkhorn import config as config_lib
from dpsinkhorn.bench import cli as bench
from dpsinkhorn.config import targets
from dpsinkhorn.train import cli as train_cli

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
LOCK = REPO / "envs" / "requirements.lock"

# Put on PYTHONPATH as sitecustomize: any import of a heavy library fails loudly.
_BLOCKER = """
import importlib.abc, sys
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"torch", "torchvision", "matplotlib", "dp_accounting", "scipy"}:
            raise ImportError(f"{name} imported while Snakemake parses the workflow")
        return None
sys.meta_path.insert(0, _Block())
"""


def test_snakemake_parses_the_workflow_without_torch_or_matplotlib(tmp_path):
    """Parsing the workflow and building its DAG (a dry run of the smoke config, which has
    every rule) imports neither torch nor matplotlib nor dp-accounting/scipy: a login node
    answers ``snakemake -n`` in seconds, a broken GPU stack cannot stop a dry run, and each
    job's Snakemake (two per SLURM job) starts without seconds of imports."""
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(_BLOCKER)
    env = {**os.environ, "PYTHONPATH": str(blocker)}
    cmd = [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "-d", str(tmp_path / "w"), "-n"]
    cmd += ["--configfile", str(REPO / "config" / "smoke.yaml")]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # The blocker was active: importing torch under it fails.
    probe = subprocess.run(
        [sys.executable, "-c", "import torch"], capture_output=True, text=True, env=env
    )
    assert "imported while Snakemake parses" in probe.stderr


def _module_name(path: Path, package: Path) -> str:
    """``src/dpsinkhorn/train/run.py`` -> ``train.run``; a package's ``__init__`` -> ``train``."""
    parts = list(path.relative_to(package).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_imports() -> dict[str, set[str]]:
    """{module: package modules it imports}, from every import statement in the file,
    those inside functions included (a lazy import is still an edge). Modules are named
    relative to ``dpsinkhorn`` (``train.run``); ``from dpsinkhorn.train import run`` is an
    edge to ``train.run`` when that is a module, else to the package ``train``."""
    package = REPO / "src" / "dpsinkhorn"
    paths = sorted(package.rglob("*.py"))
    modules = {_module_name(path, package) for path in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                parts = node.module.split(".")
                if parts[0] != "dpsinkhorn":
                    continue
                base = ".".join(parts[1:])
                for alias in node.names:
                    child = f"{base}.{alias.name}" if base else alias.name
                    edges.add(child if child in modules else base)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    if parts[0] == "dpsinkhorn" and len(parts) > 1:
                        edges.add(".".join(parts[1:]))
        name = _module_name(path, package)
        graph[name] = (edges & modules) - {name, ""}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_import_circle_detector_finds_a_circle():
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []


def test_package_has_no_import_circles():
    graph = package_imports()
    assert {"config", "config.validate", "train.sweep", "report.cli"} <= set(graph)  # subpackages
    assert "config.identity" in graph["config.studies"] and "report.tables" in graph["report.cli"]
    assert import_circles(graph) == []


#: What each package may import (docs/ARCHITECTURE.md's table, top to bottom). Modules at the
#: top level of the package (fileio, devices, models, plan, api, cli) count as packages of
#: their own.
ALLOWED_IMPORTS = {
    "fileio": set(),
    "devices": set(),
    "config": {"fileio"},  # config.workflow: the Snakefile's cleanup of killed writers' temps
    "data": {"config", "fileio"},  # dpsinkhorn data --config (own datasets: datasets:)
    "models": set(),
    "ot": set(),
    "privacy": {"ot"},  # the factory sizes the debiasing rows (ot.loss.debias_size)
    "train": {"config", "data", "devices", "fileio", "models", "ot", "privacy"},
    "evaluate": {"config", "data", "devices", "fileio", "models", "ot", "privacy"},
    "report": {"config", "data", "fileio", "privacy"},
    "bench": {"config", "data", "devices", "models", "ot", "privacy", "train"},
    "plan": {"bench", "config", "data", "devices", "privacy", "train"},
    "api": {"config", "data", "devices", "evaluate", "publish", "train"},  # data: dataset names
    # redraws, recomputes, reads the training record (privacy.trainings)
    "publish": {"config", "devices", "evaluate", "fileio", "privacy", "report"},
    "cli": {"fileio"},  # and, by name, every module of COMMAND_MODULES
    "__main__": {"cli"},
    "": set(),  # the package's own __init__
}


def test_packages_import_only_the_layers_they_may():
    graph = package_imports()
    packages = {name.split(".")[0] for name in graph}
    assert packages == set(ALLOWED_IMPORTS), "a new package: add it to ALLOWED_IMPORTS and the doc"
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets_ in graph.items()
        for target in targets_
        if target.split(".")[0] != module.split(".")[0]
        and target.split(".")[0] not in ALLOWED_IMPORTS[module.split(".")[0]]
    )
    assert wrong == []


def test_layer_check_sees_a_forbidden_import():
    graph = {"report.table1": {"train.run"}, "train.run": set()}
    bad = [
        t
        for m, ts in graph.items()
        for t in ts
        if t.split(".")[0] not in ALLOWED_IMPORTS[m.split(".")[0]]
    ]
    assert bad == ["train.run"]


def _outside_imports() -> list[tuple[str, str, str | None]]:
    """(file, module, name) of every ``dpsinkhorn`` import in scripts outside the package:
    benchmarks, the rules and the profiles (YAML ``- from x import y`` lines)."""
    found = []
    for path in [
        *REPO.glob("benchmarks/**/*.py"),
        *REPO.glob("workflow/rules/*.smk"),
        *REPO.glob("profiles/**/*.yaml"),
    ]:
        for line in path.read_text().splitlines():
            match = re.match(r"\s*(?:- )?from (dpsinkhorn[\w.]*) import \(?([\w, ]+)", line)
            if match:
                for name in filter(None, (n.strip().split(" ")[0] for n in match[2].split(","))):
                    found.append((str(path.relative_to(REPO)), match[1], name))
    return found


def test_scripts_outside_the_package_import_what_exists():
    """The rules, profiles and benchmark scripts are not linted with the package: a moved
    module must not leave them importing a name that is gone."""
    found = _outside_imports()
    assert any(f.startswith("benchmarks/") for f, _, _ in found)
    missing = []
    for file, module, name in found:
        target = importlib.import_module(module)
        spec = importlib.util.find_spec(f"{module}.{name}") if not hasattr(target, name) else None
        if not hasattr(target, name) and (spec is None or spec.origin is None):  # no namespace dirs
            missing.append(f"{file}: from {module} import {name}")
    assert missing == []


def test_command_table_names_each_modules_commands():
    """``cli.COMMANDS`` (which module to import for a command, so that a job imports only
    its own) is exactly what each module registers, and one command's parser is the full
    parser's sub-parser for it."""
    import argparse

    registered = {}
    for name in cli.COMMAND_MODULES:
        subparsers = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(f"dpsinkhorn.{name}").register_cli(subparsers)
        registered.update(dict.fromkeys(subparsers.choices, name))
    assert registered == cli.COMMANDS
    full = cli.build_parser()._subparsers._group_actions[0].choices
    assert set(full) == set(cli.COMMANDS)
    for command in cli.COMMANDS:
        alone = cli.build_parser(command)._subparsers._group_actions[0].choices
        assert list(alone) == [c for c, m in cli.COMMANDS.items() if m == cli.COMMANDS[command]]
        assert alone[command].format_help() == full[command].format_help()


def test_one_list_of_output_names(capsys):
    """``config.targets.NAMES`` is what ``dpsinkhorn targets`` offers and lists (the paper's
    config produces every output, in that order) and what the report captions cover."""
    from dpsinkhorn.report import cli as report_cli

    # `dpsinkhorn report` offers every output: the main tables and the rest, in NAMES' order
    assert report_cli.REPORTS == tuple(n for n in targets.NAMES if n not in targets.MAIN_TABLES)
    subcommands = cli.build_parser()._subparsers._group_actions[0].choices
    (name,) = [a for a in subcommands["targets"]._actions if a.dest == "name"]
    assert name.help == f"one of {', '.join(targets.NAMES)}, or all"
    assert cli.main(["targets", "all", "--config", str(REPO / "config" / "config.yaml")]) == 0
    listed = [
        line.split(":")[0][2:]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("# ")
    ]
    assert tuple(listed) == targets.NAMES


# ----------------------------------------------------------------------- environment


def _locked() -> dict[str, str]:
    """envs/requirements.lock as {normalised name: version}."""
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[_norm(name)] = version.strip()
    return pins


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _direct_requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = [r for group in project["optional-dependencies"].values() for r in group]
    return [Requirement(r) for r in project["dependencies"] + extras]


def test_lock_pins_every_dependency_within_its_range():
    pins = _locked()
    for req in _direct_requirements():
        name = _norm(req.name)
        assert name in pins, f"{req.name} is in pyproject.toml but not in {LOCK.name}: make lock"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"{LOCK.name} pins {req.name}=={pins[name]}, outside pyproject.toml's {req}: make lock"
        )


def test_installed_versions_are_the_locked_ones():
    """``make install`` installs with the lock as constraints: the suite runs on exactly
    the versions the lock names (refresh both with ``make lock`` then ``make install``)."""
    pins = _locked()
    for req in _direct_requirements():
        installed = metadata.version(req.name)
        assert installed == pins[_norm(req.name)], (
            f"{req.name} {installed} is installed, {LOCK.name} pins {pins[_norm(req.name)]}"
        )


def test_conda_environment_installs_with_the_lock():
    env = yaml.safe_load((REPO / "envs" / "dpsinkhorn.yaml").read_text())
    assert "pip" in env["dependencies"]
    post_deploy = (REPO / "envs" / "dpsinkhorn.post-deploy.sh").read_text()
    assert "-c envs/requirements.lock" in post_deploy
    common = (REPO / "workflow" / "rules" / "common.smk").read_text()
    relative = re.search(r'CONDA_ENV = "(.+)"', common)[1]
    assert (REPO / "workflow" / "rules" / relative).resolve() == REPO / "envs" / "dpsinkhorn.yaml"


# ------------------------------------------------------ CLI flags against config files


def _config_with(tmp_path: Path, **settings) -> Path:
    path = tmp_path / "c.yaml"
    experiments = {"mnist_dpsinkhorn": {"dataset": "mnist", "steps": 2}}
    path.write_text(yaml.safe_dump({"run_name": "t", "experiments": experiments, **settings}))
    return path


@pytest.mark.parametrize("register", [train_cli.register_cli, bench.register_cli])
def test_no_flag_switches_off_a_config_files_true(tmp_path, register):
    """``--no-cuda-graphs`` / ``--no-compile-solver`` win over ``true`` in the file; no flag
    keeps the file's value (before the fix, ``flag or file`` could not say False)."""
    path = _config_with(tmp_path, cuda_graphs=True, compile_solver=True)
    cfg = config_lib.load_config(path)
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    command = "train" if register is train_cli.register_cli else "bench"
    base = [command, "--config", str(path), "--experiment", "mnist_dpsinkhorn"]
    if command == "train":
        base += ["--out", str(tmp_path / "o")]
    off = parser.parse_args([*base, "--no-cuda-graphs", "--no-compile-solver"])
    same = parser.parse_args(base)
    for key, flag in [("cuda_graphs", "cuda_graphs"), ("compile_solver", "compile_solver")]:
        assert config_lib.cli_or_config(getattr(off, flag), cfg, key) is False
        assert config_lib.cli_or_config(getattr(same, flag), cfg, key) is True


def test_workflow_passes_an_override_of_false_to_training(tmp_path):
    """``--config cuda_graphs=False compile_solver=False`` over a file saying true reaches
    the training command as explicit ``--no-...`` flags."""
    path = _config_with(tmp_path, cuda_graphs=True, compile_solver=True)
    cmd = [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "-d", str(tmp_path / "w")]
    cmd += ["-n", "-p", "--configfile", str(path), "--config", "cuda_graphs=False"]
    cmd += ["compile_solver=False", "--", "results/t/mnist_dpsinkhorn/generator.pt"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    train_line = next(line for line in result.stdout.splitlines() if "dpsinkhorn train " in line)
    assert "--no-cuda-graphs" in train_line and "--no-compile-solver" in train_line
