"""step_time_s times the step, not its dispatch (JAX returns from a dispatch before the step has run).

The step is made slow by a wrapper (this test's, not the trainer's): after each train step, a jitted
computation that takes a measured time runs on the step's whole output, so the next step and the logged
metrics wait for it. A host callback that sleeps would not do: on the CPU a computation with a callback
runs synchronously inside its dispatch, which hides exactly the bug this test is for.
"""

import dataclasses
import json
import time

import jax
import jax.numpy as jnp
import pytest

from fp4lm.config import load_config
from fp4lm.train import train
from fp4lm.train.run_functions import RunFunctions

pytestmark = pytest.mark.slow

WIDTH, ROUNDS = 512, 150


@jax.jit
def _slow_pass_through(outputs, weight_WW):
    """`outputs` unchanged, but only once ROUNDS matmuls are done (the loss depends on them)."""
    y_WW = jax.lax.fori_loop(0, ROUNDS, lambda _, y: jnp.tanh(y @ weight_WW), weight_WW)
    state, metrics = outputs
    state = jax.tree.map(lambda leaf: leaf, state)
    return state, {**metrics, "loss": metrics["loss"] + 0.0 * y_WW[0, 0]}


@pytest.fixture(scope="module")
def slow_seconds():
    """The least time the slow pass takes here, measured over a few blocked runs."""
    weight = jnp.full((WIDTH, WIDTH), 0.01, jnp.float32)
    outputs = ({"w": jnp.ones(3)}, {"loss": jnp.float32(1.0)})
    jax.block_until_ready(_slow_pass_through(outputs, weight))
    times = []
    for _ in range(3):
        start = time.perf_counter()
        jax.block_until_ready(_slow_pass_through(outputs, weight))
        times.append(time.perf_counter() - start)
    return min(times)


@pytest.fixture
def slow_steps(monkeypatch):
    """Every run's train step followed by the slow pass."""
    build = RunFunctions.build
    weight = jnp.full((WIDTH, WIDTH), 0.01, jnp.float32)

    def slow_build(*args, **kwargs):
        functions = build(*args, **kwargs)
        fast_step = functions.train_step
        return dataclasses.replace(
            functions, train_step=lambda state, batch: _slow_pass_through(fast_step(state, batch), weight)
        )

    monkeypatch.setattr(RunFunctions, "build", slow_build)


@pytest.mark.parametrize(("log_every", "steps"), [(1, 4), (10, 11)])
def test_step_time_covers_the_step(tiny, tmp_path, slow_steps, slow_seconds, log_every, steps):
    run_dir = tmp_path / "run"
    overrides = [
        *tiny,
        f"train.run_dir={run_dir}",
        f"train.steps={steps}",
        f"metrics.log_every={log_every}",
        "precision.recipe=bf16",
        "checkpoint.enabled=false",
        "eval.batches=0",
        "eval.sample_tokens=0",
    ]
    summary = train(load_config(None, overrides))
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in lines if "step_time_s" in r]
    assert [r["step"] for r in records] == ([1, 2, 3, 4] if log_every == 1 else [1, 10, 11])
    # Each step includes one slow pass; the machine may be quieter now than when it was measured, hence 0.5.
    for record in records:
        assert record["step_time_s"] >= 0.5 * slow_seconds, (record, slow_seconds)
        assert record["tokens_per_sec"] * record["step_time_s"] == pytest.approx(4 * 16)
        assert record["mfu"] is None  # a CPU's peak is unknown
    assert summary["tokens_per_sec"] <= 4 * 16 / (0.5 * slow_seconds)


def test_mfu_with_a_given_peak(tiny, tmp_path):
    run_dir = tmp_path / "run"
    overrides = [
        *tiny,
        f"train.run_dir={run_dir}",
        "train.steps=1",
        "precision.recipe=bf16",
        "metrics.peak_tflops=2",
        "checkpoint.enabled=false",
        "eval.batches=0",
        "eval.sample_tokens=0",
    ]
    train(load_config(None, overrides))
    record = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert record["mfu"] == pytest.approx(record["tflops_per_sec"] / 2)
