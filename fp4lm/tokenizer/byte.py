"""The byte tokenizer: UTF-8 bytes as ids 0-255 and end-of-text 256 (without it for data.vocab_size=256)."""

from __future__ import annotations

import functools
import json
import os
import pathlib
from collections.abc import Sequence

import numpy as np

from fp4lm.config import BYTE_VOCAB_SIZE
from fp4lm.tokenizer.base import (
    BYTE_EOS_ID,
    END_OF_TEXT,
    LEGACY_FORMAT,
    TOKENIZER_FILE,
    canonical_sha256,
    envelope,
    hf_tokenizer_class,
    save_hf,
    special_token_dict,
    tokenizer_config,
    write_atomically,
)


def byte_to_unicode() -> dict[int, str]:
    """The byte-level convention of GPT-2-style tokenizers: each byte as one printable character. Bytes that
    are printable Latin-1 characters stand for themselves; the others take the characters from U+0100 on."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            mapping[byte] = chr(byte)
        else:
            mapping[byte] = chr(256 + extra)
            extra += 1
    return mapping


class ByteTokenizer:
    """UTF-8 bytes as tokens (ids 0-255, nothing unknown) and, unless `with_eos=False`, the end-of-text id 256."""

    name = "byte"
    bos_id: int | None = None

    def __init__(self, *, with_eos: bool = True):
        self.with_eos = with_eos
        self.vocab_size = BYTE_VOCAB_SIZE + 1 if with_eos else BYTE_VOCAB_SIZE
        self.eos_id: int | None = BYTE_EOS_ID if with_eos else None

    @property
    def legacy(self) -> bool:
        """A tokenizer without an end-of-text token is saved in fp4lm's one-file format, which says exactly that."""
        return not self.with_eos

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        byte_ids = ids[(ids >= 0) & (ids < 256)]  # the end-of-text id and padding ids have no bytes
        return byte_ids.astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    @functools.cached_property
    def hf_json(self) -> dict:
        """The same tokenizer as a standard `tokenizers` file: a byte-level BPE without merges whose ids are the
        byte values, and `<|endoftext|>` as id 256. Other tools encode text into the same ids with it."""
        vocab = {char: byte for byte, char in byte_to_unicode().items()}
        added = [{"id": BYTE_EOS_ID, **(special_token_dict(END_OF_TEXT) or {}), "special": True}]
        payload = {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": added if self.with_eos else [],
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
            "model": {
                "type": "BPE",
                "dropout": None,
                "unk_token": None,
                "fuse_unk": False,
                "vocab": vocab,
                "merges": [],
            },
        }
        return json.loads(hf_tokenizer_class().from_str(json.dumps(payload)).to_str())  # the library's own form

    @property
    def fingerprint(self) -> str:
        if self.legacy:
            return canonical_sha256(json.loads(self.to_json()))
        return canonical_sha256({"tokenizer": self.hf_json, "eos_id": self.eos_id, "bos_id": self.bos_id})

    def to_json(self) -> str:
        if self.legacy:
            return json.dumps({"format": LEGACY_FORMAT, "name": self.name, "vocab_size": self.vocab_size})
        return envelope(self.name, self.eos_id, self.bos_id, tokenizer=self.hf_json)

    def save(self, directory: str | os.PathLike) -> pathlib.Path:
        if self.legacy:
            return write_atomically(pathlib.Path(directory) / TOKENIZER_FILE, self.to_json())
        return save_hf(directory, json.dumps(self.hf_json), self._config())

    def _config(self) -> dict:
        return tokenizer_config("byte", END_OF_TEXT, None, self.eos_id, self.bos_id)

    def __repr__(self) -> str:
        return f"ByteTokenizer(vocab_size={self.vocab_size}, eos_id={self.eos_id})"
