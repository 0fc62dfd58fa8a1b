"""Fixtures of the reliability tests: one corpus, one compilation cache and one reference run, shared by
every test (and, through a lock file, by the pytest-xdist workers) so each is built once per session."""

from __future__ import annotations

import os
import pathlib
import shutil

import pytest

from tests.reliability.helpers_reliability import run_cli, tiny_overrides, write_corpus
from tests.worker_shared import BlockingLock, shared_dir

# The reference run: the uninterrupted run that killed, corrupted and repeated runs are compared with.
REFERENCE_STEPS = 40
REFERENCE_EXTRA = ("train.steps=40", "checkpoint.every=3", "checkpoint.keep=3", "eval.every=20")


@pytest.fixture(scope="session")
def shared_root(tmp_path_factory) -> pathlib.Path:
    return shared_dir(tmp_path_factory, "fp4lm_reliability")


@pytest.fixture(scope="session")
def corpus(shared_root) -> pathlib.Path:
    with BlockingLock(shared_root / "corpus.lock"):
        path = shared_root / "corpus.txt"
        if not path.is_file():
            write_corpus(shared_root / "corpus.txt.tmp")
            os.replace(shared_root / "corpus.txt.tmp", path)
    return path


@pytest.fixture(scope="session")
def compile_cache(shared_root) -> pathlib.Path:
    path = shared_root / "jax_cache"
    path.mkdir(exist_ok=True)
    return path


def reference_overrides(corpus, compile_cache, run_dir, *extra: str) -> list[str]:
    return tiny_overrides(corpus, compile_cache, run_dir, *REFERENCE_EXTRA, *extra)


@pytest.fixture(scope="session")
def reference_run(shared_root, corpus, compile_cache) -> pathlib.Path:
    """An uninterrupted 40-step NVFP4 run (checkpoints every 3 steps, the newest 3 kept). Read only:
    tests that change a run work on a copy (`copy_reference`)."""
    run_dir = shared_root / "reference"
    with BlockingLock(shared_root / "reference.lock"):
        if not (run_dir / "summary.json").is_file():
            shutil.rmtree(run_dir, ignore_errors=True)
            result = run_cli("train", *reference_overrides(corpus, compile_cache, run_dir), timeout=600)
            assert result.code == 0, result.stderr[-4000:]
    return run_dir


@pytest.fixture
def copy_reference(reference_run, tmp_path):
    """A private copy of the reference run directory."""

    def make(name: str = "run") -> pathlib.Path:
        target = tmp_path / name
        shutil.copytree(reference_run, target)
        return target

    return make


def _start_order(item) -> int:
    """Longest first, and the reference run early, so two xdist workers stay busy: the kill test (which
    builds the reference run), then the tests that compile their own programs, then the quick checks, then
    the rest of the tests that read the reference run."""
    if "test_kill9_resume" in item.nodeid:
        return 0
    uses_reference = {"reference_run", "copy_reference", "finished_run"} & set(item.fixturenames)
    if "test_nonfinite_steps" in item.nodeid or "sharded_results" in item.fixturenames:
        return 1
    return 3 if uses_reference else 2


def pytest_collection_modifyitems(config, items):
    """Reorders this directory's tests among the slots they already occupy (other areas keep their order)."""
    here = pathlib.Path(__file__).parent
    slots = [i for i, item in enumerate(items) if here in pathlib.Path(str(item.fspath)).parents]
    ours = sorted((items[i] for i in slots), key=_start_order)
    for slot, item in zip(slots, ours, strict=True):
        items[slot] = item
