"""Byte and BPE tokenizers: round trips, saving/loading in a run dir, and the resume mismatch error.
(Tokenizer files given by path, SentencePiece, fingerprints, vocabulary padding: test_tokenizer*.py beside this.)"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from fp4lm import tokenizer as tok
from fp4lm.config import describe_error
from fp4lm.errors import UserError
from tests.data.helpers_data import sample_text, user_error

UNICODE = "Hark! caf\u00e9 \u2014 \u00fcber \U0001f600 \u4e2d\u6587\n\ttabs  and  spaces\n"


def test_byte_tokenizer_round_trip_and_ids():
    byte = tok.ByteTokenizer()
    ids = byte.encode(UNICODE)
    assert ids.dtype == np.int32 and ids.ndim == 1
    assert ids.tolist() == list(UNICODE.encode("utf-8"))
    assert byte.decode(ids) == UNICODE
    assert byte.vocab_size == 257 and byte.eos_id == 256 and byte.bos_id is None and byte.name == "byte"
    legacy = tok.ByteTokenizer(with_eos=False)  # the 256-id vocabulary of older runs
    assert legacy.vocab_size == 256 and legacy.eos_id is None and legacy.encode(UNICODE).tolist() == ids.tolist()


def test_byte_tokenizer_decodes_invalid_bytes_and_large_ids_without_failing():
    byte = tok.ByteTokenizer()
    assert byte.decode([104, 105, 0xFF]) == "hi\ufffd"
    assert byte.decode(np.array([104, 300, 105])) == "hi"  # ids beyond the byte range have no text
    assert byte.decode([104, 256, 105]) == "hi"  # nor does the end-of-text id


@pytest.fixture(scope="module")
def bpe():
    return tok.BPETokenizer.train(sample_text(400) + UNICODE, 300)


def test_bpe_round_trip_vocab_and_compression(bpe):
    text = sample_text(50)
    ids = bpe.encode(text)
    assert ids.dtype == np.int32 and ids.ndim == 1
    assert bpe.decode(ids) == text
    assert bpe.decode(bpe.encode(UNICODE)) == UNICODE  # unseen characters fall back to bytes
    assert bpe.vocab_size == 300 and bpe.learned_vocab_size == 300 and bpe.trained_vocab_size == 300
    assert bpe.eos_id == bpe.token_id("<|endoftext|>") and bpe.bos_id is None
    assert bpe.eos_id not in ids.tolist()  # the end-of-text token is never learned from text
    assert int(ids.max()) < 300
    assert ids.size < len(text.encode()) / 2  # merges were learned


def test_bpe_training_is_deterministic(bpe):
    again = tok.BPETokenizer.train(sample_text(400) + UNICODE, 300)
    assert again.to_json() == bpe.to_json()


def test_bpe_small_corpus_learns_fewer_and_its_vocab_is_what_it_learned():
    small = tok.BPETokenizer.train("abc abc abd\n", 1000)
    assert small.trained_vocab_size == 1000 and small.vocab_size == small.learned_vocab_size < 300
    assert small.decode(small.encode("abc abd\n")) == "abc abd\n"
    assert small.decode([999]) == ""


def test_bpe_save_load_round_trip(tmp_path, bpe):
    path = bpe.save(tmp_path)
    assert path.name == "tokenizer.json"
    assert json.loads(path.read_text())["model"]["type"] == "BPE"  # the standard tokenizers file
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["eos_token"] == "<|endoftext|>"
    loaded = tok.load_tokenizer(tmp_path)
    assert isinstance(loaded, tok.BPETokenizer) and loaded.vocab_size == 300 and loaded.trained_vocab_size == 300
    assert loaded.fingerprint == bpe.fingerprint and loaded.eos_id == bpe.eos_id
    text = sample_text(30) + UNICODE
    np.testing.assert_array_equal(loaded.encode(text), bpe.encode(text))
    assert tok.load_tokenizer(tmp_path / "elsewhere") is None


def test_even_sample_bounds_training_text():
    text = "".join(f"line {i}\n" for i in range(100_000))
    sample = tok.even_sample(text, 50_000)
    assert 45_000 < len(sample) < 55_000
    assert sample.startswith("line 0\n") and "line 9" in sample[-1000:]  # spread over the whole text
    assert tok.even_sample(text, 50_000) == sample and tok.even_sample("short\n", 100) == "short\n"


def test_load_or_train_saves_then_reuses(tmp_path):
    text = sample_text(300)
    first = tok.load_or_train_tokenizer("bpe", 280, tmp_path, text)
    saved = (tmp_path / "tokenizer.json").read_text()
    second = tok.load_or_train_tokenizer("bpe", 280, tmp_path, "entirely different text\n" * 50)
    assert second.to_json() == first.to_json() and json.loads(saved) == first.hf_json  # loaded, not retrained
    byte_dir = tmp_path / "byte"
    assert tok.load_or_train_tokenizer("byte", 512, byte_dir, None).vocab_size == 257
    assert isinstance(tok.load_tokenizer(byte_dir), tok.ByteTokenizer)


def test_mismatch_with_run_dir_is_a_user_error(tmp_path):
    tok.load_or_train_tokenizer("bpe", 280, tmp_path, sample_text(300))
    user_error(
        lambda: tok.load_or_train_tokenizer("byte", 256, tmp_path, None),
        "made with tokenizer bpe (vocab 280)",
        "tokenizer=bpe",
        "data.tokenizer",
        "train.run_dir",
    )
    user_error(
        lambda: tok.load_or_train_tokenizer("bpe", 512, tmp_path, sample_text(10)),
        "vocab 280",
        "asks for bpe (vocab 512)",
        "vocab_size=280",
        "data.vocab_size",
    )
    byte_dir = tmp_path / "b"
    tok.load_or_train_tokenizer("byte", 256, byte_dir, None)
    tok.load_or_train_tokenizer("byte", 300, byte_dir, None)  # a larger model vocab is fine for bytes
    user_error(lambda: tok.load_or_train_tokenizer("bpe", 280, byte_dir, "x"), "made with tokenizer byte")
    with_eos_dir = tmp_path / "e"
    tok.load_or_train_tokenizer("byte", None, with_eos_dir, None)
    user_error(
        lambda: tok.load_or_train_tokenizer("byte", 256, with_eos_dir, None), "made with tokenizer byte (vocab 257)"
    )


def test_bad_tokenizer_requests_and_files(tmp_path):
    user_error(
        lambda: tok.load_or_train_tokenizer("wordpiece", 300, None, "x"), "wordpiece does not exist", "byte, bpe"
    )
    user_error(lambda: tok.BPETokenizer.train("abc\n", 100), "too small for BPE")
    user_error(lambda: tok.load_or_train_tokenizer("bpe", 300, None, "   "), "no text to train")
    (tmp_path / "tokenizer.json").write_text("{not json")
    user_error(lambda: tok.load_tokenizer(tmp_path), "tokenizer.json", "is not JSON")
    (tmp_path / "tokenizer.json").write_text('{"format": "other"}')
    user_error(lambda: tok.load_tokenizer(tmp_path), "JSON but not a tokenizer")


def test_unwritable_run_dir_is_a_user_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(UserError) as info:
        tok.load_or_train_tokenizer("byte", 256, blocker / "run", None)
    assert re.search("cannot write .*train.run_dir", describe_error(info.value)), describe_error(info.value)
