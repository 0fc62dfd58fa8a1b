"""Non-finite steps, injected through `debug.inject_nonfinite_*`: the loss scaler skips them and backs
off, training continues, no checkpoint ever holds a non-finite value; K in a row stop the run (exit 3)
with one line naming the steps and the first layer whose telemetry went non-finite."""

from __future__ import annotations

import numpy as np
import pytest

from tests.reliability.helpers_reliability import (
    assert_state_finite,
    committed_steps,
    metrics_records,
    restore_checkpoint,
    run_cli_in_process,
    tiny_overrides,
)

pytestmark = pytest.mark.slow

INITIAL_SCALE = 1024.0
COMMON = (
    "train.steps=7",
    "checkpoint.every=1",
    "checkpoint.keep=10",
    "eval.every=100",
    f"loss_scale.initial_scale={INITIAL_SCALE}",
    "debug.inject_nonfinite_at=3",
    "debug.inject_nonfinite_steps=2",
)
# Grads: bf16 layers with loss scaling forced on (the cheapest step that still scales the loss).
GRADS = ("precision.recipe=bf16", "loss_scale.enabled=true", "debug.inject_nonfinite_into=grads")
# Activations: two blocks, the first in bf16 (no telemetry), so the NaN added to the embeddings reaches block 1, whose
# attention projections run in NVFP4 (its MLP stays bf16: fewer quantized GEMMs, a faster compile).
ACTIVATIONS = (
    "model.num_layers=2",
    "precision.recipe=nvfp4",
    "precision.bf16_first_layers=1",
    r"precision.rules=blocks\.1\.mlp\..*=bf16",
    "debug.inject_nonfinite_into=activations",
)


def _train(corpus, compile_cache, run_dir, *extra):
    """`fp4lm train` through the command line's entry point, in this process (what is checked is the run's
    numbers, files, exit code and message, not the process)."""
    return run_cli_in_process("train", *tiny_overrides(corpus, compile_cache, run_dir, *COMMON, *extra))


def _assert_every_checkpoint_finite(run_dir) -> dict[int, dict]:
    states = {step: restore_checkpoint(run_dir, step)["state"] for step in committed_steps(run_dir)}
    assert states, "no checkpoint was written"
    for state in states.values():
        assert_state_finite(state)
    return states


def _assert_skipped_and_recovered(run_dir):
    records = {r["step"]: r for r in metrics_records(run_dir) if "loss" in r}
    assert sorted(records) == list(range(1, 8))
    assert [records[s]["skipped_steps"] for s in range(1, 8)] == [0, 0, 1, 2, 2, 2, 2]
    # `loss_scale` is the scale a step ran with: halved after each skipped step, then steady.
    assert [records[s]["loss_scale"] for s in range(1, 8)] == [INITIAL_SCALE] * 3 + [INITIAL_SCALE / 2] + [
        INITIAL_SCALE / 4
    ] * 3
    assert records[3]["grad_norm"] is None and records[4]["grad_norm"] is None  # NaN is written as null
    for step in (1, 2, 5, 6, 7):
        assert np.isfinite(records[step]["loss"]) and np.isfinite(records[step]["grad_norm"])
    states = _assert_every_checkpoint_finite(run_dir)
    assert sorted(states) == list(range(1, 8))
    # A skipped step leaves parameters and optimizer state exactly as they were; step 5 updates again.
    for step in (3, 4):
        for part in ("params", "opt_state"):
            assert_trees_equal(states[step][part], states[2][part])
    assert not trees_equal(states[5]["params"], states[4]["params"])


def trees_equal(a, b) -> bool:
    import jax

    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(leaves_a) == len(leaves_b) and all(
        np.asarray(x).tobytes() == np.asarray(y).tobytes() for x, y in zip(leaves_a, leaves_b, strict=True)
    )


def assert_trees_equal(a, b) -> None:
    assert trees_equal(a, b)


def test_nonfinite_gradients_are_skipped_with_backoff_and_training_continues(corpus, compile_cache, tmp_path):
    run_dir = tmp_path / "grads"
    result = _train(corpus, compile_cache, run_dir, *GRADS)
    assert result.code == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    _assert_skipped_and_recovered(run_dir)


# Meant to keep the two runs of one compiled step on one worker (the second would hit the compile cache); no
# effect while xdist 3.8 and pytest 9 disagree on test ids (tests/worker_shared.py): each may compile it.
@pytest.mark.xdist_group("nonfinite_activations")
def test_nonfinite_activations_are_skipped_with_backoff_and_training_continues(corpus, compile_cache, tmp_path):
    run_dir = tmp_path / "activations"
    result = _train(corpus, compile_cache, run_dir, *ACTIVATIONS)
    assert result.code == 0, result.stderr[-3000:]
    records = {r["step"]: r for r in metrics_records(run_dir) if "loss" in r}
    assert records[3]["loss"] is None and records[4]["loss"] is None  # the forward pass itself went NaN
    _assert_skipped_and_recovered(run_dir)


@pytest.mark.xdist_group("nonfinite_activations")
def test_consecutive_nonfinite_steps_stop_with_exit_3_naming_step_and_layer(corpus, compile_cache, tmp_path):
    run_dir = tmp_path / "diverged"
    # The same compiled step as above: the limit is checked on the host, so only the limit changes.
    result = _train(corpus, compile_cache, run_dir, *ACTIVATIONS, "loss_scale.max_consecutive_skips=2")
    assert result.code == 3, (result.code, result.stderr[-3000:])
    assert "Traceback" not in result.stderr
    lines = result.error_lines
    assert len(lines) == 1, lines
    message = lines[0]
    assert message.startswith("error: ") and "steps 3-4" in message, message
    assert "blocks.1.attn.q" in message, message  # the first NVFP4 layer the poison reaches
    assert "; " in message  # and what to do about it
    records = [r for r in metrics_records(run_dir) if "loss" in r]
    assert max(r["step"] for r in records) <= 5
    states = _assert_every_checkpoint_finite(run_dir)
    assert max(states) <= 4
