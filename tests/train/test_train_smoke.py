"""A few steps end to end: metrics, the late bf16 switch, checkpoints, bit-exact resume, eval and sample."""

import json
import shutil

import pytest

from fp4lm import cli
from fp4lm.config import load_config
from fp4lm.train import train

pytestmark = pytest.mark.slow

TRAIN_FIELDS = {
    "step",
    "loss",
    "lr",
    "grad_norm",
    "loss_scale",
    "skipped_steps",
    "step_time_s",
    "tokens_per_sec",
    "tflops_per_sec",
    "mfu",
}


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _train_losses(run_dir):
    return {r["step"]: r["loss"] for r in _records(run_dir) if "loss" in r}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, compile_cache):
    """6 nvfp4 steps switching to bf16 after step 4 (bf16_after=0.67), checkpoints every 2 steps."""
    from tests.train.conftest import TINY

    run_dir = tmp_path_factory.mktemp("smoke") / "run"
    overrides = [
        *TINY,
        f"train.compilation_cache_dir={compile_cache}",
        f"train.run_dir={run_dir}",
        "train.steps=6",
        "precision.bf16_after=0.67",
        "checkpoint.every=2",
        "checkpoint.keep=5",
        "eval.every=3",
        "metrics.quant_stats_every=3",
    ]
    summary = train(load_config(None, overrides))
    return run_dir, overrides, summary


def test_metrics_and_summary(finished_run):
    run_dir, _, summary = finished_run
    records = _records(run_dir)
    train_records = [r for r in records if "loss" in r]
    assert [r["step"] for r in train_records] == [1, 2, 3, 4, 5, 6]
    for record in train_records:
        assert set(record) >= TRAIN_FIELDS
        assert record["loss"] > 0 and record["step_time_s"] > 0 and record["tokens_per_sec"] > 0
        assert record["skipped_steps"] == 0
    assert train_records[0]["loss_scale"] == 2.0**15  # on by default for nvfp4
    assert [r["step"] for r in records if "val_loss" in r] == [3, 6]
    stats = [r for r in records if "quant_stats" in r]
    assert [r["step"] for r in stats] == [3]  # at step 6 every layer is bf16: no telemetry
    layer = stats[0]["quant_stats"]["blocks.0.attn.q"]
    assert {"rel_err", "saturated_frac", "underflow_frac", "amax"} <= set(next(iter(layer.values())))
    assert summary["final_val_loss"] == [r for r in records if "val_loss" in r][-1]["val_loss"]
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 6


def test_bf16_switch_happens_and_is_logged(finished_run):
    run_dir, _, summary = finished_run
    events = [r for r in _records(run_dir) if r.get("event") == "precision_switch"]
    assert events == [{"step": 4, "event": "precision_switch", "to": "bf16"}]
    assert summary["precision"].startswith("nvfp4: 7 of 7")
    assert summary["final_precision"].startswith("bf16: 7 of 7")


def test_resume_from_checkpoint_is_bit_exact(finished_run, tmp_path):
    """Resuming at step 2 (before the switch) reproduces steps 3..6 exactly."""
    run_dir, overrides, _ = finished_run
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(run_dir, resumed_dir)
    for step in ("4", "6"):
        shutil.rmtree(resumed_dir / "checkpoints" / step)
    train(load_config(None, [*overrides, f"train.run_dir={resumed_dir}"]))
    original, resumed = _train_losses(run_dir), _train_losses(resumed_dir)
    assert sorted(resumed) == [1, 2, 3, 4, 5, 6]  # steps after the checkpoint were re-logged once, not twice
    for step in (3, 4, 5, 6):
        assert resumed[step] == original[step], step  # bit for bit


def _extended(finished_run, tmp_path, name, *overrides, drop_after=None):
    """A copy of the finished run, trained on by the command line with `overrides` (first rolled back to its
    checkpoint at step `drop_after`, as if stopped there); returns the copy and the command's output."""
    run_dir = tmp_path / name
    shutil.copytree(finished_run[0], run_dir)
    if drop_after is not None:
        (run_dir / "summary.json").unlink()
        for step in (4, 6):
            if step > drop_after:
                shutil.rmtree(run_dir / "checkpoints" / str(step))
    assert cli.run(["train", f"train.run_dir={run_dir}", *overrides]) == 0
    return run_dir


def _quantized_steps(run_dir):
    return [r["step"] for r in _records(run_dir) if "quant_stats" in r]


