"""fp4lm from any directory: a config file given by absolute path finds its data relative
to itself, the bundled corpus is found by name, and the run directory records where its data is, so
`fp4lm eval RUN` works from anywhere too. `fp4lm train` and `fp4lm eval` through the command line's entry point,
each from its own current directory, tiny and short."""

from __future__ import annotations

import json
import shutil

import pytest

from fp4lm.config.tiny import TINY_DATA, TINY_MODEL
from tests.reliability.helpers_reliability import QUIET, REPO, run_cli_in_process

pytestmark = pytest.mark.slow

SHORT = ["train.steps=2", "precision.bf16_last_layers=0"]


def _train_then_eval_elsewhere(config, compile_cache, tmp_path, monkeypatch, *overrides) -> dict:
    """Trains from one temporary directory and evaluates from another; returns the run's saved config."""
    elsewhere, third = tmp_path / "elsewhere", tmp_path / "third"
    elsewhere.mkdir()
    third.mkdir()
    cache = f"train.compilation_cache_dir={compile_cache}"
    monkeypatch.chdir(elsewhere)
    trained = run_cli_in_process("train", str(config), *overrides, *QUIET, *SHORT, cache, "train.run_dir=run")
    assert trained.code == 0, trained.stderr[-4000:]
    run_dir = elsewhere / "run"  # where a run writes is relative to the current directory
    monkeypatch.chdir(third)
    evaluated = run_cli_in_process("eval", str(run_dir))
    assert evaluated.code == 0, evaluated.stderr[-4000:]
    assert "val_loss" in evaluated.stdout
    return json.loads((run_dir / "config.json").read_text())


def test_a_config_file_finds_its_data_relative_to_itself(tmp_path, corpus, compile_cache, monkeypatch):
    project = tmp_path / "project"
    (project / "configs").mkdir(parents=True)
    (project / "data").mkdir()
    shutil.copy(corpus, project / "data" / "corpus.txt")
    config = project / "configs" / "tiny.yaml"
    config.write_text("data: {path: ../data/corpus.txt}\n")
    saved = _train_then_eval_elsewhere(config, compile_cache, tmp_path, monkeypatch, *TINY_MODEL, *TINY_DATA)
    assert saved["data"]["path"] == str(project / "data" / "corpus.txt")  # absolute in the run directory


def test_the_default_config_by_absolute_path_trains_on_the_bundled_corpus_from_anywhere(
    tmp_path, compile_cache, monkeypatch
):
    default = REPO / "configs" / "default.yaml"
    saved = _train_then_eval_elsewhere(default, compile_cache, tmp_path, monkeypatch, *TINY_MODEL, *TINY_DATA)
    assert saved["data"]["path"] == "bundled:shakespeare"  # the same file from any directory and any install
