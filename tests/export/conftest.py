"""One tiny NVFP4 run trained once per session (4 steps, checkpoints at steps 2 and 4) that the export and
import tests read; each test exports into its own temporary directory."""

from __future__ import annotations

import pathlib

import pytest

from tests.reliability.helpers_reliability import run_cli, tiny_overrides, write_corpus


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("export_run")
    run_dir = root / "run"
    overrides = tiny_overrides(
        write_corpus(root / "corpus.txt", lines=200),
        root / "cache",
        run_dir,
        "model.num_layers=2",
        "train.steps=4",
        "checkpoint.every=2",
        "checkpoint.async_save=false",
        "eval.batches=0",
    )
    result = run_cli("train", *overrides, timeout=900)  # a loaded CI machine compiles slowly
    assert result.code == 0, result.stderr
    return run_dir