def test_a_run_extended_after_its_switch_stays_in_bf16(finished_run, tmp_path, capsys):
    """Raising train.steps of a run that switched after step 4 keeps it in bf16 (0.67 of 20 steps would name
    step 13): one switch in metrics.jsonl, no quantized telemetry after it, the same losses as a continuation
    with the bf16 recipe, and `fp4lm eval` of a checkpoint before step 13 evaluates in bf16 too."""
    run_dir = _extended(finished_run, tmp_path, "extended", "train.steps=20")
    out = capsys.readouterr().out
    assert "note: this run switched to bf16 after step 4 and stays in bf16" in out and "names step 13" in out
    assert "precision switch" not in out
    events = [r for r in _records(run_dir) if r.get("event") == "precision_switch"]
    assert events == [{"step": 4, "event": "precision_switch", "to": "bf16"}]
    assert _quantized_steps(run_dir) == [3]  # every 3 steps while quantized: 3; bf16 from step 5
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["bf16_after_step"] == 4 and summary["final_precision"].startswith("bf16: 7 of 7")
    bf16 = ["train.steps=20", "precision.recipe=bf16", "train.allow_recipe_change=true", "loss_scale.enabled=true"]
    reference = _extended(finished_run, tmp_path, "bf16", *bf16)
    losses, expected = _train_losses(run_dir), _train_losses(reference)
    assert sorted(losses) == list(range(1, 21))
    assert [losses[step] for step in range(7, 21)] == [expected[step] for step in range(7, 21)]
    for step in range(14, 21, 2):  # the newest checkpoint is step 12's, saved by the extended run
        shutil.rmtree(run_dir / "checkpoints" / str(step))
    capsys.readouterr()
    assert cli.run(["eval", str(run_dir)]) == 0
    line = capsys.readouterr().out.strip()
    trained = next(r["val_loss"] for r in _records(run_dir) if r.get("step") == 12 and "val_loss" in r)
    assert line.startswith(f"{run_dir}: step 12 val_loss ")
    assert float(line.rsplit(" ", 1)[1]) == pytest.approx(trained, abs=1e-4)


def test_a_run_extended_before_its_switch_moves_it(finished_run, tmp_path, capsys):
    """Stopped at step 2, before its switch after step 4, and extended to 12 steps: the switch moves to after
    step 8 (0.67 of 12) and says so; the stale switch at step 4 is gone from metrics.jsonl."""
    run_dir = _extended(finished_run, tmp_path, "moved", "train.steps=12", drop_after=2)
    out = capsys.readouterr().out
    assert "note: the switch to bf16 moves from after step 4 to after step 8" in out
    assert "step 8: precision switch" in out
    events = [r for r in _records(run_dir) if r.get("event") == "precision_switch"]
    assert events == [{"step": 8, "event": "precision_switch", "to": "bf16"}]
    assert _quantized_steps(run_dir) == [3, 6]


def test_finished_run_is_not_retrained(finished_run, capsys):
    run_dir, overrides, _ = finished_run
    metrics_before = (run_dir / "metrics.jsonl").read_text()
    summary_before = (run_dir / "summary.json").read_text()
    summary = train(load_config(None, overrides))
    assert "already finished at step 6" in capsys.readouterr().out
    assert (run_dir / "metrics.jsonl").read_text() == metrics_before
    assert (run_dir / "summary.json").read_text() == summary_before
    assert summary["final_val_loss"] is not None


def test_eval_and_sample_commands(finished_run, capsys):
    run_dir, _, summary = finished_run
    assert cli.run(["eval", str(run_dir)]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"{run_dir}: step 6 val_loss ")
    assert float(line.rsplit(" ", 1)[1]) == pytest.approx(summary["final_val_loss"], abs=1e-4)
    assert cli.run(["sample", str(run_dir), "--prompt", "ROMEO:", "--max-tokens", "5", "--temperature", "0"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("ROMEO:") and len(text.rstrip("\n")) >= len("ROMEO:") + 1


def test_consecutive_nonfinite_steps_stop_the_run(tiny, tmp_path):
    """Steps 2.. get NaN gradients: each is skipped (no checkpoint holds them) until the third in a row."""
    from fp4lm.errors import TrainingDiverged

    run_dir = tmp_path / "run"
    overrides = [
        *tiny,
        f"train.run_dir={run_dir}",
        "train.steps=8",
        "precision.recipe=bf16",
        "loss_scale.enabled=true",
        "loss_scale.max_consecutive_skips=3",
        "debug.inject_nonfinite_at=2",
        "debug.inject_nonfinite_steps=100",
        "checkpoint.every=1",
    ]
    with pytest.raises(TrainingDiverged) as error:
        train(load_config(None, overrides))
    message = str(error.value)
    assert "3 consecutive steps with non-finite gradients (steps 2-4" in message and "\n" not in message
    records = [r for r in _records(run_dir) if "skipped_steps" in r]
    grad_norms = [r["grad_norm"] for r in records][:4]
    assert grad_norms[0] is not None and grad_norms[1:] == [None, None, None]  # NaN is logged as null
    assert [r["skipped_steps"] for r in records][:4] == [0, 1, 2, 3]
    assert [r["loss_scale"] for r in records][:4] == [2.0**15, 2.0**15, 2.0**14, 2.0**13]
