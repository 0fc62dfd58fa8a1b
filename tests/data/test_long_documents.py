"""A long document is tokenized in pieces (memory follows the piece, not the document; bench/long_document.py),
and its ids are the ones the whole document would get."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fp4lm import tokenizer
from fp4lm.data import sources
from fp4lm.data.prepare import Options, prepare
from fp4lm.tokenizer import BPETokenizer, split_into_pieces
from tests.data.helpers_data import sample_text

CHUNK = 97  # characters per piece in these tests (1 << 18 in use)


def _documents() -> list[str]:
    text = sample_text(120)
    return [text, text.replace("\n", " "), "  ".join(text.split())]  # with newlines, without, double spaces


def test_pieces_cover_the_text_and_stay_bounded():
    for text in [*_documents(), "x" * 1000, ""]:
        pieces = split_into_pieces(text, CHUNK)
        assert "".join(pieces) == text
        assert all(0 < len(p) <= 2 * CHUNK for p in pieces)
        assert len(pieces) > 1 or len(text) <= 2 * CHUNK


@pytest.mark.parametrize("name", ["byte", "bpe"])
def test_prepared_ids_equal_whole_document_ids(name, tmp_path, monkeypatch):
    """Through prepare, JSONL documents and a text file cut into pieces of ~CHUNK characters at newlines (or
    spaces) get the ids of whole-document encoding, for the byte tokenizer and a byte-level BPE (whose
    pre-tokenizer splits before spaces)."""
    monkeypatch.setattr(tokenizer.base, "_ENCODE_CHUNK_CHARS", CHUNK)
    monkeypatch.setattr(sources, "TEXT_CHUNK_CHARS", CHUNK)
    documents = _documents()
    spec = "byte"
    if name == "bpe":
        BPETokenizer.train(sample_text(300), 400).save(tmp_path / "tok")
        spec = str(tmp_path / "tok" / "tokenizer.json")
        whole = tokenizer.open_tokenizer(spec)._tokenizer  # type: ignore[attr-defined]

        def expected(text: str) -> list[int]:
            return whole.encode(text, add_special_tokens=False).ids
    else:

        def expected(text: str) -> list[int]:
            return list(text.encode("utf-8"))

    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in documents))
    (tmp_path / "one.txt").write_text(documents[0])
    for source in ("docs.jsonl", "one.txt"):
        corpus = prepare(
            [str(tmp_path / source)],
            tokenizer=spec,
            out=tmp_path / f"out-{source}",
            options=Options(val_fraction=0.0),
            progress="off",
        )
        shards = corpus.split("train")
        ends = np.append(shards.document_starts[1:], shards.num_tokens)
        starts = shards.document_starts
        stored = [shards.gather(np.arange(a, b))[:-1].tolist() for a, b in zip(starts, ends, strict=True)]
        wanted = documents if source == "docs.jsonl" else documents[:1]
        assert stored == [expected(d) for d in wanted]
        assert all(len(expected(d)) > 3 * CHUNK // 5 for d in wanted)  # long enough to be cut into pieces
