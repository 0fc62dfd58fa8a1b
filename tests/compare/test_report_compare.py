"""The compare orchestration (reuse, resume, divergence, errors) with a fake trainer; no JAX training."""

import json
import pathlib

import pytest

from fp4lm.errors import UserError
from tests.compare.helpers_report import main_compare
from tests.reliability.bad_inputs import make_existing_run
from tests.reliability.helpers_reliability import snapshot
from tests.report.synthetic_runs import SMALL_MODEL

pytestmark = pytest.mark.slow

REPO = pathlib.Path(__file__).resolve().parents[2]

ARTEFACTS = ("results.json", "report.html", "report.md", "loss.png", "throughput.png")


def compare(out, recipes, *extra):
    return main_compare(["--recipes", recipes, "--out", str(out), *SMALL_MODEL, *extra])


def test_trains_once_then_reuses_records(tmp_path, fake_trainer, capsys):
    set_control, calls = fake_trainer
    out = tmp_path / "cmp"
    recipes = "bf16,nvfp4@precision.bf16_after=0.8"
    assert compare(out, recipes) == 0
    assert calls() == ["bf16", "nvfp4_bf16_after-0.8"]
    for name in (*ARTEFACTS, "gap.png", "quant_nvfp4_bf16_after-0.8.png"):
        assert (out / name).is_file(), name
    results = json.loads((out / "results.json").read_text())
    assert results["order"] == ["bf16", "nvfp4_bf16_after-0.8"]
    assert results["recipes"]["nvfp4_bf16_after-0.8"]["final"]["gap_pct"] > 0
    assert f"--recipes {recipes}" in results["command"]
    assert results["recipes"]["nvfp4_bf16_after-0.8"]["config"]["precision"]["bf16_after"] == 0.8
    assert results["recipes"]["nvfp4_bf16_after-0.8"]["events"][0]["step"] == 32
    assert (out / "logs" / "bf16.log").read_text().count("fake training bf16") == 1

    record_times = {p.name: p.stat().st_mtime_ns for p in (out / "records").iterdir()}
    assert compare(out, recipes) == 0
    assert calls() == ["bf16", "nvfp4_bf16_after-0.8"]  # nothing trained again
    assert {p.name: p.stat().st_mtime_ns for p in (out / "records").iterdir()} == record_times
    assert "reusing" in capsys.readouterr().out


def test_committed_records_suffice_without_run_dirs(tmp_path, fake_trainer):
    _, calls = fake_trainer
    out = tmp_path / "cmp"
    recipes = "bf16,bf16@train.seed=1"
    assert compare(out, recipes) == 0
    for run_dir in (out / "runs").iterdir():
        for file in run_dir.iterdir():
            file.unlink()
        run_dir.rmdir()
    (out / "results.json").unlink()
    assert compare(out, recipes) == 0
    assert calls() == ["bf16", "bf16_seed-1"]
    assert set(json.loads((out / "results.json").read_text())["recipes"]) == {"bf16", "bf16_seed-1"}


def test_interrupted_recipe_resumes_and_report_shows_what_finished(tmp_path, fake_trainer):
    set_control, calls = fake_trainer
    set_control(fail=["nvfp4"])
    out = tmp_path / "cmp"
    assert compare(out, "bf16,nvfp4") == 1
    assert not (out / "records" / "nvfp4.json").exists()
    assert list(json.loads((out / "results.json").read_text())["recipes"]) == ["bf16"]
    assert compare(out, "bf16,nvfp4") == 0
    assert calls() == ["bf16", "nvfp4", "nvfp4"]  # bf16 reused, nvfp4 rerun in the same run dir
    assert (out / "runs" / "nvfp4" / "crashed_once").exists()
    record = json.loads((out / "records" / "nvfp4.json").read_text())
    assert record["status"] == "finished" and record["final"]["steps"] == 40


