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
    return train_tiny_run(
        tmp_path_factory.mktemp("export_moe_run"),
        *MOE_RUN,
        "train.steps=4",
        "checkpoint.every=4",
        "checkpoint.async_save=false",
        "eval.batches=0",
    )
