"""The test-suite's own tables (tests/conftest.py): every test they name exists, so that a
renamed test does not silently leave ``make test-fast`` or lose its time limit."""

from __future__ import annotations

import ast
from pathlib import Path

import conftest
import pytest
import tomllib

TESTS = Path(__file__).resolve().parent


def _functions(module: str) -> set[str]:
    tree = ast.parse((TESTS / module).read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


@pytest.mark.parametrize(
    "name", sorted({*conftest.SLOW_TESTS, *conftest.TIMEOUTS_OF_TEST}), ids=str
)
def test_named_tests_exist(name):
    module, function = name.split("::")
    assert function in _functions(module), f"tests/conftest.py names {name}: no such test"


@pytest.mark.parametrize(
    "module",
    sorted({*conftest.TIMEOUTS_FIRST_OF_MODULE, *conftest.FIRST_FILES}),
)
def test_named_modules_exist(module):
    assert (TESTS / module).is_file(), f"tests/conftest.py names {module}: no such file"


def test_limits_exceed_the_default():
    pytest_ini = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())["tool"]["pytest"]
    default = pytest_ini["ini_options"]["timeout"]
    limits = [*conftest.TIMEOUTS_FIRST_OF_MODULE.values(), *conftest.TIMEOUTS_OF_TEST.values()]
    assert default == 900 and all(limit > default for limit in limits), (default, limits)
