"""One tiny NVFP4 run trained once per session (4 steps, checkpoints at steps 2 and 4) that the export and
import tests read; each test exports into its own temporary directory."""

from __future__ import annotations

import pathlib

import pytest

from tests.reliability.helpers_reliability import train_tiny_run


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> pathlib.Path:
    return train_tiny_run(
        tmp_path_factory.mktemp("export_run"),
        "model.num_layers=2",
        "train.steps=4",
        "checkpoint.every=2",
        "checkpoint.async_save=false",
        "eval.batches=0",
    )
