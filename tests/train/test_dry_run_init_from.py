"""`fp4lm train --dry-run` compiles the config `fp4lm train` would train: the model of
train.init_from's checkpoint, an existing run's saved config, and the refusal train gives an override that
changes what the run was trained with. Options and overrides may come in any order after the config."""

from __future__ import annotations

import re

import pytest

from fp4lm.export.source import load_source
from fp4lm.hf import export as hf
from tests.reliability.helpers_reliability import assert_one_line_user_error, run_cli_in_process, snapshot

pytestmark = pytest.mark.slow


def _model_line(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("model: "))


def test_the_dry_run_describes_the_checkpoint_of_init_from(trained_run, tmp_path):
    (tmp_path / "hf").mkdir()
    hf.export_hf(load_source(str(trained_run)), tmp_path / "hf")
    run_dir = tmp_path / "new_run"
    done = run_cli_in_process(
        "train", "--dry-run", f"train.init_from={tmp_path / 'hf'}", f"train.run_dir={run_dir}", "train.batch_size=4"
    )
    assert done.code == 0, done.stderr
    assert re.match(r"model: 2 layers, d_model 32, 2 heads \(1 kv\), mlp 64, vocab 25\d", _model_line(done.stdout))
    assert not run_dir.exists()


def test_the_dry_run_of_an_existing_run_compiles_its_saved_config(trained_run):
    before = snapshot(trained_run)
    done = run_cli_in_process("train", f"train.run_dir={trained_run}", "--dry-run", "train.steps=8")
    assert done.code == 0, done.stderr
    assert _model_line(done.stdout).startswith("model: 2 layers, d_model 32, 2 heads (1 kv), mlp 64")
    refused = run_cli_in_process("train", f"train.run_dir={trained_run}", "--dry-run", "model.num_layers=3")
    assert_one_line_user_error(refused, expect_in=("model.num_layers=2", "model.num_layers=3"))
    assert snapshot(trained_run) == before


def test_a_damaged_tokenizer_of_init_from_is_named_as_the_checkpoints(trained_run, tmp_path):
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    hf.export_hf(load_source(str(trained_run)), hf_dir)
    (hf_dir / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": ')
    before = snapshot(hf_dir)
    done = run_cli_in_process("train", f"train.init_from={hf_dir}", f"train.run_dir={tmp_path / 'run'}", "--dry-run")
    line = assert_one_line_user_error(done, expect_in=("train.init_from=", "tokenizer is damaged", "tokenizer.json"))
    assert "data.tokenizer" not in line
    assert snapshot(hf_dir) == before and not (tmp_path / "run").exists()
