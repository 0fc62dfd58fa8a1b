"""Where tests live and how they are marked: tests/<package>/ holds the tests of fp4lm/<package>/ (or of
bench/), a slow test says so in its own module (pytest.mark.slow), and the benchmarks stand on fp4lm alone."""

from __future__ import annotations

import ast
import pathlib

from tests.conftest import LONGEST_FIRST

REPO = pathlib.Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"

# Folders that test a behaviour across packages rather than one package.
ACROSS_PACKAGES = {
    "reliability": "the trainer and the commands under faults, bad inputs and interruptions",
    "interop": "exports read by other tools (transformers, compressed-tensors), in their own environment",
}


def _packages() -> set[str]:
    return {path.parent.name for path in (REPO / "fp4lm").glob("*/__init__.py")} | {"bench"}


def _test_folders() -> set[str]:
    return {path.parent.relative_to(TESTS).parts[0] for path in TESTS.glob("*/**/test_*.py")}


def test_every_test_folder_is_named_after_a_package():
    assert sorted(_test_folders() - _packages() - set(ACROSS_PACKAGES)) == []


def _bench_imports_from_tests() -> set[tuple[str, str]]:
    found = set()
    for path in sorted((REPO / "bench").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            found |= {(path.name, name) for name in names if name.split(".")[0] == "tests"}
    return found


def test_benchmarks_do_not_import_from_tests():
    assert sorted(_bench_imports_from_tests()) == []


def test_slow_tests_are_marked_in_their_modules_only():
    """No list of slow modules beside the tests: a list keyed by path stops marking a module that moves."""
    conftests = [path for path in TESTS.rglob("conftest.py") if "add_marker" in path.read_text(encoding="utf-8")]
    assert conftests == []


def test_the_longest_tests_named_for_an_early_start_exist():
    assert [module for module in LONGEST_FIRST if not (REPO / module).is_file()] == []