def test_diverged_recipe_is_recorded_and_reported(tmp_path, fake_trainer):
    set_control, calls = fake_trainer
    set_control(diverge=["fp8"])
    out = tmp_path / "cmp"
    assert compare(out, "fp8") == 0
    results = json.loads((out / "results.json").read_text())
    assert results["recipes"]["fp8"]["status"] == "diverged"
    assert results["recipes"]["fp8"]["final"]["steps"] == 20
    assert "| fp8 |" in (out / "report.md").read_text() and "diverged" in (out / "report.md").read_text()
    assert compare(out, "fp8") == 0
    assert calls() == ["fp8"]


def test_finished_run_dir_without_record_is_not_retrained(tmp_path, fake_trainer):
    _, calls = fake_trainer
    out = tmp_path / "cmp"
    assert compare(out, "bf16") == 0
    (out / "records" / "bf16.json").unlink()
    assert compare(out, "bf16") == 0
    assert calls() == ["bf16"]
    assert (out / "records" / "bf16.json").is_file()


def test_changed_settings_are_not_silently_reused(tmp_path, fake_trainer):
    out = tmp_path / "cmp"
    assert compare(out, "bf16") == 0
    with pytest.raises(UserError, match=r"other settings \(train.steps: recorded 40, requested 20\)"):
        compare(out, "bf16", "train.steps=20")
    assert compare(out, "bf16", "metrics.progress=plain") == 0  # bookkeeping settings do not matter


def test_user_overrides_win_over_the_preset(tmp_path, fake_trainer):
    out = tmp_path / "cmp"
    assert main_compare(["--recipes", "bf16", "--preset", "quick", "--out", str(out), "train.steps=20"]) == 0
    config = json.loads((out / "records" / "bf16.json").read_text())["config"]
    assert config["train"]["steps"] == 20
    assert config["model"]["d_model"] == 64  # from the preset
    assert json.loads((out / "results.json").read_text())["preset"] == "quick"


def test_bad_input_is_a_user_error(tmp_path, fake_trainer):
    _, calls = fake_trainer
    with pytest.raises(UserError, match="unknown precision recipe 'nvfp5'"):
        compare(tmp_path / "a", "bf16,nvfp5")
    with pytest.raises(UserError, match="unknown preset 'huge'"):
        compare(tmp_path / "a", "bf16", "--preset", "huge")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UserError, match="cannot write to --out"):
        compare(blocker / "sub", "bf16")
    with pytest.raises(UserError, match="unknown config key model.depth"):
        compare(tmp_path / "a", "bf16", "model.depth=3")
    with pytest.raises(UserError, match="recipe 'nvfp4@model.widht=3'"):
        compare(tmp_path / "a", "nvfp4@model.widht=3")
    with pytest.raises(UserError, match="set by fp4lm compare"):
        compare(tmp_path / "a", "bf16", "precision.recipe=nvfp4")
    with pytest.raises(UserError, match="one config file"):
        compare(tmp_path / "a", "bf16", "a.yaml", "b.yaml")
    with pytest.raises(UserError, match="--recipes"):
        main_compare(["--out", str(tmp_path / "a")])
    assert calls() == []
    assert not (tmp_path / "a").exists()


def test_help_exits_zero(capsys):
    assert main_compare(["--help"]) == 0
    assert "--recipes" in capsys.readouterr().out


# Every check before anything is written; a training run is never an --out.


def test_an_out_dir_that_is_a_training_run_is_refused_untouched(tmp_path, fake_trainer):
    _, calls = fake_trainer
    run = make_existing_run(tmp_path / "run")  # metrics.jsonl, summary.json, notes.txt
    (run / "checkpoints" / "100").mkdir(parents=True)
    before = snapshot(run)
    with pytest.raises(UserError, match=r"--out .*run is an fp4lm training run \(it has checkpoints, metrics.jsonl"):
        compare(run, "bf16")
    assert snapshot(run) == before and sorted(p.name for p in run.iterdir()) == [
        "checkpoints",
        "metrics.jsonl",
        "notes.txt",
        "summary.json",
    ]
    assert calls() == []


