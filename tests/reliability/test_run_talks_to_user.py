"""What a run tells its user, through the command line's entry point: that the step is
compiling and how long that took, an ETA that ignores the compile, the layer table once, a shortened warm-up,
what raising train.steps of a finished run does to the learning rate, and SIGTERM (what a scheduler sends before
it kills a job): the step is finished and saved, one line, exit 143, and the next run resumes bit-exactly.
The SIGTERM check is about the process, so it runs `fp4lm train` in one; the others run it in this process.
"""

from __future__ import annotations

import json
import os
import re
import signal

import pytest

from fp4lm.config import OptimizerConfig
from fp4lm.train.optimizer import learning_rate_schedule
from tests.reliability.conftest import REFERENCE_STEPS, reference_overrides
from tests.reliability.helpers_reliability import (
    TrainProcess,
    assert_states_bit_equal,
    committed_steps,
    last_metrics_step,
    metrics_records,
    restore_checkpoint,
    run_cli,
    run_cli_in_process,
    tiny_overrides,
    train_records,
)

pytestmark = pytest.mark.slow


def test_a_tiny_run_says_when_it_compiles_shows_the_table_once_and_names_a_shortened_warmup(
    corpus, compile_cache, tmp_path
):
    """Items 18, 19, 20, 21: 6 steps with the late bf16 switch at step 3 and a warm-up of 50 steps."""
    args = tiny_overrides(
        corpus,
        compile_cache,
        tmp_path / "run",
        "train.steps=6",
        "optimizer.warmup_steps=50",
        "precision.bf16_after=0.5",
    )
    result = run_cli_in_process("train", *args)
    assert result.code == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()

    assert lines.count("compiling the training step…") == 1, result.stdout
    assert lines.count("compiling the bf16 training step…") == 1, result.stdout  # the late switch recompiles
    compiled = [line for line in lines if line.startswith("compiled in ")]
    assert len(compiled) == 2 and all(re.fullmatch(r"compiled in (\d+\.\d s|\d+m\d\ds)", line) for line in compiled), (
        compiled
    )
    assert (
        lines.index("compiling the training step…")
        < lines.index(compiled[0])
        < lines.index(next(line for line in lines if line.startswith("step 1/6 |")))
    )

    step_lines = [line for line in lines if re.match(r"step \d+/6 \|", line)]
    assert step_lines[0].endswith("| ETA after warm-up"), step_lines[0]  # the compile step gives no estimate
    assert all(re.search(r"\| ETA \d+m\d\ds$", line) for line in step_lines[1:]), step_lines

    assert sum(line.startswith("layer ") for line in lines) == 1, result.stdout  # the table's header, once
    assert sum("blocks.0.attn.q" in line for line in lines) == 1, result.stdout

    notes = [line for line in lines if "optimizer.warmup_steps=50" in line]
    assert len(notes) == 1 and "train.steps=6" in notes[0] and "shortened to 5 steps" in notes[0], notes


def test_raising_train_steps_of_a_finished_run_restretches_the_schedule(copy_reference, corpus, compile_cache):
    """Item 21: the steps after the extension follow the schedule of the new total (cosine to the new end), so
    the lr jumps from the old run's floor up to the new schedule's value, then decays to the new end."""
    run_dir = copy_reference()
    before = train_records(run_dir)
    new_total = REFERENCE_STEPS + 10
    result = run_cli_in_process(
        "train", *reference_overrides(corpus, compile_cache, run_dir, f"train.steps={new_total}")
    )
    assert result.code == 0, result.stderr[-3000:]
    records = train_records(run_dir)
    assert records[:REFERENCE_STEPS] == before  # the finished steps are kept as they were

    saved = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    schedule = learning_rate_schedule(OptimizerConfig(**saved["optimizer"]), new_total)
    for previous, record in zip(records[REFERENCE_STEPS - 1 :], records[REFERENCE_STEPS:], strict=False):
        updates = previous["step"] - previous["skipped_steps"]  # the optimizer's count before this step
        assert record["lr"] == pytest.approx(float(schedule(updates)), rel=1e-6), record  # jit vs eager: 1 ulp
    old_end, first_new = records[REFERENCE_STEPS - 1]["lr"], records[REFERENCE_STEPS]["lr"]
    assert first_new > 2 * old_end  # the jump
    lrs = [r["lr"] for r in records[REFERENCE_STEPS:]]
    assert lrs == sorted(lrs, reverse=True)  # then a decay to the new end


def test_sigterm_finishes_the_step_saves_it_and_the_run_resumes_bit_exactly(
    reference_run, corpus, compile_cache, tmp_path
):
    """Item 23, like a scheduler's stop: SIGTERM after the first steps; checkpoint.every is out of reach, so the
    checkpoint at the step reached can only come from the SIGTERM path."""
    run_dir = tmp_path / "run"
    args = reference_overrides(corpus, compile_cache, run_dir, "checkpoint.every=1000")
    process = TrainProcess(args, tmp_path, attempt=1)
    assert process.wait_for(lambda: last_metrics_step(run_dir) >= 3, poll_s=0.01), process.stderr_path.read_text()
    os.kill(process.popen.pid, signal.SIGTERM)
    code = process.popen.wait(timeout=120)
    stderr = process.stderr_path.read_text()
    assert code == 143, (code, stderr[-3000:])
    assert "Traceback" not in stderr, stderr[-3000:]
    ours = [line for line in stderr.splitlines() if "SIGTERM" in line]
    assert len(ours) == 1, stderr[-3000:]
    match = re.fullmatch(
        r"terminated by SIGTERM after step (\d+) of 40; saved a checkpoint at step \1, the run "
        r"resumes from it when started again",
        ours[0],
    )
    assert match, ours
    stopped_at = int(match.group(1))
    assert 3 <= stopped_at < REFERENCE_STEPS
    assert committed_steps(run_dir) == [stopped_at]
    assert last_metrics_step(run_dir) == stopped_at
    assert not (run_dir / "summary.json").exists()

    result = run_cli("train", *args)
    assert result.code == 0, result.stderr[-3000:]
    assert f"resuming from step {stopped_at}" in result.stdout
    assert train_records(run_dir) == train_records(reference_run)
    assert [r["val_loss"] for r in metrics_records(run_dir) if "val_loss" in r] == [
        r["val_loss"] for r in metrics_records(reference_run) if "val_loss" in r
    ]
    assert_states_bit_equal(
        restore_checkpoint(run_dir, REFERENCE_STEPS)["state"],
        restore_checkpoint(reference_run, REFERENCE_STEPS)["state"],
    )
