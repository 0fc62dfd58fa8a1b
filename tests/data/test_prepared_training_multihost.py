"""Two jax.distributed processes train on a prepared corpus exactly like one process (losses within 1e-4
relative): each process maps the same shards and takes its own rows of every global batch."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from fp4lm.config import load_config
from fp4lm.train import train
from tests.data.test_prepared_training import DATA, QUIET, write_byte_corpus
from tests.reliability.helpers_reliability import TINY_MODEL

pytestmark = pytest.mark.slow

STEPS = 5
TIMEOUT_S = 600


def _losses(run_dir) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [record["loss"] for record in map(json.loads, lines) if "loss" in record]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_two_processes_on_a_prepared_mixture_match_one_process(tmp_path):
    web = write_byte_corpus(tmp_path / "web", documents=80, low=97, high=123, seed=1)
    code = write_byte_corpus(tmp_path / "code", documents=60, low=33, high=64, seed=2)
    cache = tmp_path / "jax_cache"
    run = [
        *TINY_MODEL,
        *DATA,
        *QUIET,
        f"data.sources={web}:2,{code}:1",
        f"train.steps={STEPS}",
        "eval.batches=1",
        "eval.every=100",
        "checkpoint.every=100",
        f"train.compilation_cache_dir={cache}",
    ]
    train(load_config(None, [*run, f"train.run_dir={tmp_path / 'one'}"]))
    reference = _losses(tmp_path / "one")
    run_dir = tmp_path / "two"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COORDINATOR")}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    common = [
        sys.executable,
        "-m",
        "fp4lm",
        "train",
        *run,
        f"train.run_dir={run_dir}",
        f"distributed.coordinator_address=127.0.0.1:{_free_port()}",
        "distributed.num_processes=2",
        "distributed.timeout_s=120",
    ]
    processes = [
        subprocess.Popen(
            [*common, f"distributed.process_id={i}"],
            env=env,
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
    losses = _losses(run_dir)
    assert len(losses) == len(reference) == STEPS
    for step, (got, want) in enumerate(zip(losses, reference, strict=True), start=1):
        assert abs(got - want) <= 1e-4 * abs(want), f"step {step}: {got} vs {want}"