# A user's files in --out are refused; --force moves them aside, never deletes them.


def test_an_out_dir_with_a_users_files_is_refused_then_moved_aside_by_force(tmp_path, fake_trainer, capsys):
    _, calls = fake_trainer
    out = tmp_path / "cmp"
    (out / "notes").mkdir(parents=True)
    (out / "report.html").write_text("<p>my own report</p>\n")
    (out / "notes" / "plan.txt").write_text("try a longer warm-up\n")
    before = snapshot(out)
    with pytest.raises(UserError, match=r"not an fp4lm comparison \(notes, report.html\); .*--force"):
        compare(out, "bf16")
    assert snapshot(out) == before and calls() == []

    assert compare(out, "bf16", "--force") == 0
    moved = [p for p in tmp_path.iterdir() if p.name.startswith("cmp.old-")]
    assert len(moved) == 1 and snapshot(moved[0]) == before, "the old contents must be moved aside unchanged"
    assert f"moved the old contents of {out} to {moved[0]}" in capsys.readouterr().out
    assert calls() == ["bf16"] and (out / "records" / "bf16.json").is_file()
    assert compare(out, "bf16") == 0, "a comparison's own directory is reused without --force"


def test_force_never_moves_the_current_directory(tmp_path, fake_trainer, monkeypatch):
    _, calls = fake_trainer
    monkeypatch.chdir(tmp_path)
    (tmp_path / "report.html").write_text("<p>my own report</p>\n")
    before = snapshot(tmp_path)
    with pytest.raises(UserError, match="is or holds the current directory"):
        compare(".", "bf16", "--force")
    assert snapshot(tmp_path) == before and calls() == []


def test_a_recipe_the_trainer_would_refuse_stops_compare_before_any_training(tmp_path, fake_trainer):
    _, calls = fake_trainer
    out = tmp_path / "cmp"
    with pytest.raises(UserError, match=r"recipe 'nvfp4@model.mlp_dim=72': model.mlp_dim=72 is not a multiple of 16"):
        compare(out, "bf16,nvfp4@model.mlp_dim=72")
    with pytest.raises(UserError, match=r"data.path=.*no_such_corpus.txt does not exist"):
        compare(out, "bf16", f"data.path={tmp_path / 'no_such_corpus.txt'}")
    assert calls() == [] and not out.exists()


def test_a_record_with_other_settings_is_refused_before_other_recipes_train(tmp_path, fake_trainer):
    _, calls = fake_trainer
    out = tmp_path / "cmp"
    assert compare(out, "nvfp4") == 0
    before = snapshot(out)
    with pytest.raises(UserError, match=r"records/nvfp4.json was recorded with other settings"):
        compare(out, "fp8,nvfp4", "train.steps=20")  # fp8 would train first
    assert calls() == ["nvfp4"] and snapshot(out) == before


def test_the_results_table_is_printed_at_the_end(tmp_path, fake_trainer, capsys):
    out = tmp_path / "cmp"
    assert compare(out, "bf16,nvfp4") == 0
    printed = capsys.readouterr().out
    table = printed[printed.rindex("| recipe") :]
    assert "| bf16 |" in table and "| nvfp4 |" in table
    assert table.index("| nvfp4 |") < table.index("fp4lm compare: report in")


def test_a_later_recipe_that_cannot_fit_is_refused_before_any_training(tmp_path, fake_trainer):
    """The memory estimate `fp4lm train` checks runs for every recipe up front (terabytes: refused anywhere)."""
    _, calls = fake_trainer
    out = tmp_path / "cmp"
    with pytest.raises(UserError, match=r"recipe 'nvfp4@data.seq_len=60000': this run needs about .* per device"):
        compare(out, "bf16,nvfp4@data.seq_len=60000")
    assert calls() == [] and not out.exists()


