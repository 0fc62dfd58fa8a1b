"""Ctrl-C answers with what it leaves, per command: only `train`
talks about resuming; `sample` and `eval` have nothing to resume, an export writes nothing."""

from __future__ import annotations

import pytest

from fp4lm.export import output_dir
from fp4lm.inference import saved_run
from fp4lm.sharding import all_devices
from tests.reliability.helpers_reliability import run_cli_in_process


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    "argv",
    [["sample", "RUN", "--prompt", "ROMEO:"], ["eval", "RUN"]],
    ids=["sample", "eval"],
)
def test_ctrl_c_while_reading_a_run_does_not_talk_about_resuming(argv, monkeypatch):
    all_devices()
    monkeypatch.setattr(saved_run, "load_run", _interrupt)
    result = run_cli_in_process(*argv)
    assert result.code == 130
    assert result.stderr.strip() == "interrupted"


def test_ctrl_c_during_an_export_says_nothing_was_written(monkeypatch, tmp_path):
    monkeypatch.setattr(output_dir, "check_output_dir", _interrupt)
    result = run_cli_in_process("export", str(tmp_path), "--format", "hf", "--out", str(tmp_path / "out"))
    assert result.code == 130
    assert "nothing was written" in result.stderr and "resume" not in result.stderr
