"""Shared bits of the data tests: a stand-in for the config's data section, a UserError checker, and prepared
directories written from token arrays."""

from __future__ import annotations

import dataclasses
import os
import pathlib

import numpy as np
import pytest

from fp4lm.config import describe_error
from fp4lm.data.prepared import SPLITS, PreparedCorpus, token_dtype
from fp4lm.data.shard_writer import ShardWriter, make_manifest, shard_names, write_manifest
from fp4lm.errors import UserError


@dataclasses.dataclass(frozen=True)
class DataCfg:
    """The attributes fp4lm.data reads from config.data (the data code takes any object with them)."""

    path: str = "bundled:shakespeare"
    format: str = "auto"
    text_field: str = "text"
    tokenizer: str = "byte"
    vocab_size: int = 256
    seq_len: int = 16
    val_fraction: float = 0.1


def user_error(fn, *fragments: str) -> str:
    """Runs fn, expects a one-line UserError of the form "problem; fix" holding every fragment, as the
    user reads it: with the settings it names spelled as config keys (`describe_error`)."""
    with pytest.raises(UserError) as info:
        fn()
    message = describe_error(info.value)
    assert "\n" not in message, message
    assert "; " in message, f"no fix given: {message}"
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


def sample_text(lines: int = 200) -> str:
    """A small deterministic multi-line text with some repetition (so BPE finds merges)."""
    words = ["to", "be", "or", "not", "that", "is", "the", "question", "whether", "tis", "nobler"]
    return "".join(" ".join(words[(i * 7 + j) % len(words)] for j in range(i % 9 + 3)) + "\n" for i in range(lines))


def write_prepared_corpus(
    directory: str | os.PathLike,
    documents: dict[str, list[list[np.ndarray]]],
    *,
    tokenizer: dict,
    val_fraction: float = 0.0,
) -> PreparedCorpus:
    """A prepared directory from token arrays already made: `documents[split][shard]` is that shard's list of
    documents (each already ending with EOS as the tokenizer defines), for tests that tokenize themselves.
    `tokenizer` is the manifest's tokenizer entry."""
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(int(tokenizer["vocab_size"]))
    entries: dict[str, list[dict]] = {}
    for split in SPLITS:
        entries[split] = []
        for index, shard_documents in enumerate(documents.get(split, [])):
            writer = ShardWriter(directory, *shard_names(split, index), dtype)
            for doc in shard_documents:
                writer.add(np.asarray(doc))
            entries[split].append(writer.finish())
            os.replace(writer.tokens_path, directory / writer.file)
            os.replace(writer.docs_path, directory / writer.docs)
    manifest = make_manifest(tokenizer=tokenizer, dtype=dtype, val_fraction=val_fraction, sources=[], shards=entries)
    write_manifest(directory, manifest)
    return PreparedCorpus.open(directory)
