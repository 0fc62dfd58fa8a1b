"""What every tokenizer shares: the interface, the saved forms (fp4lm's envelope, tokenizer_config.json),
atomic writes and encoding long texts in pieces so memory follows the piece, not the document."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import typing
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from fp4lm.config import BYTE_VOCAB_SIZE, TokenizerKind
from fp4lm.errors import UserError
from fp4lm.jsonio import write_bytes_atomically

TOKENIZER_FILE = "tokenizer.json"  # the Hugging Face file (or, for the 256-id byte tokenizer, fp4lm's own format)
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SENTENCEPIECE_FILE = "tokenizer.model"
LEGACY_FORMAT = "fp4lm-tokenizer/1"  # the one-file format of the 256-id byte tokenizer
FORMAT = "fp4lm-tokenizer/2"
TOKENIZER_KEYWORDS = typing.get_args(TokenizerKind)  # data.tokenizer's words; else a path
END_OF_TEXT = "<|endoftext|>"
BYTE_EOS_ID = BYTE_VOCAB_SIZE  # the byte tokenizer's end-of-text id, right after the 256 byte values
VOCAB_MULTIPLE = 128  # data.vocab_multiple's default
BPE_MAX_TRAINING_CHARS = 2_000_000
_ENCODE_CHUNK_CHARS = 1 << 18  # a long text is encoded in pieces of about this many characters ...
_ENCODE_BATCH = 4  # ... this many at a time, so memory follows the piece, not the document (issue 21)


class Tokenizer(Protocol):
    name: str
    vocab_size: int
    eos_id: int | None
    bos_id: int | None

    @property
    def fingerprint(self) -> str: ...

    def encode(self, text: str) -> np.ndarray: ...

    def decode(self, ids: Sequence[int] | np.ndarray) -> str: ...

    def to_json(self) -> str: ...

    def save(self, directory: str | os.PathLike) -> pathlib.Path: ...


def canonical_sha256(value: Any) -> str:
    """sha256 of `value` as JSON with sorted keys and no whitespace (the same value always hashes the same)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def hf_tokenizer_class():
    from tokenizers import Tokenizer as HFTokenizer

    return HFTokenizer


def special_token_dict(token: str | None) -> dict | None:
    if token is None:
        return None
    return {"content": token, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}


def envelope(kind: str, eos_id: int | None, bos_id: int | None, **content) -> str:
    """The one-string form `to_json()` returns (kept in checkpoints): fp4lm's kind and ids around the standard
    content (the `tokenizers` JSON as "tokenizer", or a SentencePiece model in base64)."""
    return json.dumps({"format": FORMAT, "kind": kind, "eos_id": eos_id, "bos_id": bos_id, **content})


def tokenizer_config(
    kind: str,
    eos_token: str | None,
    bos_token: str | None,
    eos_id: int | None,
    bos_id: int | None,
    *,
    trained_vocab_size: int | None = None,
) -> dict:
    """tokenizer_config.json: the keys Hugging Face tools read, and fp4lm's own under "fp4lm"."""
    config: dict[str, Any] = {}
    if eos_token is not None:
        config["eos_token"] = eos_token
    if bos_token is not None:
        config["bos_token"] = bos_token
    if kind != "sentencepiece":
        config["tokenizer_class"] = "PreTrainedTokenizerFast"  # what transformers uses for a bare tokenizer.json
    ours: dict[str, Any] = {"format": FORMAT, "kind": kind, "eos_id": eos_id, "bos_id": bos_id}
    if trained_vocab_size is not None:
        ours["trained_vocab_size"] = trained_vocab_size
    config["fp4lm"] = ours
    return config


def save_hf(directory: str | os.PathLike, tokenizer_json: str, config: dict) -> pathlib.Path:
    directory = pathlib.Path(directory)
    path = write_atomically(directory / TOKENIZER_FILE, tokenizer_json)
    write_atomically(directory / TOKENIZER_CONFIG_FILE, json.dumps(config, indent=2))
    return path


def write_atomically(path: pathlib.Path, content: str | bytes) -> pathlib.Path:
    """Writes via a temporary file and rename (fp4lm.jsonio), so a reader never sees half a file; a failure is
    one line naming the file."""
    try:
        write_bytes_atomically(path, content.encode("utf-8") if isinstance(content, str) else content)
    except OSError as exc:
        raise UserError(
            f"cannot write {path} ({exc.strerror or exc}); make the run directory writable or free disk space",
            settings=("run_dir",),
        ) from None
    return path


def encode_in_pieces(text: str, encode_batch) -> np.ndarray:
    """`text`'s ids, encoded `_ENCODE_BATCH` pieces (`split_into_pieces`) at a time by `encode_batch`."""
    pieces = split_into_pieces(text, _ENCODE_CHUNK_CHARS)
    ids = [
        np.asarray(each, dtype=np.int32)
        for first in range(0, len(pieces), _ENCODE_BATCH)
        for each in encode_batch(pieces[first : first + _ENCODE_BATCH])
    ]
    return np.concatenate(ids) if ids else np.zeros((0,), np.int32)


def split_into_pieces(text: str, chunk_chars: int) -> list[str]:
    """Consecutive pieces of about `chunk_chars` (at most twice that): each ends just after a newline, else
    (no newline near) just before a space that follows a non-space, else (no whitespace at all) at 2x. A
    tokenizer whose pre-tokenizer splits there (byte-level BPE, GPT-2's) gives the same ids as for the whole."""
    pieces, start = [], 0
    while start < len(text):
        end = start + 2 * chunk_chars
        if end < len(text):
            newline = text.find("\n", start + chunk_chars, end)
            space = text.find(" ", start + chunk_chars, end) if newline < 0 else -1
            while space > 0 and text[space - 1].isspace():
                space = text.find(" ", space + 1, end)
            end = newline + 1 if newline >= 0 else space if space > 0 else end
        pieces.append(text[start:end])
        start = end
    return pieces


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
