"""Tokenizers: byte-level (vocab 256) and byte-level BPE trained offline with `tokenizers`.

Both share one interface: `name` ("byte" | "bpe"), `vocab_size`, `encode(text) -> int32 array`,
`decode(ids) -> str`, `to_json()`, `save(directory)`. A run directory holds the tokenizer as
`tokenizer.json`, a small self-describing file:

    {"format": "fp4lm-tokenizer/1", "name": "bpe", "vocab_size": 2048, "tokenizers": {...}}

where "tokenizers" is the `tokenizers` library's own JSON (absent for the byte tokenizer). For BPE,
`vocab_size` is the requested size, which the model's embedding uses; on a very small corpus training
may learn fewer tokens (`learned_vocab_size`), and the ids above it are simply never produced.
"""

from __future__ import annotations

import json
import os
import pathlib
import typing
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from fp4lm.config import BPE_MIN_VOCAB_SIZE, BYTE_VOCAB_SIZE, TokenizerKind
from fp4lm.errors import UserError
from fp4lm.jsonio import write_text_atomically

TOKENIZER_FILE = "tokenizer.json"
FILE_FORMAT = "fp4lm-tokenizer/1"
TOKENIZER_NAMES = typing.get_args(TokenizerKind)
BPE_MAX_TRAINING_CHARS = 2_000_000
_ENCODE_CHUNK_CHARS = 1 << 18


