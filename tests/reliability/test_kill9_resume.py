"""SIGKILL at 10 seeded random moments (some in the middle of a checkpoint save), restart the same command
each time: the run finishes with losses bit-identical to an uninterrupted run, and no kill ever leaves a
half-written checkpoint that a later run would take for the latest.
"""

from __future__ import annotations

import json
import os
import random
import time

import pytest

from tests.reliability.conftest import REFERENCE_STEPS, reference_overrides
from tests.reliability.helpers_reliability import (
    TrainProcess,
    assert_state_finite,
    assert_states_bit_equal,
    checkpoint_root,
    checkpoint_step_of,
    committed_steps,
    eval_records,
    last_metrics_step,
    metrics_lines,
    restore_checkpoint,
    summary_fields,
    temporary_entries,
    train_records,
)

pytestmark = pytest.mark.slow

KILLS = 10
SEED = 20250611
CHECKPOINT_EVERY = 3  # as in the reference run


def _saving_step(run_dir) -> int | None:
    """The step of a checkpoint being written right now (an uncommitted temporary directory), if any."""
    root = checkpoint_root(run_dir)
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return None
    steps = [int(n.split(".")[0]) for n in names if "tmp" in n and n.split(".")[0].isdigit()]
    return max(steps) if steps else None


def _wrote_temporary_checkpoint(run_dir, *, since: float) -> bool:
    """Whether an uncommitted checkpoint directory written by the killed process is left behind."""
    root = checkpoint_root(run_dir)
    return any((root / name).stat().st_mtime >= since - 1.0 for name in temporary_entries(run_dir))


def _kill_at(kind: str, process: TrainProcess, run_dir, rng: random.Random) -> bool:
    """Waits for the moment `kind` describes, then kills; False if the run finished first."""
    if kind == "startup":  # during imports, data loading, restore or compilation
        delay = rng.uniform(0.3, 6.0)
        process.wait_for(lambda: time.monotonic() - process.started >= delay, poll_s=0.05)
        return process.kill()
    if not process.wait_for(lambda: process.resumed_from() is not None, poll_s=0.05):
        return False
    start = process.resumed_from()
    if kind == "steps":  # between checkpoints, after a few new steps
        target = start + rng.randint(1, 4)
        if not process.wait_for(lambda: last_metrics_step(run_dir) >= target, poll_s=0.01):
            return False
        time.sleep(rng.uniform(0.0, 0.05))
        return process.kill()
    assert kind == "save"  # while a checkpoint past the first one of this process is being written
    if not process.wait_for(lambda: (_saving_step(run_dir) or 0) > start + CHECKPOINT_EVERY):
        return False
    time.sleep(rng.choice([0.0, 0.0, rng.uniform(0.0, 0.01)]))
    return process.kill()


def _check_after_kill(run_dir, previous_latest: int) -> tuple[int, int]:
    """The newest committed checkpoint restores, is finite and never older than before; returns
    (latest step, number of torn metrics lines)."""
    steps = committed_steps(run_dir)
    latest = steps[-1] if steps else 0
    assert latest >= previous_latest, f"the newest checkpoint went back from {previous_latest} to {latest}"
    if steps:
        restored = restore_checkpoint(run_dir, latest)
        assert checkpoint_step_of(restored) == latest
        assert restored["data_iter"]["grain"]["next_index"] == latest  # one batch per step
        assert_state_finite(restored["state"])
    torn = 0
    for line in metrics_lines(run_dir):
        try:
            json.loads(line)
        except ValueError:
            torn += 1
    return latest, torn


@pytest.mark.timeout(900)
def test_sigkill_ten_times_then_losses_equal_uninterrupted_run(reference_run, corpus, compile_cache, tmp_path):
    run_dir = tmp_path / "killed"
    args = reference_overrides(corpus, compile_cache, run_dir)
    rng = random.Random(SEED)
    plan = ["save"] * 4 + ["steps"] * 4 + ["startup"] * 2
    rng.shuffle(plan)

    kills, kills_mid_save, torn_lines, latest, attempt = [], 0, 0, 0, 0
    while len(kills) < KILLS:
        kind = plan[len(kills) % len(plan)]
        attempt += 1
        assert attempt <= 3 * KILLS, f"the run kept finishing before it could be killed: {kills}"
        process = TrainProcess(args, tmp_path, attempt)
        if not _kill_at(kind, process, run_dir, rng):
            # The run ended before the moment came (it must have succeeded); start over from scratch.
            assert process.popen.returncode == 0, process.stderr_path.read_text()[-3000:]
            raise AssertionError(f"run finished after only {len(kills)} kills ({kills}); lower the progress per kill")
        mid_save = _wrote_temporary_checkpoint(run_dir, since=process.started_wall)
        kills_mid_save += mid_save
        latest, torn = _check_after_kill(run_dir, latest)
        torn_lines += torn
        kills.append((kind, latest, "mid-save" if mid_save else ""))

    final = TrainProcess(args, tmp_path, attempt + 1)
    assert final.popen.wait(timeout=600) == 0, final.stderr_path.read_text()[-3000:]
    print(
        f"\nkills (kind, newest checkpoint after it): {kills}; {kills_mid_save} left a temporary checkpoint "
        f"directory; {torn_lines} torn metrics lines seen between kills"
    )

    assert len(kills) == KILLS
    assert kills_mid_save >= 1, "no kill landed inside a checkpoint save"
    assert temporary_entries(run_dir) == [], "uncommitted checkpoint directories were not cleaned up"
    resumed = train_records(run_dir)
    assert [r["step"] for r in resumed] == list(range(1, REFERENCE_STEPS + 1)), "duplicate or missing steps"
    assert resumed == train_records(reference_run)
    assert eval_records(run_dir) == eval_records(reference_run)
    assert summary_fields(run_dir) == summary_fields(reference_run)
    final_checkpoint = restore_checkpoint(run_dir, REFERENCE_STEPS)["state"]
    assert_states_bit_equal(final_checkpoint, restore_checkpoint(reference_run, REFERENCE_STEPS)["state"])
