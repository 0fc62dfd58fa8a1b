"""`fp4lm train` of a MoE model with its experts split over 8 fake CPU devices (mesh.expert=4 mesh.data=2) trains
like one device: NVFP4 on every layer, 8 experts top-2, losses finite, falling, and within TOLERANCE of one
device's over 10 steps (as tests/train/test_scale_out.py for the dense mesh)."""

import json
import os
import subprocess
import sys

import pytest

from fp4lm.config import load_config
from fp4lm.train import train
from tests.compile_flags import xla_flags
from tests.train.conftest import TINY

pytestmark = pytest.mark.slow

STEPS = 10
RUN = [
    *TINY,
    f"train.steps={STEPS}",
    "train.batch_size=8",  # one sequence per device
    "eval.batches=2",  # the eval step runs expert-parallel too
    "checkpoint.every=100",
    "eval.sample_tokens=4",  # one sequence of a few tokens: the sample falls back to the one-device MoE code
    "metrics.quant_stats_every=100",
    "precision.recipe=nvfp4",
    "model.num_experts=8",
    "model.experts_per_token=2",
    "model.moe_mlp_dim=32",
    "model.load_balance_loss=0.01",
]
EXPERT_MESH = ["mesh.data=2", "mesh.fsdp=1", "mesh.expert=4"]
TIMEOUT_S = 1200
# The forward pass equals one device's bit for bit (tests/model/test_expert_parallel.py); the backward's float32
# sums (the data-parallel gradient reductions, the router's) run in another order, and NVFP4 turns a last-bit
# difference at a rounding boundary into a code one step away, as on the dense mesh (test_scale_out.py).
FIRST_STEPS, FIRST_STEPS_TOLERANCE, TOLERANCE = 2, 1e-5, 1e-3


def _losses(run_dir) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [record["loss"] for record in map(json.loads, lines) if "loss" in record]


def test_expert_mesh_on_8_fake_devices_trains_like_one_device(tmp_path, compile_cache):
    cache = f"train.compilation_cache_dir={compile_cache}"
    train(load_config(None, [*RUN, cache, "mesh.fsdp=1", f"train.run_dir={tmp_path / 'one_device'}"]))
    reference = _losses(tmp_path / "one_device")

    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COORDINATOR")}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags("--xla_force_host_platform_device_count=8"))
    command = [sys.executable, "-m", "fp4lm", "train", *RUN, *EXPERT_MESH, cache, f"train.run_dir={run_dir}"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "mesh: data=2, fsdp=1, expert=4, tensor=1 (8 cpu devices, 1 processes)" in done.stdout
    losses = _losses(run_dir)

    assert len(losses) == len(reference) == STEPS
    assert all(map(lambda loss: loss == loss and abs(loss) < float("inf"), losses))
    assert losses[-1] < losses[0] - 0.1, losses  # it learns
    for step, (got, want) in enumerate(zip(losses, reference, strict=True), start=1):
        tolerance = FIRST_STEPS_TOLERANCE if step <= FIRST_STEPS else TOLERANCE
        assert abs(got - want) <= tolerance * abs(want), f"step {step}: {got} vs {want}"
