"""The run directory: nothing a user has is overwritten, a refused command
leaves nothing behind, eval and sample only read, and a run resumes from its directory alone.

Every check is a real command line: refusals in this process (`run_cli_in_process`), training in a fresh one.
"""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest

from fp4lm.config.tiny import TINY_DATA, TINY_MODEL
from tests.reliability.conftest import REFERENCE_STEPS
from tests.reliability.helpers_reliability import (
    assert_one_line_user_error,
    metrics_records,
    run_cli,
    run_cli_in_process,
    snapshot,
    tiny_overrides,
    train_records,
    train_tiny_run,
)

pytestmark = pytest.mark.slow


def _users_results(path: pathlib.Path) -> pathlib.Path:
    """Results of a run made without checkpoints, and a user's notes: nothing training may overwrite."""
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text('{"step": 1, "loss": 5.5}\n')
    (path / "summary.json").write_text('{"final_train_loss": 5.5}\n')
    (path / "notes.txt").write_text("last week's results\n")
    return path


def _train_args(corpus, run_dir, *extra: str) -> list[str]:
    return [
        "train",
        *TINY_MODEL,
        *TINY_DATA,
        f"data.path={corpus}",
        f"train.run_dir={run_dir}",
        "train.steps=2",
        "metrics.progress=plain",
        "metrics.tensorboard=false",
        "eval.sample_tokens=0",
        *extra,
    ]


def test_results_without_checkpoints_are_refused_then_moved_aside_by_force(corpus, compile_cache, tmp_path):
    run_dir = _users_results(tmp_path / "run")
    before = snapshot(run_dir)
    line = assert_one_line_user_error(
        run_cli_in_process(*_train_args(corpus, run_dir)),
        expect_in=("train.run_dir", "notes.txt", "--force", "train.overwrite=true"),
    )
    assert "no fp4lm checkpoint" in line
    assert snapshot(run_dir) == before

    result = run_cli(
        "train",
        "--force",
        *_train_args(corpus, run_dir, f"train.compilation_cache_dir={compile_cache}", "checkpoint.enabled=false")[1:],
    )
    assert result.code == 0, result.stderr[-3000:]
    moved = [p for p in tmp_path.iterdir() if p.name.startswith("run.old-")]
    assert len(moved) == 1 and snapshot(moved[0]) == before, "the old contents must be moved aside unchanged"
    assert f"moved to {moved[0]}" in result.stdout
    assert [r["step"] for r in train_records(run_dir)] == [1, 2]

    # That run has no checkpoint: it is finished and cannot be resumed, so a second start is refused too.
    finished = snapshot(run_dir)
    line = assert_one_line_user_error(
        run_cli_in_process(*_train_args(corpus, run_dir, "checkpoint.enabled=false")),
        expect_in=("finished run without checkpoints", "--force"),
    )
    assert snapshot(run_dir) == finished, line


def test_a_refused_run_dir_is_named_before_the_data_is_built(corpus, tmp_path, monkeypatch):
    import fp4lm.data

    def build(*args, **kwargs):
        raise AssertionError("the data was built for a refused run directory")

    monkeypatch.setattr(fp4lm.data, "build", build)
    run_dir = _users_results(tmp_path / "run")
    before = snapshot(run_dir)
    assert_one_line_user_error(
        run_cli_in_process(*_train_args(corpus, run_dir)), expect_in=("notes.txt", "--force", "train.overwrite=true")
    )
    assert snapshot(run_dir) == before


def test_an_empty_run_dir_setting_is_refused(corpus, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # it would have trained into the current directory
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 5.5}\n')
    before = snapshot(tmp_path)
    assert_one_line_user_error(run_cli_in_process(*_train_args(corpus, "")), expect_in=("train.run_dir", "empty"))
    assert snapshot(tmp_path) == before


def test_a_refused_start_on_a_new_run_dir_leaves_nothing_behind(corpus, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("To be, or not to be.\n")
    new_parent = tmp_path / "runs"
    cases = [  # (extra overrides, words of the answer): refused by the data, the run dir, the settings
        ([f"data.path={short}"], "data.seq_len"),
        ([f"data.path={tmp_path / 'missing.txt'}"], "data.path"),
        (["model.d_model=40"], "multiple of 16"),
    ]
    for extra, words in cases:
        assert_one_line_user_error(
            run_cli_in_process(*_train_args(corpus, new_parent / "run", *extra)), expect_in=(words,)
        )
        assert not new_parent.exists(), f"{extra} left {sorted(p.name for p in new_parent.rglob('*'))}"


def test_a_set_up_that_fails_after_creating_the_run_dir_removes_it(corpus, tmp_path, monkeypatch):
    """Disk full on the first write into a new run directory (simulated): the directory is taken back."""
    import errno
    import os

    import fp4lm.train.run_dir as run_dir_module

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "config.json")

    monkeypatch.setattr(run_dir_module, "write_json_atomically", full)
    new_parent = tmp_path / "runs"
    assert_one_line_user_error(
        run_cli_in_process(*_train_args(corpus, new_parent / "run")), expect_in=("no space left", "train.run_dir")
    )
    assert not new_parent.exists()


def test_resume_refused_for_other_data_names_it_and_keeps_the_cache(copy_reference, tmp_path):
    run_dir = copy_reference()
    other = tmp_path / "other.txt"
    other.write_text("a different corpus\n" * 500)
    before = snapshot(run_dir)
    assert any(name.startswith("data_cache/") for name in before)
    line = assert_one_line_user_error(
        run_cli_in_process("train", f"train.run_dir={run_dir}", f"data.path={other}", "train.seed=7"),
        expect_in=(f"data.path={other}", "train.seed=0", "train.seed=7"),
    )
    assert "num_sequences" not in line
    assert snapshot(run_dir) == before