class Tokenizer(Protocol):
    name: str
    vocab_size: int

    def encode(self, text: str) -> np.ndarray: ...

    def decode(self, ids: Sequence[int] | np.ndarray) -> str: ...

    def to_json(self) -> str: ...

    def save(self, directory: str | os.PathLike) -> pathlib.Path: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens: ids 0..255, no training, nothing unknown."""

    name = "byte"
    vocab_size = BYTE_VOCAB_SIZE

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        byte_ids = ids[(ids >= 0) & (ids < 256)]  # ids from a larger model vocabulary have no bytes
        return byte_ids.astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    def to_json(self) -> str:
        return json.dumps({"format": FILE_FORMAT, "name": self.name, "vocab_size": self.vocab_size})

    def save(self, directory: str | os.PathLike) -> pathlib.Path:
        return _write_atomically(pathlib.Path(directory) / TOKENIZER_FILE, self.to_json())

    def __repr__(self) -> str:
        return "ByteTokenizer(vocab_size=256)"


class BPETokenizer:
    """Byte-level BPE (GPT-2 style pre-tokenizer and decoder), trained with the `tokenizers` library."""

    name = "bpe"

    def __init__(self, hf_tokenizer, vocab_size: int):
        self._tokenizer = hf_tokenizer
        self.vocab_size = int(vocab_size)
        self.learned_vocab_size = int(hf_tokenizer.get_vocab_size())
        if self.learned_vocab_size > self.vocab_size:
            raise UserError(
                f"the BPE tokenizer has {self.learned_vocab_size} tokens, more than vocab_size={self.vocab_size}; "
                f"set the vocabulary size to {self.learned_vocab_size} or more",
                settings=("vocab_size",),
            )

    @classmethod
    def train(cls, text: str, vocab_size: int, *, max_training_chars: int = BPE_MAX_TRAINING_CHARS):
        """Learns merges from `text` (at most `max_training_chars`, sampled evenly, deterministic)."""
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers

        # Config validation refuses this for the CLI; this guard is for library callers of train(), which
        # get no Config (tests/test_configs.py calls it directly).
        if vocab_size < BPE_MIN_VOCAB_SIZE:
            raise UserError(
                f"vocab_size={vocab_size} is too small for BPE; use at least {BPE_MIN_VOCAB_SIZE} (e.g. 2048)",
                settings=("vocab_size",),
            )
        hf_tokenizer = HFTokenizer(models.BPE())
        hf_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf_tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        sample = _even_sample(text, max_training_chars)
        hf_tokenizer.train_from_iterator(sample.splitlines(keepends=True), trainer=trainer)
        return cls(hf_tokenizer, vocab_size)

    @classmethod
    def from_json_dict(cls, payload: dict, vocab_size: int):
        from tokenizers import Tokenizer as HFTokenizer

        return cls(HFTokenizer.from_str(json.dumps(payload)), vocab_size)

    def encode(self, text: str) -> np.ndarray:
        chunks = _split_at_newlines(text, _ENCODE_CHUNK_CHARS)
        if not chunks:
            return np.zeros((0,), np.int32)
        encodings = self._tokenizer.encode_batch_fast(chunks, add_special_tokens=False)
        return np.concatenate([np.asarray(e.ids, dtype=np.int32) for e in encodings])

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        known = ids[(ids >= 0) & (ids < self.learned_vocab_size)]
        return self._tokenizer.decode(known.tolist(), skip_special_tokens=False)

    def to_json(self) -> str:
        payload = json.loads(self._tokenizer.to_str())
        return json.dumps(
            {"format": FILE_FORMAT, "name": self.name, "vocab_size": self.vocab_size, "tokenizers": payload}
        )

    def save(self, directory: str | os.PathLike) -> pathlib.Path:
        return _write_atomically(pathlib.Path(directory) / TOKENIZER_FILE, self.to_json())

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size}, learned={self.learned_vocab_size})"


def _even_sample(text: str, max_chars: int) -> str:
    """`text` itself if short enough, else 64 evenly spaced line-aligned pieces totalling ~max_chars."""
    if len(text) <= max_chars:
        return text
    pieces, piece_chars = 64, max_chars // 64
    stride = len(text) // pieces
    out = []
    for k in range(pieces):
        start = k * stride
        if k:
            newline = text.find("\n", start)
            start = newline + 1 if 0 <= newline < start + stride else start
        end = text.find("\n", start + piece_chars)
        out.append(text[start : (end + 1 if end >= 0 else len(text))])
    return "".join(out)


def _split_at_newlines(text: str, chunk_chars: int) -> list[str]:
    """Consecutive pieces of about chunk_chars, each ending just after a newline (the last excepted)."""
    chunks, start = [], 0
    while start < len(text):
        newline = text.find("\n", start + chunk_chars)
        end = len(text) if newline < 0 else newline + 1
        chunks.append(text[start:end])
        start = end
    return chunks


def _write_atomically(path: pathlib.Path, content: str) -> pathlib.Path:
    """Writes via a temporary file and rename, so a reader never sees half a file."""
    try:
        write_text_atomically(path, content)
    except OSError as exc:
        raise UserError(
            f"cannot write {path} ({exc.strerror or exc}); make the run directory writable or free disk space",
            settings=("run_dir",),
        ) from None
    return path


def tokenizer_from_json(text: str, *, origin: str = "tokenizer JSON") -> Tokenizer:
    """The tokenizer described by `to_json()` output."""
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{origin} is not valid JSON ({exc.msg}); delete it to train a new tokenizer") from None
    if not isinstance(payload, dict) or payload.get("format") != FILE_FORMAT:
        raise UserError(f"{origin} is not an fp4lm tokenizer file ({FILE_FORMAT}); delete it or use another run dir")
    if payload.get("name") == "byte":
        return ByteTokenizer()
    if payload.get("name") == "bpe" and isinstance(payload.get("tokenizers"), dict):
        try:
            return BPETokenizer.from_json_dict(payload["tokenizers"], int(payload["vocab_size"]))
        except Exception as exc:  # the tokenizers library raises plain Exception on bad JSON
            raise UserError(f"{origin} holds a broken BPE tokenizer ({exc}); delete it to train a new one") from None
    raise UserError(f"{origin} names an unknown tokenizer {payload.get('name')!r}; delete it or use another run dir")


def load_tokenizer(directory: str | os.PathLike) -> Tokenizer | None:
    """The tokenizer saved in `directory`, or None when there is none."""
    path = pathlib.Path(directory) / TOKENIZER_FILE
    if not path.is_file():
        return None
    return tokenizer_from_json(path.read_text(encoding="utf-8"), origin=str(path))


def check_tokenizer_matches(tokenizer: Tokenizer, name: str, vocab_size: int, origin: str) -> None:
    """A saved tokenizer must be the one the config asks for (byte: any vocab_size >= 256 fits)."""
    same = tokenizer.name == name and (name == "byte" or tokenizer.vocab_size == vocab_size)
    if not same:
        raise UserError(
            f"{origin} was made with tokenizer {tokenizer.name} (vocab {tokenizer.vocab_size}), "
            f"but this run asks for {name} (vocab {vocab_size}); set tokenizer={tokenizer.name} "
            f"vocab_size={tokenizer.vocab_size} or use a new run directory",
            settings=("tokenizer", "vocab_size", "run_dir"),
        )


def load_or_train_tokenizer(
    kind: str, vocab_size: int, run_dir: str | os.PathLike | None, training_text: str | None
) -> Tokenizer:
    """The run's tokenizer: loaded from `run_dir` when saved there (and checked against the request),
    otherwise made (BPE: trained on `training_text`) and saved into `run_dir` (if not None)."""
    if kind not in TOKENIZER_NAMES:
        raise UserError(
            f"tokenizer {kind!r} is unknown; use one of {', '.join(TOKENIZER_NAMES)}", settings=("tokenizer",)
        )
    if run_dir is not None:
        saved = load_tokenizer(run_dir)
        if saved is not None:
            check_tokenizer_matches(saved, kind, vocab_size, f"run dir {run_dir}")
            return saved
    if kind == "byte":
        tokenizer: Tokenizer = ByteTokenizer()
    else:
        if not training_text or not training_text.strip():
            raise UserError(
                "no text to train the BPE tokenizer on; use the byte tokenizer or a text corpus",
                settings=("tokenizer",),
            )
        tokenizer = BPETokenizer.train(training_text, vocab_size)
    if run_dir is not None:
        tokenizer.save(run_dir)
    return tokenizer