def test_a_later_recipe_whose_run_dir_cannot_be_resumed_is_refused_before_any_training(tmp_path, fake_trainer):
    _, calls = fake_trainer
    out = tmp_path / "cmp"
    (out / "runs" / "nvfp4").mkdir(parents=True)
    (out / "runs" / "nvfp4" / "notes.txt").write_text("not a run\n")
    before = snapshot(out)
    with pytest.raises(UserError, match=r"recipe 'nvfp4': train.run_dir=.*nvfp4 is not empty \(notes.txt\)"):
        compare(out, "bf16,nvfp4")
    assert calls() == [] and snapshot(out) == before


def test_a_reused_record_with_another_tokenizer_is_named_at_the_end(tmp_path, fake_trainer, capsys):
    """A record reused from an fp4lm that built its data otherwise (here: another tokenizer) has identical
    settings but is not comparable: the comparison ends by saying so."""
    out = tmp_path / "cmp"
    assert compare(out, "bf16,nvfp4") == 0
    for label, digit in (("bf16", "1"), ("nvfp4", "0")):  # the fake trainer writes no tokenizer: give each one
        record_file = out / "records" / f"{label}.json"
        record = json.loads(record_file.read_text())
        record["tokenizer_sha256"] = digit * 64
        record_file.write_text(json.dumps(record))
    capsys.readouterr()
    assert compare(out, "bf16,nvfp4") == 0
    printed = capsys.readouterr().out
    assert "warning: the runs used different tokenizers" in printed and "nvfp4: 00000000" in printed


def test_a_run_started_with_other_settings_is_not_resumed_under_new_ones(tmp_path, fake_trainer):
    """A half-finished run resumed under other settings would be trained with one setting
    and recorded with another. Refused before anything is written; the same settings resume it."""
    set_control, calls = fake_trainer
    set_control(fail=["bf16"])
    out = tmp_path / "cmp"
    assert compare(out, "bf16", "optimizer.b1=0.5") == 1
    before = snapshot(out)
    with pytest.raises(
        UserError,
        match=r"recipe 'bf16': .*bf16 holds its run, started with other settings "
        r"\(optimizer.b1: started with 0.5, requested 0.9\)",
    ):
        compare(out, "bf16")
    assert snapshot(out) == before and calls() == ["bf16"]
    assert compare(out, "bf16", "optimizer.b1=0.5") == 0
    assert json.loads((out / "records" / "bf16.json").read_text())["config"]["optimizer"]["b1"] == 0.5


def test_a_finished_unrecorded_run_with_other_settings_is_not_recorded_as_requested(tmp_path, fake_trainer):
    _, calls = fake_trainer
    out = tmp_path / "cmp"
    assert compare(out, "bf16", "optimizer.lr=0.01") == 0
    (out / "records" / "bf16.json").unlink()
    with pytest.raises(UserError, match=r"optimizer.lr: started with 0.01"):
        compare(out, "bf16")
    assert not (out / "records" / "bf16.json").exists() and calls() == ["bf16"]


def test_an_moe_comparison_that_quantizes_no_expert_says_so(tmp_path, fake_trainer, capsys):
    """`compare configs/moe.yaml --preset quick`: two blocks, block 0 dense and block 1 kept in bf16 by the
    config's bf16 tail, so nvfp4 quantizes no expert. Said at the start and with the results."""
    moe = str(REPO / "configs" / "moe.yaml")
    argv = ["--preset", "quick", "--recipes", "bf16,nvfp4", "train.steps=10"]
    assert main_compare([moe, *argv, "--out", str(tmp_path / "two")]) == 0
    out = capsys.readouterr().out
    assert out.count("recipe 'nvfp4' quantizes none of this mixture-of-experts model's routed experts") == 2
    assert "recipe 'bf16'" not in out
    assert main_compare([moe, *argv, "model.num_layers=3", "--out", str(tmp_path / "three")]) == 0
    assert "routed experts" not in capsys.readouterr().out  # block 1 of 3: an nvfp4 MoE block
