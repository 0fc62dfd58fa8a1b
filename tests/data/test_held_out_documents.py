"""A raw source of several documents holds out whole documents by `fp4lm prepare`'s hash rule; a single
document, or a source too small for that, keeps the tail split (the last val_fraction of its tokens); with
every default left alone, a raw source and its `fp4lm prepare` hold out the same documents; a run directory
with the older npz token cache is refused by name."""

from __future__ import annotations

import json
import pathlib

import numpy as np

from fp4lm.config import DataConfig
from fp4lm.data import corpus
from fp4lm.data.prepared import is_validation
from tests.data.helpers_data import user_error
from tests.reliability.helpers_reliability import run_cli_in_process

SEQ = 8


def _texts(count: int, prefix: str = "document") -> list[str]:
    return [f"{prefix} {i}: " + "words and more words " * (1 + i % 4) for i in range(count)]


def _jsonl(path: pathlib.Path, texts: list[str]) -> pathlib.Path:
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    return path


def _documents(loaded: corpus.Corpus, split: str) -> list[str]:
    tokens = np.asarray(loaded.train_tokens if split == "train" else loaded.val_tokens)
    starts = loaded.document_starts(split)
    assert starts is not None
    ends = np.append(starts[1:], tokens.size)
    return [loaded.tokenizer.decode(tokens[a : b - 1]) for a, b in zip(starts, ends, strict=True)]


def test_documents_are_held_out_by_the_hash_of_their_text_whatever_their_order(tmp_path):
    texts = _texts(60)
    cfg = DataConfig(path=str(_jsonl(tmp_path / "docs.jsonl", texts)), tokenizer="byte", seq_len=SEQ, val_fraction=0.2)
    loaded = corpus.load_corpus(cfg, run_dir=None)
    expected_val = [t for t in texts if is_validation(t, 0.2)]
    assert 0 < len(expected_val) < len(texts) / 2
    assert _documents(loaded, "val") == expected_val
    assert _documents(loaded, "train") == [t for t in texts if not is_validation(t, 0.2)]
    # another order of the same documents, over two files of a directory: the same documents held out
    directory = tmp_path / "shuffled"
    directory.mkdir()
    shuffled = list(reversed(texts))
    _jsonl(directory / "a.jsonl", shuffled[:25])
    _jsonl(directory / "b.jsonl", shuffled[25:])
    again = corpus.load_corpus(DataConfig(**{**vars(cfg), "path": str(directory)}), run_dir=None)
    assert sorted(_documents(again, "val")) == sorted(expected_val)


def test_the_bpe_tokenizer_learns_from_the_training_documents_only(tmp_path):
    marker = "zyzzyvaquokka"  # only in held-out documents: a BPE trained on them would learn its pieces
    texts, held_out = [], []
    for text in _texts(60):
        marked = text + f" {marker}" * 30
        if is_validation(marked, 0.2):
            texts.append(marked)
            held_out.append(marked)
        elif not is_validation(text, 0.2):
            texts.append(text)
    assert held_out and len(held_out) < len(texts) / 2
    source = _jsonl(tmp_path / "docs.jsonl", texts)
    loaded = corpus.load_corpus(
        DataConfig(path=str(source), tokenizer="bpe", vocab_size=300, seq_len=SEQ, val_fraction=0.2), run_dir=None
    )
    assert len(_documents(loaded, "val")) == len(held_out)
    assert len(loaded.tokenizer.encode(marker)) >= len(marker) // 2  # not merged into a few tokens


def _all_tokens(loaded: corpus.Corpus) -> np.ndarray:
    return np.concatenate([np.asarray(loaded.train_tokens), np.asarray(loaded.val_tokens)])


def test_a_single_text_file_keeps_the_tail_split(tmp_path):
    text = "".join(f"line {i} of the only document\n" for i in range(200))
    source = tmp_path / "book.txt"
    source.write_text(text)
    loaded = corpus.load_corpus(
        DataConfig(path=str(source), tokenizer="byte", seq_len=SEQ, val_fraction=0.1), run_dir=None
    )
    eos = loaded.tokenizer.eos_id
    np.testing.assert_array_equal(_all_tokens(loaded), [*loaded.tokenizer.encode(text), eos])  # one document
    assert loaded.num_val_tokens == round(len(_all_tokens(loaded)) * 0.1)  # the last tenth of its tokens
    assert list(loaded.document_starts("train")) == [0] and list(loaded.document_starts("val")) == [0]


def test_too_few_documents_to_hold_one_out_fall_back_to_the_tail_split(tmp_path):
    texts = [t for t in _texts(40) if not is_validation(t, 0.1)][:4]  # none of them would be held out
    source = _jsonl(tmp_path / "few.jsonl", texts)
    loaded = corpus.load_corpus(
        DataConfig(path=str(source), tokenizer="byte", seq_len=SEQ, val_fraction=0.1), run_dir=None
    )
    eos = loaded.tokenizer.eos_id
    expected = np.concatenate([[*loaded.tokenizer.encode(text), eos] for text in texts])
    np.testing.assert_array_equal(_all_tokens(loaded), expected)  # the documents in order, none held out
    assert loaded.num_val_tokens == round(expected.size * 0.1) > 0


def test_a_raw_source_and_its_prepared_form_hold_out_the_same_documents_by_default(tmp_path):
    source = _jsonl(tmp_path / "docs.jsonl", _texts(300))
    prepared = tmp_path / "prepared"
    result = run_cli_in_process("prepare", str(source), "--tokenizer", "byte", "--out", str(prepared))
    assert result.code == 0, result.stderr
    raw = corpus.load_corpus(DataConfig(path=str(source), tokenizer="byte", seq_len=SEQ), run_dir=None)
    from_prepared = corpus.load_corpus(DataConfig(path=str(prepared), tokenizer="byte", seq_len=SEQ), run_dir=None)
    assert len(_documents(raw, "val")) > 0
    for split in ("train", "val"):
        assert _documents(from_prepared, split) == _documents(raw, split)


def test_a_run_directory_with_the_old_token_cache_is_refused(tmp_path):
    cfg = DataConfig(path=str(_jsonl(tmp_path / "docs.jsonl", _texts(60))), tokenizer="byte", seq_len=SEQ)
    run_dir = tmp_path / "run"
    (run_dir / "data_cache").mkdir(parents=True)
    (run_dir / "data_cache" / "tokens-0123456789abcdef0123.npz").write_bytes(b"")
    user_error(lambda: corpus.load_corpus(cfg, run_dir=run_dir), "tokens-*.npz", "older fp4lm", "new run directory")
