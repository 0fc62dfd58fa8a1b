"""Hugging Face `tokenizers` tokenizers: any tokenizer.json, and the byte-level BPE fp4lm trains."""

from __future__ import annotations

import functools
import json
import os
import pathlib
from collections.abc import Iterable, Sequence

import numpy as np

from fp4lm.config import BPE_MIN_VOCAB_SIZE
from fp4lm.errors import UserError
from fp4lm.tokenizer.base import (
    BPE_MAX_TRAINING_CHARS,
    END_OF_TEXT,
    canonical_sha256,
    encode_in_pieces,
    envelope,
    hf_tokenizer_class,
    save_hf,
    tokenizer_config,
)


class HuggingFaceTokenizer:
    """A `tokenizers` library tokenizer (from any tokenizer.json). `name`: "bpe" when fp4lm trained it, else
    "huggingface". Text is encoded without added special tokens (no BOS/EOS around each piece)."""

    def __init__(
        self,
        hf_tokenizer,
        *,
        name: str = "huggingface",
        eos_id: int | None = None,
        bos_id: int | None = None,
        trained_vocab_size: int | None = None,
    ):
        self._tokenizer = hf_tokenizer
        self.name = name
        self.eos_id, self.bos_id = eos_id, bos_id
        self.trained_vocab_size = trained_vocab_size  # bpe: the size it was asked to learn (data.vocab_size)
        self.learned_vocab_size = int(hf_tokenizer.get_vocab_size(with_added_tokens=True))
        self.vocab_size = self.learned_vocab_size
        self._fingerprint: str | None = None

    legacy = False

    @functools.cached_property
    def hf_json(self) -> dict:
        return json.loads(self._tokenizer.to_str())

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:  # computed once: hashing a large vocabulary takes a moment
            self._fingerprint = canonical_sha256(
                {"tokenizer": self.hf_json, "eos_id": self.eos_id, "bos_id": self.bos_id}
            )
        return self._fingerprint

    def token_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def encode(self, text: str) -> np.ndarray:
        return encode_in_pieces(
            text, lambda pieces: [e.ids for e in self._tokenizer.encode_batch_fast(pieces, add_special_tokens=False)]
        )

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        known = ids[(ids >= 0) & (ids < self.learned_vocab_size)]
        return self._tokenizer.decode(known.tolist(), skip_special_tokens=True)  # as bytes: no text for EOS/BOS

    def to_json(self) -> str:
        extra = {"trained_vocab_size": self.trained_vocab_size} if self.trained_vocab_size is not None else {}
        return envelope(self.name, self.eos_id, self.bos_id, tokenizer=self.hf_json, **extra)

    def save(self, directory: str | os.PathLike) -> pathlib.Path:
        config = tokenizer_config(
            self.name,
            self._token(self.eos_id),
            self._token(self.bos_id),
            self.eos_id,
            self.bos_id,
            trained_vocab_size=self.trained_vocab_size,
        )
        return save_hf(directory, self._tokenizer.to_str(), config)

    def _token(self, token_id: int | None) -> str | None:
        return None if token_id is None else self._tokenizer.id_to_token(token_id)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size}, eos_id={self.eos_id})"


class BPETokenizer(HuggingFaceTokenizer):
    """Byte-level BPE (GPT-2 style pre-tokenizer and decoder) trained by fp4lm, with `<|endoftext|>` as its
    end-of-text token."""

    def __init__(self, hf_tokenizer, trained_vocab_size: int | None = None, *, eos_id: int | None = None):
        super().__init__(hf_tokenizer, name="bpe", eos_id=eos_id, trained_vocab_size=trained_vocab_size)

    @classmethod
    def train(cls, text: str, vocab_size: int, *, max_training_chars: int = BPE_MAX_TRAINING_CHARS):
        """Learns merges from `text` (at most `max_training_chars`, sampled evenly, deterministic)."""
        return cls.train_from_texts([even_sample(text, max_training_chars)], vocab_size)

    @classmethod
    def train_from_texts(cls, texts: Iterable[str], vocab_size: int):
        """Learns `vocab_size` tokens (the 256 bytes, `<|endoftext|>` and merges) from the lines of `texts`."""
        from tokenizers import decoders, models, pre_tokenizers, trainers

        # Config validation refuses this for the CLI; this guard is for library callers.
        if vocab_size < BPE_MIN_VOCAB_SIZE:
            raise UserError(
                f"vocab_size={vocab_size} is too small for BPE; use at least {BPE_MIN_VOCAB_SIZE} (e.g. 2048)",
                settings=("vocab_size",),
            )
        hf_tokenizer = hf_tokenizer_class()(models.BPE())
        hf_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf_tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            special_tokens=[END_OF_TEXT],
            show_progress=False,
        )
        lines = (line for text in texts for line in text.splitlines(keepends=True))
        hf_tokenizer.train_from_iterator(lines, trainer=trainer)
        return cls(hf_tokenizer, vocab_size, eos_id=hf_tokenizer.token_to_id(END_OF_TEXT))


def even_sample(text: str, max_chars: int) -> str:
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
