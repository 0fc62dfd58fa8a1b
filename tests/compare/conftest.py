"""Fixtures shared by the report tests."""

import json
import pathlib
import sys

import pytest

from fp4lm.compare import runner

FAKE_TRAINER = pathlib.Path(__file__).with_name("fake_trainer.py")


@pytest.fixture
def fake_trainer(tmp_path, monkeypatch):
    """Routes compare's training subprocess to fake_trainer.py; returns (control dict writer, calls reader)."""
    control_path = tmp_path / "control.json"
    calls_path = tmp_path / "calls.txt"
    calls_path.write_text("")

    def command(config_path, overrides):
        return [
            sys.executable,
            str(FAKE_TRAINER),
            str(control_path),
            *([config_path] if config_path else []),
            *overrides,
        ]

    def set_control(**control):
        control_path.write_text(json.dumps({"calls": str(calls_path), **control}))

    set_control()
    monkeypatch.setattr(runner, "train_command", command)
    return set_control, lambda: calls_path.read_text().split()
