"""One tiny NVFP4 run trained once per session (4 steps, checkpoints at steps 2 and 4) that the export and
Hugging Face tests read, and one tiny MoE run; each test exports into its own temporary directory. Each is
trained by the first xdist worker that asks and read by the others (tests/worker_shared.py): the tests only
read them. tests/export/conftest.py and tests/hf/conftest.py hand these fixtures to their tests."""

from __future__ import annotations

import pathlib

import pytest

from tests.reliability.helpers_reliability import train_tiny_run
from tests.worker_shared import BlockingLock, shared_dir


def _trained_once(tmp_path_factory, name: str, *overrides: str) -> pathlib.Path:
    """The run directory of `train_tiny_run(root, *overrides)` in a directory all workers share, trained once."""
    root = shared_dir(tmp_path_factory, f"fp4lm_{name}")
    with BlockingLock(root / "build.lock"):
        trained = root / "trained"
        if not trained.is_file():
            train_tiny_run(root, *overrides)
            trained.write_text("")
    return root / "run"


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> pathlib.Path:
    return _trained_once(
        tmp_path_factory,
        "export_run",
        "model.num_layers=2",
        "train.steps=4",
        "checkpoint.every=2",
        "checkpoint.async_save=false",
        "eval.batches=0",
    )


MOE_RUN = (
    "model.num_layers=2",
    "model.num_experts=4",
    "model.moe_mlp_dim=32",
    "model.qk_norm=true",
    "model.first_dense_layers=1",
    "precision.shared_weight_scale=true",
)
"""A Qwen3-MoE-shaped tiny run: block 0 dense, block 1 four routed experts, qk-norm, shared gate/up amaxes."""


@pytest.fixture(scope="session")
def moe_run(tmp_path_factory) -> pathlib.Path:
    return _trained_once(
        tmp_path_factory,
        "export_moe_run",
        *MOE_RUN,
        "train.steps=4",
        "checkpoint.every=4",
        "checkpoint.async_save=false",
        "eval.batches=0",
    )
