"""Every entry of the bad-input catalogue (bad_inputs.py) is answered with one line naming the problem and the
fix, exit code 2, no traceback, and leaves the run directory it points at untouched.

Most cases run `fp4lm.cli.main` in this process (an exception other than SystemExit escaping it fails the
test: that would be a traceback for the user); a handful run `python -m fp4lm` for real, end to end.
"""

from __future__ import annotations

import errno
import io
import os
import pathlib
import shutil

import pytest

from tests.reliability.bad_inputs import (
    COMMAND_CASES,
    FINISHED_RUN_CASES,
    RESUME_CASES,
    TRAIN_CASES,
    expand,
    make_bad_files,
    make_existing_run,
    make_restartable_run,
)
from tests.reliability.helpers_reliability import (
    assert_one_line_user_error,
    run_cli,
    run_cli_in_process,
    snapshot,
)


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, pathlib.Path]:
    root = tmp_path_factory.mktemp("bad_inputs")
    files = make_bad_files(root / "files")
    files["existing_run"] = make_existing_run(root / "existing_run")
    files["restartable_run"] = make_restartable_run(root / "restartable_run")
    return files


@pytest.fixture(scope="module")
def finished_run(reference_run, tmp_path_factory) -> pathlib.Path:
    """A copy of the finished reference run (40 steps, tiny NVFP4 model, byte tokens, seq_len 32, batch 4)."""
    target = tmp_path_factory.mktemp("finished") / "run"
    shutil.copytree(reference_run, target)
    return target


def assert_nothing_overwritten(before: dict[str, str], after: dict[str, str], where: pathlib.Path) -> None:
    changed = sorted(name for name in before if after.get(name) != before[name])
    assert not changed, f"files of {where} were changed or removed: {changed}"


def _check(argv: list[str], expect: list[str], untouched: pathlib.Path, *, in_process: bool = True, cwd=None) -> str:
    before = snapshot(untouched)
    result = run_cli_in_process(*argv) if in_process else run_cli(*argv, cwd=cwd)
    line = assert_one_line_user_error(result, expect_in=tuple(expect))
    assert_nothing_overwritten(before, snapshot(untouched), untouched)
    return line


@pytest.mark.parametrize("case", TRAIN_CASES, ids=[c[0] for c in TRAIN_CASES])
def test_bad_training_input(case, paths):
    _, extra, expect = case
    existing = snapshot(paths["existing_run"])
    _check(expand(["TRAIN", *extra], paths), expect, paths["restartable_run"])
    assert_nothing_overwritten(existing, snapshot(paths["existing_run"]), paths["existing_run"])


@pytest.mark.parametrize("case", COMMAND_CASES, ids=[c[0] for c in COMMAND_CASES])
def test_bad_command(case, paths):
    _, argv, expect = case
    _check(expand(argv, paths), expect, paths["existing_run"])


@pytest.mark.parametrize("case", RESUME_CASES, ids=[c[0] for c in RESUME_CASES])
def test_resume_with_incompatible_settings(case, paths, finished_run, corpus):
    _, extra, expect = case
    argv = expand(["TRAIN", f"train.run_dir={finished_run}", f"data.path={corpus}", "train.steps=40", *extra], paths)
    _check(argv, expect, finished_run)


@pytest.mark.parametrize("case", FINISHED_RUN_CASES, ids=[c[0] for c in FINISHED_RUN_CASES])
def test_bad_option_on_a_finished_run(case, paths, finished_run):
    _, argv, expect = case
    _check(expand(argv, {**paths, "run": finished_run}), expect, finished_run)


def test_unwritable_run_dir(paths, tmp_path, monkeypatch):
    """Permission denied creating the run directory (simulated: tests may run as root, who ignores modes)."""
    target = tmp_path / "locked" / "run"
    real_mkdir = os.mkdir

    def refuse(path, *args, **kwargs):
        if str(path).startswith(str(tmp_path / "locked")):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", refuse)
    line = _check(
        expand(["TRAIN", f"train.run_dir={target}"], paths),
        ["train.run_dir", "Permission denied"],
        paths["existing_run"],
    )
    assert "writable" in line


def test_disk_full_when_starting(paths, tmp_path, monkeypatch):
    """ENOSPC on the first write into a new run directory (simulated at io.open); the directory it had created
    is removed again. (The existing run is refused before any write: it holds results but no checkpoint.)"""
    run_dir = tmp_path / "full" / "run"
    real_open = io.open

    def full(file, mode="r", *args, **kwargs):
        if str(file).startswith(str(run_dir)) and any(c in mode for c in "wax+"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(io, "open", full)
    _check(
        expand(["TRAIN", f"train.run_dir={run_dir}"], paths),
        ["no space left", "free disk space"],
        paths["existing_run"],
    )
    assert not (tmp_path / "full").exists()


# ---------------------------------------------------------------- end to end, in a fresh process

END_TO_END = [
    "unknown_key",
    "parquet_corrupt",
    "config_file_missing",
    "project_unknown_gpu",
    "eval_run_dir_without_checkpoint",
]


@pytest.mark.parametrize("name", END_TO_END)
def test_end_to_end_in_a_subprocess(name, paths):
    case = {c[0]: c for c in TRAIN_CASES + COMMAND_CASES}[name]
    argv = ["TRAIN", *case[1]] if case in TRAIN_CASES else case[1]
    untouched = paths["restartable_run"] if case in TRAIN_CASES else paths["existing_run"]
    _check(expand(argv, paths), case[2], untouched, in_process=False)


def test_end_to_end_resume_with_other_shape(paths, finished_run, corpus):
    argv = expand(
        ["TRAIN", f"train.run_dir={finished_run}", f"data.path={corpus}", "train.steps=40", "model.num_layers=2"], paths
    )
    _check(argv, ["model.num_layers"], finished_run, in_process=False)


def test_default_config_outside_the_repository(paths, tmp_path):
    """`fp4lm train` from another directory finds the bundled corpus; what stops it here is
    the run directory, which holds results but no checkpoint."""
    _check(
        ["train", "train.steps=1", f"train.run_dir={paths['existing_run']}"],
        ["train.run_dir", "--force"],
        paths["existing_run"],
        in_process=False,
        cwd=tmp_path,
    )


def test_a_refused_start_leaves_no_tokenizer_to_reuse(paths, tmp_path):
    """A BPE tokenizer trained on a corpus that was refused must not be picked up by the next attempt."""
    run_dir = tmp_path / "fresh"
    argv = expand(
        ["TRAIN", f"train.run_dir={run_dir}", "data.path={short}", "data.tokenizer=bpe", "data.vocab_size=300"], paths
    )
    assert_one_line_user_error(run_cli_in_process(*argv), expect_in=("data.seq_len",))
    assert not (run_dir / "tokenizer.json").exists()


def test_catalogue_size():
    cases = TRAIN_CASES + COMMAND_CASES + RESUME_CASES + FINISHED_RUN_CASES
    assert len({c[0] for c in cases}) == len(cases) >= 25
