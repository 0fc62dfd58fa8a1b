"""Corpus loading and build(): the bundled Shakespeare, the split, caching, tokenizer reuse, bad corpora."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import lzma
import pathlib

import numpy as np
import pytest

import fp4lm.data as data
from fp4lm.config import DEFAULT_BPE_VOCAB_SIZE
from fp4lm.data import corpus
from fp4lm.tokenizer import BPETokenizer
from tests.data.helpers_data import DataCfg, sample_text, user_error

REPO = pathlib.Path(__file__).resolve().parents[2]
BUNDLED = REPO / "fp4lm" / "resources" / "shakespeare.txt.xz"
# The bundled corpus as published: its .xz bytes and the text they decompress to.
XZ_SHA256 = "1fc4b10c6b0bd51cba534ac77994f26ab0374ed7311fa90060481e6523a5b831"
TEXT_SHA256 = "eecb187ea3ecfb54a689c79d4b72d322eff0fbdb750d3d04c4d94d0a30e3cb20"
TEXT_BYTES = 4_815_872


def test_bundled_corpus_matches_its_published_facts():
    raw = BUNDLED.read_bytes()
    assert len(raw) == 1_494_944 and hashlib.sha256(raw).hexdigest() == XZ_SHA256
    text = lzma.decompress(raw)
    assert len(text) == TEXT_BYTES and hashlib.sha256(text).hexdigest() == TEXT_SHA256


def test_bundled_corpus_is_the_default_and_loads_with_bytes(monkeypatch):
    monkeypatch.chdir(REPO)  # data paths are relative to the working directory
    loaded = corpus.load_corpus(DataCfg(seq_len=256, val_fraction=0.02), run_dir=None)
    assert loaded.format == "text" and pathlib.Path(loaded.path).resolve() == BUNDLED.resolve()
    assert loaded.num_train_tokens + loaded.num_val_tokens == TEXT_BYTES  # one byte per token
    text = lzma.decompress(BUNDLED.read_bytes()).decode()
    assert loaded.tokenizer.decode(loaded.train_tokens) + loaded.tokenizer.decode(loaded.val_tokens) == text
    assert 0.019 < loaded.num_val_tokens / TEXT_BYTES < 0.021


@pytest.fixture(scope="module")
def default_bpe_run(tmp_path_factory):
    """The shipped default data config (fp4lm.config.DataConfig): BPE on the bundled corpus."""
    from fp4lm.config import DataConfig

    run_dir = tmp_path_factory.mktemp("run")
    cfg = dataclasses.replace(DataConfig(), path=str(BUNDLED))
    built = data.build(cfg, run_dir=run_dir, seed=0, batch_size=16)
    assert list(run_dir.iterdir()) == []  # loading only reads the run directory
    built.save(run_dir)
    return cfg, run_dir, built


def test_default_config_builds_bpe_over_bundled_corpus(default_bpe_run):
    cfg, run_dir, built = default_bpe_run
    assert built.tokenizer.name == "bpe" and built.tokenizer.vocab_size == DEFAULT_BPE_VOCAB_SIZE == built.vocab_size
    assert (run_dir / "tokenizer.json").is_file()
    assert TEXT_BYTES / 4 < built.num_train_tokens < TEXT_BYTES / 2  # BPE compresses the text
    batch = next(built.train_iterator)
    assert batch["inputs"].shape == (16, cfg.seq_len) and int(batch["inputs"].max()) < built.vocab_size
    evals = built.eval_batches(4)
    assert len(evals) == 4 and evals[0]["targets"].shape == (16, cfg.seq_len)
    assert built.corpus.val_tokens[-1] == built.tokenizer.eos_id  # the held-out part ends as a document does
    assert built.tokenizer.decode(built.corpus.val_tokens[:-1]) in lzma.decompress(BUNDLED.read_bytes()).decode()
    assert "bpe" in built.describe()


def test_rebuild_in_same_run_dir_reuses_tokenizer_and_cache(default_bpe_run):
    cfg, run_dir, built = default_bpe_run
    caches = list((run_dir / "data_cache").iterdir())
    assert len(caches) == 1 and (caches[0] / "manifest.json").is_file()  # the source prepared, kept with the run
    again = data.build(cfg, run_dir=run_dir, seed=0, batch_size=16)
    assert again.corpus.shards.directory == caches[0]  # read from the run directory: nothing prepared again
    assert again.tokenizer.to_json() == built.tokenizer.to_json()
    np.testing.assert_array_equal(again.corpus.train_tokens, built.corpus.train_tokens)
    np.testing.assert_array_equal(again.corpus.val_tokens, built.corpus.val_tokens)
    state = json.loads(json.dumps(built.train_iterator.get_state()))
    expected = next(built.train_iterator)
    again.train_iterator.set_state(state)
    np.testing.assert_array_equal(next(again.train_iterator)["inputs"], expected["inputs"])
    user_error(
        lambda: data.build(
            dataclasses.replace(cfg, tokenizer="byte", vocab_size=256), run_dir=run_dir, seed=0, batch_size=16
        ),
        "made with tokenizer bpe (vocab 2048)",
    )


def test_bpe_is_trained_on_the_training_split_only(tmp_path):
    train_part = "the king is dead\n" * 200
    val_part = "zyzzyva quokka xylophone\n" * 30
    path = tmp_path / "c.txt"
    path.write_text(train_part + val_part)
    val_fraction = (len(val_part) + 1) / len(train_part + val_part)  # the cut moves to the next line start
    loaded = corpus.load_corpus(
        DataCfg(path=str(path), tokenizer="bpe", vocab_size=300, val_fraction=val_fraction), run_dir=tmp_path / "run"
    )
    corpus.save_corpus(loaded, tmp_path / "run")
    vocab = json.loads((tmp_path / "run" / "tokenizer.json").read_text())["model"]["vocab"]
    assert any("king" in token for token in vocab)
    assert not any("quokka" in token or "zyzz" in token for token in vocab)
    # one document, ended by the tokenizer's end-of-text token; validation is the last val_fraction of its tokens
    eos = loaded.tokenizer.eos_id
    assert loaded.val_tokens[-1] == eos and eos not in np.asarray(loaded.train_tokens)
    total = loaded.num_train_tokens + loaded.num_val_tokens
    assert loaded.num_val_tokens == round(total * val_fraction)
    assert (
        loaded.tokenizer.decode(np.concatenate([loaded.train_tokens, loaded.val_tokens[:-1]])) == train_part + val_part
    )


def test_jsonl_documents_are_read_from_the_text_field(tmp_path):
    path = tmp_path / "d.jsonl"
    documents = [f"doc {i} " + "words " * 5 for i in range(40)]
    path.write_text("".join(json.dumps({"body": text}) + "\n" for text in documents))
    loaded = corpus.load_corpus(DataCfg(path=str(path), text_field="body", vocab_size=None), run_dir=None)
    found = []
    for split in ("train", "val"):
        tokens = np.asarray(getattr(loaded, f"{split}_tokens"))
        starts = loaded.document_starts(split)
        for begin, end in zip(starts, [*starts[1:], tokens.size], strict=True):
            assert tokens[end - 1] == loaded.tokenizer.eos_id  # each document ends with end-of-text
            found.append(loaded.tokenizer.decode(tokens[begin : end - 1]))
    assert sorted(found) == sorted(documents)


def test_pre_tokenized_corpus_splits_by_tokens(tmp_path):
    ids = (np.arange(500) % 256).astype(np.uint16)
    ids.tofile(tmp_path / "t.bin")
    cfg = DataCfg(path=str(tmp_path / "t.bin"), format="tokens_uint16", val_fraction=0.2)
    built = data.build(cfg, run_dir=tmp_path / "run", seed=0, batch_size=2)
    assert built.num_train_tokens == 400 and built.num_val_tokens == 100
    np.testing.assert_array_equal(built.corpus.val_tokens, ids[400:])
    assert next(built.train_iterator)["inputs"].dtype == np.int32
    user_error(
        lambda: corpus.load_corpus(dataclasses.replace(cfg, vocab_size=200), run_dir=None),
        "t.bin",
        "token id 255",
        "vocabulary size to at least 256",
        "(data.vocab_size)",
    )


def test_pre_tokenized_bpe_needs_its_tokenizer(tmp_path):
    np.save(tmp_path / "t.npy", np.arange(400, dtype=np.int32) % 280)
    cfg = DataCfg(path=str(tmp_path / "t.npy"), tokenizer="bpe", vocab_size=300)
    user_error(
        lambda: corpus.load_corpus(cfg, run_dir=None),
        "pre-tokenized",
        "tokenizer.json",
        "byte tokenizer",
        "(data.tokenizer)",
    )
    BPETokenizer.train(sample_text(300), 300).save(tmp_path)
    loaded = corpus.load_corpus(cfg, run_dir=tmp_path / "run")
    corpus.save_corpus(loaded, tmp_path / "run")
    assert loaded.tokenizer.name == "bpe" and (tmp_path / "run" / "tokenizer.json").is_file()


def test_corpus_shorter_than_one_sequence(tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("just a few words here\n" * 3)
    user_error(
        lambda: corpus.load_corpus(DataCfg(path=str(path), seq_len=64), run_dir=None),
        "short.txt",
        "too small",
        "seq_len=64",
        "at least 65",
        "(data.seq_len)",
    )
    user_error(
        lambda: corpus.load_corpus(DataCfg(path=str(path), seq_len=32, val_fraction=0.1), run_dir=None),
        "validation split has",
        "data.val_fraction",
    )


def test_bad_split_settings(tmp_path):
    user_error(
        lambda: corpus.load_corpus(DataCfg(val_fraction=0.0), run_dir=None), "val_fraction=0.0", "(data.val_fraction)"
    )
    user_error(lambda: corpus.load_corpus(DataCfg(seq_len=0), run_dir=None), "seq_len=0", "(data.seq_len)")


def test_a_raw_source_says_it_is_tokenized_and_what_was_skipped(tmp_path, capsys):
    """Preparing a raw data.path for training is announced (with progress lines while a large source
    is tokenized), and Parquet rows whose text is null are counted in a note, not skipped silently."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fp4lm.config import DataConfig

    texts = [sample_text(40), None, sample_text(40), None, sample_text(40)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "docs.parquet")
    cfg = dataclasses.replace(DataConfig(), path=str(tmp_path / "docs.parquet"), tokenizer="byte", seq_len=32)
    data.build(cfg, run_dir=None, seed=0, batch_size=2)
    out = capsys.readouterr().out
    assert f"data: tokenizing {tmp_path / 'docs.parquet'} into a token cache" in out
    assert f"data: note: skipped 2 Parquet rows of {tmp_path / 'docs.parquet'} whose text is null" in out
    data.build(cfg, run_dir=None, seed=0, batch_size=2)
    assert capsys.readouterr().out == ""  # the cache is reused: nothing to tokenize, nothing to say again
