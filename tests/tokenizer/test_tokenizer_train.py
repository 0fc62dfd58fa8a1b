"""`fp4lm train` with the user's tokenizer.json: the model's vocabulary is the tokenizer's, padded to 128, and
the run directory keeps the tokenizer in the standard format (tokenizers.Tokenizer.from_file reads it)."""

from __future__ import annotations

import json

import pytest

from fp4lm import tokenizer as tok
from tests.reliability.helpers_reliability import (
    QUIET,
    TINY_MODEL,
    assert_one_line_user_error,
    run_cli_in_process,
    write_corpus,
)
from tests.tokenizer.test_tokenizer_files import train_hf_tokenizer


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 10-step run with a Llama-3-like tokenizer.json (begin and end tokens) given by its directory."""
    root = tmp_path_factory.mktemp("own_tokenizer")
    tokenizer_dir = root / "tok"
    tokenizer_dir.mkdir()
    train_hf_tokenizer(["<|begin_of_text|>", "<|end_of_text|>"]).save(str(tokenizer_dir / "tokenizer.json"))
    overrides = [
        *TINY_MODEL,
        *QUIET,
        f"data.path={write_corpus(root / 'corpus.txt')}",
        f"data.tokenizer={tokenizer_dir}",
        "data.seq_len=32",
        "train.batch_size=4",
        "train.steps=10",
        "precision.recipe=bf16",  # the tokenizer is under test here, not the recipe: the quickest compile
        f"train.compilation_cache_dir={root / 'jax_cache'}",
        f"train.run_dir={root / 'run'}",
    ]
    result = run_cli_in_process("train", *overrides)
    assert result.code == 0, result.stderr[-3000:]
    return root, tokenizer_dir, overrides, result


def test_training_with_a_tokenizer_json_keeps_it_in_the_run_directory(trained):
    from tokenizers import Tokenizer

    root, tokenizer_dir, _, result = trained
    run = root / "run"
    standard = Tokenizer.from_file(str(run / "tokenizer.json"))  # other tools read the run's tokenizer
    original = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    text = (root / "corpus.txt").read_text()[:2000]
    assert standard.encode(text).ids == original.encode(text).ids
    config = json.loads((run / "tokenizer_config.json").read_text())
    assert (config["bos_token"], config["eos_token"]) == ("<|begin_of_text|>", "<|end_of_text|>")
    saved, given = tok.load_tokenizer(run), tok.open_tokenizer(str(tokenizer_dir))
    assert saved is not None and saved.fingerprint == given.fingerprint
    assert (saved.bos_id, saved.eos_id) == (0, 1)
    assert "vocab 384:" in result.stdout  # 300 tokens, padded to a multiple of 128 for the model
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 10 and summary["final_val_loss"] > 0


def test_the_checkpoint_holds_the_padded_vocabulary(trained):
    from fp4lm.inference.saved_run import load_run

    root, tokenizer_dir, _, _ = trained
    saved = load_run(str(root / "run"))
    assert saved.params["embed"]["table"].shape[0] == 384
    assert saved.tokenizer.fingerprint == tok.open_tokenizer(str(tokenizer_dir)).fingerprint


def test_another_tokenizer_cannot_continue_the_run(trained):
    _, _, overrides, _ = trained
    result = run_cli_in_process("train", *overrides, "data.tokenizer=byte")
    assert_one_line_user_error(result, expect_in=("data.tokenizer",))


def test_a_vocab_size_below_the_tokenizers_is_refused_before_training(trained, tmp_path):
    _, _, overrides, _ = trained
    result = run_cli_in_process("train", *overrides, "data.vocab_size=256", f"train.run_dir={tmp_path / 'new'}")
    assert_one_line_user_error(result, expect_in=("vocab_size=256 is smaller", "300 tokens", "(data.vocab_size)"))
    assert not (tmp_path / "new").exists()
