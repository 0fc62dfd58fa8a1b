"""SentencePiece models (the `sentencepiece` extra)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pathlib
from collections.abc import Sequence

import numpy as np

from fp4lm import extras
from fp4lm.errors import UserError
from fp4lm.tokenizer.base import (
    SENTENCEPIECE_FILE,
    TOKENIZER_CONFIG_FILE,
    canonical_sha256,
    encode_in_pieces,
    envelope,
    tokenizer_config,
    write_atomically,
)


def sentencepiece_module():
    return extras.require("sentencepiece", "sentencepiece", purpose="a SentencePiece tokenizer (.model)")


class SentencePieceTokenizer:
    """A SentencePiece model (the `sentencepiece` extra). Its own BOS/EOS ids; unknown text maps to its unk id."""

    name = "sentencepiece"
    legacy = False

    def __init__(self, model_bytes: bytes, *, origin: str = "SentencePiece model"):
        spm = sentencepiece_module()
        self.model_bytes = bytes(model_bytes)
        try:
            self._processor = spm.SentencePieceProcessor(model_proto=self.model_bytes)
        except Exception as exc:  # sentencepiece raises RuntimeError/OSError with its parser's message
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UserError(
                f"{origin} is not a SentencePiece model ({reason}); give the .model file the tokenizer was trained "
                "into, or a tokenizer.json",
                settings=("tokenizer",),
            ) from None
        self.vocab_size = int(self._processor.get_piece_size())
        self.eos_id = _id_or_none(self._processor.eos_id())
        bos = _id_or_none(self._processor.bos_id())
        self.bos_id = None if bos == self.eos_id else bos

    @property
    def fingerprint(self) -> str:
        model = hashlib.sha256(self.model_bytes).hexdigest()
        return canonical_sha256({"sentencepiece": model, "eos_id": self.eos_id, "bos_id": self.bos_id})

    def encode(self, text: str) -> np.ndarray:
        return encode_in_pieces(text, self._processor.encode)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        return self._processor.decode(ids[(ids >= 0) & (ids < self.vocab_size)].tolist())

    def to_json(self) -> str:
        model = base64.b64encode(self.model_bytes).decode("ascii")
        return envelope(self.name, self.eos_id, self.bos_id, sentencepiece_model=model)

    def save(self, directory: str | os.PathLike) -> pathlib.Path:
        directory = pathlib.Path(directory)
        path = write_atomically(directory / SENTENCEPIECE_FILE, self.model_bytes)
        token = self._processor.id_to_piece
        config = tokenizer_config(
            self.name,
            None if self.eos_id is None else token(self.eos_id),
            None if self.bos_id is None else token(self.bos_id),
            self.eos_id,
            self.bos_id,
        )
        write_atomically(directory / TOKENIZER_CONFIG_FILE, json.dumps(config, indent=2))
        return path

    def __repr__(self) -> str:
        return f"SentencePieceTokenizer(vocab_size={self.vocab_size}, eos_id={self.eos_id}, bos_id={self.bos_id})"


def _id_or_none(token_id: int) -> int | None:
    return None if token_id < 0 else int(token_id)
