"""`fp4lm compare --sweep`: every recipe at every value (and seed), and the report of where each diverges."""

import json

import pytest

from fp4lm.compare import specs
from fp4lm.errors import UserError
from fp4lm.report.sweep import diverged, sweep_summary, sweep_table
from tests.compare.helpers_report import main_compare
from tests.report.synthetic_runs import SMALL_MODEL
from tests.report.test_report_records import make_record


def compare(out, *args):
    return main_compare(["--out", str(out), *SMALL_MODEL, *args])


def test_sweep_trains_every_recipe_at_every_value_and_reports_divergence(tmp_path, fake_trainer):
    set_control, calls = fake_trainer
    set_control(diverge=["nvfp4_lr-0.1_seed-1"])
    out = tmp_path / "cmp"
    code = compare(out, "--recipes", "bf16,nvfp4", "--seeds", "2", "--sweep", "optimizer.lr=0.01,0.1")
    assert code == 0
    assert calls() == [
        f"{recipe}_lr-{lr}_seed-{seed}" for recipe in ("bf16", "nvfp4") for lr in ("0.01", "0.1") for seed in (0, 1)
    ]
    record = json.loads((out / "records" / "nvfp4_lr-0.1_seed-0.json").read_text())
    assert record["config"]["optimizer"]["lr"] == 0.1
    assert record["sweep"] == {"optimizer.lr": "0.1"} and record["sweep_group"] == "nvfp4"
    sweep = json.loads((out / "results.json").read_text())["sweep"]
    assert sweep["keys"] == ["optimizer.lr"] and sweep["values"] == {"optimizer.lr": ["0.01", "0.1"]}
    nvfp4 = sweep["recipes"]["nvfp4"]
    assert nvfp4["points"]["optimizer.lr=0.1"]["diverged"] == 1
    assert nvfp4["points"]["optimizer.lr=0.01"]["diverged"] == 0
    assert nvfp4["stable"] == ["0.01"] and sweep["recipes"]["bf16"]["stable"] == ["0.01", "0.1"]
    report = (out / "report.md").read_text()
    assert "## Where each recipe diverges" in report and "(1/2 diverged)" in report
    assert (out / "sweep.png").stat().st_size > 0 and "sweep.png" in report
    assert "Where each recipe diverges" in (out / "report.html").read_text()

    assert compare(out, "--recipes", "bf16,nvfp4", "--seeds", "2", "--sweep", "optimizer.lr=0.01,0.1,0.03") == 0
    assert calls()[8:] == [f"{recipe}_lr-0.03_seed-{seed}" for recipe in ("bf16", "nvfp4") for seed in (0, 1)]
    values = json.loads((out / "results.json").read_text())["sweep"]["values"]["optimizer.lr"]
    assert values == ["0.01", "0.03", "0.1"]  # numeric order, not the order given


def test_two_keys_make_a_grid(tmp_path, fake_trainer):
    _, calls = fake_trainer
    out = tmp_path / "grid"
    args = ["--recipes", "nvfp4", "--sweep", "optimizer.lr=0.01,0.1", "--sweep", "optimizer.warmup_steps=2,4"]
    assert compare(out, *args) == 0
    assert calls() == [f"nvfp4_lr-{lr}_warmup_steps-{w}" for lr in ("0.01", "0.1") for w in ("2", "4")]
    header, rows = sweep_table(json.loads((out / "results.json").read_text())["sweep"])
    assert header == ["recipe", "optimizer.warmup_steps", "optimizer.lr=0.01", "optimizer.lr=0.1", "stable range"]
    assert [row[1] for row in rows] == ["2", "4"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sweep", "optimizer.lr="], "has no values"),
        (["--sweep", "optimizer.lr=1,1"], "lists a value twice"),
        (["--sweep", "train.seed=1,2"], "use --seeds"),
        (["--sweep", "optimizer.lr=1", "--sweep", "optimizer.lr=2"], "given twice"),
        (["--sweep", "a.b=1", "--sweep", "c.d=1", "--sweep", "e.f=1"], "one or two keys"),
        (["--sweep", "optimizer.lr=0.1", "optimizer.lr=0.2"], "set by --sweep"),
        (["--sweep", "optimizer.nonexistent=1,2"], "nonexistent"),
    ],
)
def test_bad_sweeps_are_refused_before_training(tmp_path, fake_trainer, args, message):
    _, calls = fake_trainer
    with pytest.raises(UserError, match=message):
        compare(tmp_path / "bad", "--recipes", "bf16", *args)
    assert calls() == []


def test_a_recipe_entry_that_sets_the_swept_key_is_refused():
    spec = specs.parse_entry("nvfp4@optimizer.lr=0.1")
    with pytest.raises(UserError, match="which --sweep sets"):
        specs.at_point(spec, (("optimizer.lr", "0.2"),))


def test_divergence_covers_stops_non_finite_losses_and_ending_above_the_start(tmp_path):
    record = make_record(tmp_path, "run", "nvfp4", offset=0.0)
    assert not diverged(record)
    assert diverged({**record, "status": "diverged"})
    assert diverged({**record, "final": {**record["final"], "val_loss": None}})
    start = next(loss for loss in record["curves"]["train"]["loss"] if loss is not None)
    assert diverged({**record, "final": {**record["final"], "val_loss": start + 0.01}})
    assert sweep_summary([record]) is None  # no sweep, no section
