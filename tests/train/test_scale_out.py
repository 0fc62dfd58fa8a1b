"""One code path from 1 device to many: 8 fake CPU devices (mesh 2x2x2) and two jax.distributed processes
train like one device (losses within 1e-5 relative for 2 steps, then 1e-3; see TOLERANCE)."""

import json
import os
import socket
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
    "eval.batches=0",
    "checkpoint.every=100",
    "eval.sample_tokens=0",
    "metrics.quant_stats_every=100",
]
# 8 devices: nvfp4 on every layer, so the quantization (global amax, per-layer stochastic-rounding keys)
# must not depend on how the arrays are sharded. Two processes: the multi-host plumbing (joining, per-process
# batch rows, checkpoints written by two processes) in bf16, which compiles several times faster.
SHARDED = [*RUN, "precision.recipe=nvfp4"]
MULTI_HOST = [*RUN, "precision.recipe=bf16"]
TIMEOUT_S = 900
# The quantization itself does not depend on the sharding (tests/reliability/test_determinism.py checks codes bit
# for bit), but the float sums around it are reduced in another order on a 2x2x2 mesh (each device sums its own
# rows of the batch, then the devices sum their partial gradients), and NVFP4 turns a last-bit difference at a
# rounding boundary into a code one step away: from step 3 the runs drift apart by a few 1e-4 (bf16: 3e-5), up
# and down. Steps 1 and 2 (the initial forward, and one update) agree within 2e-7, so there a sharding bug (an
# amax of one shard, a misplaced key) would show at once; after them, 1e-3 bounds the drift.
FIRST_STEPS, FIRST_STEPS_TOLERANCE, TOLERANCE = 2, 1e-5, 1e-3


def _losses(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [record["loss"] for record in map(json.loads, lines) if "loss" in record]


def _assert_close(losses, reference):
    assert len(losses) == len(reference) == STEPS
    for step, (got, want) in enumerate(zip(losses, reference, strict=True), start=1):
        tolerance = FIRST_STEPS_TOLERANCE if step <= FIRST_STEPS else TOLERANCE
        assert abs(got - want) <= tolerance * abs(want), f"step {step}: {got} vs {want}"


def _environment(devices: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COORDINATOR")}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(f"--xla_force_host_platform_device_count={devices}"))
    return env


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _one_device_losses(overrides, run_dir, compile_cache):
    train(load_config(None, [*overrides, f"train.compilation_cache_dir={compile_cache}", f"train.run_dir={run_dir}"]))
    return _losses(run_dir)


def _train_command(overrides, run_dir, compile_cache) -> list[str]:
    """`python -m fp4lm train` with `overrides` in `run_dir`, sharing the session's compilation cache."""
    return [
        sys.executable,
        "-m",
        "fp4lm",
        "train",
        *overrides,
        f"train.run_dir={run_dir}",
        f"train.compilation_cache_dir={compile_cache}",
    ]


def test_mesh_2x2x2_on_8_fake_devices_matches_one_device(tmp_path, compile_cache):
    reference = _one_device_losses(SHARDED, tmp_path / "one_device", compile_cache)
    run_dir = tmp_path / "run"
    command = [
        *_train_command(SHARDED, run_dir, compile_cache),
        "mesh.data=2",
        "mesh.fsdp=2",
        "mesh.tensor=2",
    ]
    done = subprocess.run(command, env=_environment(8), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "mesh: data=2, fsdp=2, expert=1, tensor=2 (8 cpu devices, 1 processes)" in done.stdout
    _assert_close(_losses(run_dir), reference)


def test_two_processes_over_localhost_match_one_device(tmp_path, compile_cache):
    reference = _one_device_losses(MULTI_HOST, tmp_path / "one_device", compile_cache)
    run_dir = tmp_path / "run"
    common = [
        *_train_command(MULTI_HOST, run_dir, compile_cache),
        f"distributed.coordinator_address=127.0.0.1:{_free_port()}",
        "distributed.num_processes=2",
        "distributed.timeout_s=120",
    ]
    processes = [
        subprocess.Popen(
            [*common, f"distributed.process_id={i}"],
            env=_environment(1),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=TIMEOUT_S)[0] for p in processes]
    for process, output in zip(processes, outputs, strict=True):
        assert process.returncode == 0, output[-3000:]
    assert "(2 cpu devices, 2 processes)" in outputs[0]
    assert "fp4lm train" not in outputs[1]  # only process 0 reports
    _assert_close(_losses(run_dir), reference)
    assert (run_dir / "checkpoints" / str(STEPS)).is_dir()