def test_resume_after_the_data_changed_is_refused_and_touches_nothing(tmp_path):
    """The corpus was edited after the checkpoint: the line says so and how to go on (not "resume with
    the same settings", which cannot succeed), and the run's own data cache is kept, not replaced."""
    run_dir = train_tiny_run(tmp_path, "train.steps=4", "checkpoint.every=2")
    with (tmp_path / "corpus.txt").open("a") as corpus:
        corpus.write("and more words of the sea\n" * 400)
    before = snapshot(run_dir)
    line = assert_one_line_user_error(
        run_cli_in_process("train", f"train.run_dir={run_dir}", "train.steps=8"),
        expect_in=("training data changed since the checkpoint", "put back the data", "new run directory"),
    )
    assert "same data/batch settings" not in line
    assert snapshot(run_dir) == before


def test_eval_and_sample_only_read_the_run_dir(copy_reference):
    run_dir = copy_reference()
    before = snapshot(run_dir)
    evaluated = run_cli_in_process("eval", str(run_dir))
    assert evaluated.code == 0, evaluated.stderr
    sampled = run_cli_in_process("sample", str(run_dir), "--prompt", "the", "--max-tokens", "4")
    assert sampled.code == 0, sampled.stderr
    assert snapshot(run_dir) == before

    # Without its tokenizer file and token cache, eval uses the checkpoint's tokenizer and recreates nothing.
    (run_dir / "tokenizer.json").unlink()
    shutil.rmtree(run_dir / "data_cache")
    before = snapshot(run_dir)
    again = run_cli_in_process("eval", str(run_dir))
    assert again.code == 0, again.stderr
    assert again.stdout.split("val_loss")[1] == evaluated.stdout.split("val_loss")[1]
    assert run_cli_in_process("sample", str(run_dir), "--prompt", "the", "--max-tokens", "4").code == 0
    assert snapshot(run_dir) == before


def test_resuming_needs_only_the_run_dir(copy_reference, compile_cache):
    """The saved config is the base: `train.run_dir=X` alone finds the run finished; raising train.steps
    extends it with every other setting as saved."""
    run_dir = copy_reference()
    before = snapshot(run_dir)
    finished = run_cli("train", f"train.run_dir={run_dir}")
    assert finished.code == 0, finished.stderr[-3000:]
    assert "already finished" in finished.stdout
    assert snapshot(run_dir) == before

    extended = run_cli("train", f"train.run_dir={run_dir}", f"train.steps={REFERENCE_STEPS + 3}")
    assert extended.code == 0, extended.stderr[-3000:]
    steps = [r["step"] for r in train_records(run_dir)]
    assert steps == list(range(1, REFERENCE_STEPS + 4))
    config = json.loads((run_dir / "config.json").read_text())
    assert config["model"]["d_model"] == 32 and config["train"]["batch_size"] == 4
    assert config["train"]["compilation_cache_dir"] == str(compile_cache)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == REFERENCE_STEPS + 3 and summary["recipe"] == "nvfp4"


def test_a_recipe_switch_on_resume_is_refused_unless_allowed_and_then_recorded(copy_reference):
    run_dir = copy_reference()
    before = snapshot(run_dir)
    switch = [f"train.run_dir={run_dir}", f"train.steps={REFERENCE_STEPS + 2}", "precision.recipe=fp8"]
    assert_one_line_user_error(
        run_cli_in_process("train", *switch),
        expect_in=("precision.recipe=nvfp4", "precision.recipe=fp8", "train.allow_recipe_change=true"),
    )
    assert snapshot(run_dir) == before

    result = run_cli("train", *switch, "train.allow_recipe_change=true")
    assert result.code == 0, result.stderr[-3000:]
    events = [r for r in metrics_records(run_dir) if r.get("event") == "precision_switch"]
    assert events == [
        {
            "step": REFERENCE_STEPS,
            "event": "precision_switch",
            "setting": "precision.recipe",
            "from": "nvfp4",
            "to": "fp8",
        }
    ]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["recipe_history"] == [
        {"recipe": "nvfp4", "from_step": 0},
        {"recipe": "fp8", "from_step": REFERENCE_STEPS},
    ]
    assert "nvfp4" in summary["recipe"] and "fp8" in summary["recipe"]


def test_a_run_killed_before_its_first_checkpoint_restarts(corpus, compile_cache, tmp_path):
    """fp4lm's own directory with no checkpoint yet (config.json, tokenizer, a few logged steps) starts over."""
    run_dir = tmp_path / "run"
    args = tiny_overrides(corpus, compile_cache, run_dir, "train.steps=3", "checkpoint.every=100")
    first = run_cli("train", *args)
    assert first.code == 0, first.stderr[-3000:]
    shutil.rmtree(run_dir / "checkpoints")  # as if killed before its first save
    (run_dir / "summary.json").unlink()
    again = run_cli("train", *args)
    assert again.code == 0, again.stderr[-3000:]
    assert [r["step"] for r in train_records(run_dir)] == [1, 2, 3]


def test_an_interrupted_run_continues_exactly_from_its_run_dir_alone(copy_reference, reference_run):
    """As if stopped after step 36: `train.run_dir=X` alone finishes it with the reference run's losses."""
    run_dir = copy_reference()
    checkpoints = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    for step in checkpoints[1:]:
        shutil.rmtree(run_dir / "checkpoints" / str(step))
    (run_dir / "summary.json").unlink()
    result = run_cli("train", f"train.run_dir={run_dir}")
    assert result.code == 0, result.stderr[-3000:]
    assert f"resuming from step {checkpoints[0]}" in result.stdout
    assert train_records(run_dir) == train_records(reference_run)
