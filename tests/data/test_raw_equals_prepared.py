"""One data path: training on a raw JSONL file and on `fp4lm prepare` of that file, with the same tokenizer
and settings, gives identical losses at every step and identical validation losses."""

from __future__ import annotations

import json
import pathlib

import pytest

from fp4lm.config import load_config
from fp4lm.tokenizer import BPETokenizer
from fp4lm.train import train
from tests.reliability.helpers_reliability import (
    QUIET,
    TINY_MODEL,
    eval_records,
    run_cli_in_process,
    train_records,
    write_corpus,
)

pytestmark = pytest.mark.slow

VAL_FRACTION = "0.1"


def _documents(root: pathlib.Path) -> pathlib.Path:
    """A JSONL file of 150 short documents (a few lines of the test corpus each)."""
    lines = write_corpus(root / "corpus.txt", lines=600).read_text().splitlines()
    path = root / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": "\n".join(lines[i : i + 4])}) + "\n" for i in range(0, 600, 4)))
    return path


def _train(root: pathlib.Path, data_path: pathlib.Path, tokenizer: pathlib.Path, name: str) -> pathlib.Path:
    run_dir = root / name
    overrides = [
        *TINY_MODEL,
        *QUIET,
        f"data.path={data_path}",
        f"data.tokenizer={tokenizer}",
        f"data.val_fraction={VAL_FRACTION}",
        "data.seq_len=32",
        "train.batch_size=4",
        "train.steps=4",
        "eval.every=2",
        "checkpoint.enabled=false",
        f"train.compilation_cache_dir={root / 'jax_cache'}",
        f"train.run_dir={run_dir}",
    ]
    train(load_config(None, overrides))
    return run_dir


def test_raw_jsonl_trains_exactly_as_its_prepared_form(tmp_path):
    source = _documents(tmp_path)
    BPETokenizer.train(source.read_text(), 300).save(tmp_path / "tokenizer")
    tokenizer = tmp_path / "tokenizer" / "tokenizer.json"
    prepared = tmp_path / "prepared"
    result = run_cli_in_process(
        "prepare", str(source), "--tokenizer", str(tokenizer), "--out", str(prepared), "--val-fraction", VAL_FRACTION
    )
    assert result.code == 0, result.stderr
    raw_run = _train(tmp_path, source, tokenizer, "raw_run")
    prepared_run = _train(tmp_path, prepared, tokenizer, "prepared_run")
    raw_steps, prepared_steps = train_records(raw_run), train_records(prepared_run)
    assert len(raw_steps) == 4 and raw_steps == prepared_steps  # every step's loss, bit for bit
    raw_evals = [r["val_loss"] for r in eval_records(raw_run)]
    assert len(raw_evals) == 2 and raw_evals == [r["val_loss"] for r in eval_records(prepared_run)]
    # the raw source was prepared by the same code: its cache, kept in the run directory, holds the same tokens
    (cache,) = (raw_run / "data_cache").iterdir()
    for shard in sorted(prepared.glob("*.npy")):
        assert (cache / shard.name).read_bytes() == shard.read_bytes()
