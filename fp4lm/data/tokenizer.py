"""Tokenizers: bytes, a BPE trained on the run's data, any Hugging Face `tokenizer.json`, a SentencePiece model.

`data.tokenizer` (and `fp4lm prepare --tokenizer`) names one: `byte` (ids 0-255 and end-of-text 256; with
`data.vocab_size=256` no end-of-text), `bpe` (byte-level, trained once on the run's training text), or a PATH
(a tokenizer.json, a directory holding one, or a SentencePiece .model). All share one interface: `name`,
`vocab_size`, `eos_id`, `bos_id`, `fingerprint` (equal for tokenizers that give equal ids), `encode`, `decode`,
`to_json()` (kept in checkpoints) and `save(directory)`, which writes the standard files other tools read
(tokenizer.json or tokenizer.model, and tokenizer_config.json with fp4lm's ids under "fp4lm"; the 256-id byte
tokenizer as one file in fp4lm's own format). The model's vocabulary (`model_vocab_size`) is the tokenizer's,
or a larger `data.vocab_size`, padded to a multiple of `data.vocab_multiple`.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import pathlib
import typing
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import numpy as np

from fp4lm import extras
from fp4lm.config import BPE_MIN_VOCAB_SIZE, BYTE_VOCAB_SIZE, DEFAULT_BPE_VOCAB_SIZE, TokenizerKind
from fp4lm.errors import UserError
from fp4lm.jsonio import write_bytes_atomically

TOKENIZER_FILE = "tokenizer.json"  # the Hugging Face file (or, for the 256-id byte tokenizer, fp4lm's own format)
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SENTENCEPIECE_FILE = "tokenizer.model"
LEGACY_FORMAT = "fp4lm-tokenizer/1"  # the one-file format of the 256-id byte tokenizer
FORMAT = "fp4lm-tokenizer/2"
TOKENIZER_KEYWORDS = TOKENIZER_NAMES = typing.get_args(TokenizerKind)  # data.tokenizer's words; else a path
END_OF_TEXT = "<|endoftext|>"
BYTE_EOS_ID = BYTE_VOCAB_SIZE  # the byte tokenizer's end-of-text id, right after the 256 byte values
VOCAB_MULTIPLE = 128  # data.vocab_multiple's default
BPE_MAX_TRAINING_CHARS = 2_000_000
_ENCODE_CHUNK_CHARS = 1 << 18  # a long text is encoded in pieces of about this many characters ...
_ENCODE_BATCH = 4  # ... this many at a time, so memory follows the piece, not the document (issue 21)

# Special tokens that end or start a document in well-known tokenizers (GPT-2, Llama 3, SentencePiece models,
# Gemma), tried in order when the tokenizer.json has no tokenizer_config.json beside it that names them.
_EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>")
_BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "<|bos|>")


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


def _canonical_sha256(value: Any) -> str:
    """sha256 of `value` as JSON with sorted keys and no whitespace (the same value always hashes the same)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _byte_to_unicode() -> dict[int, str]:
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


def _hf_tokenizer_class():
    from tokenizers import Tokenizer as HFTokenizer

    return HFTokenizer


def _special_token_dict(token: str | None) -> dict | None:
    if token is None:
        return None
    return {"content": token, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}


# ------------------------------------------------------------------------------------------------- byte


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
        vocab = {char: byte for byte, char in _byte_to_unicode().items()}
        added = [{"id": BYTE_EOS_ID, **(_special_token_dict(END_OF_TEXT) or {}), "special": True}]
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
        return json.loads(_hf_tokenizer_class().from_str(json.dumps(payload)).to_str())  # the library's own form

    @property
    def fingerprint(self) -> str:
        if self.legacy:
            return _canonical_sha256(json.loads(self.to_json()))
        return _canonical_sha256({"tokenizer": self.hf_json, "eos_id": self.eos_id, "bos_id": self.bos_id})

    def to_json(self) -> str:
        if self.legacy:
            return json.dumps({"format": LEGACY_FORMAT, "name": self.name, "vocab_size": self.vocab_size})
        return _envelope(self.name, self.eos_id, self.bos_id, tokenizer=self.hf_json)

    def save(self, directory: str | os.PathLike) -> pathlib.Path:
        if self.legacy:
            return _write_atomically(pathlib.Path(directory) / TOKENIZER_FILE, self.to_json())
        return _save_hf(directory, json.dumps(self.hf_json), self._config())

    def _config(self) -> dict:
        return _tokenizer_config("byte", END_OF_TEXT, None, self.eos_id, self.bos_id)

    def __repr__(self) -> str:
        return f"ByteTokenizer(vocab_size={self.vocab_size}, eos_id={self.eos_id})"


# ------------------------------------------------------------------------------------- Hugging Face / BPE


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
            self._fingerprint = _canonical_sha256(
                {"tokenizer": self.hf_json, "eos_id": self.eos_id, "bos_id": self.bos_id}
            )
        return self._fingerprint

    def token_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def encode(self, text: str) -> np.ndarray:
        return _encode_in_pieces(
            text, lambda pieces: [e.ids for e in self._tokenizer.encode_batch_fast(pieces, add_special_tokens=False)]
        )

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        known = ids[(ids >= 0) & (ids < self.learned_vocab_size)]
        return self._tokenizer.decode(known.tolist(), skip_special_tokens=True)  # as bytes: no text for EOS/BOS

    def to_json(self) -> str:
        extra = {"trained_vocab_size": self.trained_vocab_size} if self.trained_vocab_size is not None else {}
        return _envelope(self.name, self.eos_id, self.bos_id, tokenizer=self.hf_json, **extra)

    def save(self, directory: str | os.PathLike) -> pathlib.Path:
        config = _tokenizer_config(
            self.name,
            self._token(self.eos_id),
            self._token(self.bos_id),
            self.eos_id,
            self.bos_id,
            trained_vocab_size=self.trained_vocab_size,
        )
        return _save_hf(directory, self._tokenizer.to_str(), config)

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
        return cls.train_from_texts([_even_sample(text, max_training_chars)], vocab_size)

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
        hf_tokenizer = _hf_tokenizer_class()(models.BPE())
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


# ------------------------------------------------------------------------------------------ SentencePiece


def _sentencepiece_module():
    return extras.require("sentencepiece", "sentencepiece", purpose="a SentencePiece tokenizer (.model)")


class SentencePieceTokenizer:
    """A SentencePiece model (the `sentencepiece` extra). Its own BOS/EOS ids; unknown text maps to its unk id."""

    name = "sentencepiece"
    legacy = False

    def __init__(self, model_bytes: bytes, *, origin: str = "SentencePiece model"):
        spm = _sentencepiece_module()
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
        return _canonical_sha256({"sentencepiece": model, "eos_id": self.eos_id, "bos_id": self.bos_id})

    def encode(self, text: str) -> np.ndarray:
        return _encode_in_pieces(text, self._processor.encode)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        return self._processor.decode(ids[(ids >= 0) & (ids < self.vocab_size)].tolist())

    def to_json(self) -> str:
        model = base64.b64encode(self.model_bytes).decode("ascii")
        return _envelope(self.name, self.eos_id, self.bos_id, sentencepiece_model=model)

    def save(self, directory: str | os.PathLike) -> pathlib.Path:
        directory = pathlib.Path(directory)
        path = _write_atomically(directory / SENTENCEPIECE_FILE, self.model_bytes)
        token = self._processor.id_to_piece
        config = _tokenizer_config(
            self.name,
            None if self.eos_id is None else token(self.eos_id),
            None if self.bos_id is None else token(self.bos_id),
            self.eos_id,
            self.bos_id,
        )
        _write_atomically(directory / TOKENIZER_CONFIG_FILE, json.dumps(config, indent=2))
        return path

    def __repr__(self) -> str:
        return f"SentencePieceTokenizer(vocab_size={self.vocab_size}, eos_id={self.eos_id}, bos_id={self.bos_id})"


def _id_or_none(token_id: int) -> int | None:
    return None if token_id < 0 else int(token_id)


# ------------------------------------------------------------------------------------------ saved forms


def _envelope(kind: str, eos_id: int | None, bos_id: int | None, **content) -> str:
    """The one-string form `to_json()` returns (kept in checkpoints): fp4lm's kind and ids around the standard
    content (the `tokenizers` JSON as "tokenizer", or a SentencePiece model in base64)."""
    return json.dumps({"format": FORMAT, "kind": kind, "eos_id": eos_id, "bos_id": bos_id, **content})


def _tokenizer_config(
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


def _save_hf(directory: str | os.PathLike, tokenizer_json: str, config: dict) -> pathlib.Path:
    directory = pathlib.Path(directory)
    path = _write_atomically(directory / TOKENIZER_FILE, tokenizer_json)
    _write_atomically(directory / TOKENIZER_CONFIG_FILE, json.dumps(config, indent=2))
    return path


def _write_atomically(path: pathlib.Path, content: str | bytes) -> pathlib.Path:
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


def _encode_in_pieces(text: str, encode_batch) -> np.ndarray:
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


# ------------------------------------------------------------------------------------------ reading


def tokenizer_from_json(text: str, *, origin: str = "tokenizer JSON") -> Tokenizer:
    """The tokenizer described by `to_json()` output (either format)."""
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{origin} is not valid JSON ({exc.msg}); delete it to train a new tokenizer") from None
    if isinstance(payload, dict) and payload.get("format") == FORMAT:
        return _from_envelope(payload, origin)
    if not isinstance(payload, dict) or payload.get("format") != LEGACY_FORMAT:
        raise UserError(f"{origin} is not an fp4lm tokenizer file ({FORMAT}); delete it or use another run dir")
    if payload.get("name") == "byte":
        return ByteTokenizer(with_eos=False)
    raise UserError(
        f"{origin} holds a {payload.get('name')!r} tokenizer of an older fp4lm (without an end-of-text token), "
        "which this version does not read; use a new run directory"
    )


def _from_envelope(payload: dict, origin: str) -> Tokenizer:
    kind, eos_id, bos_id = payload.get("kind"), payload.get("eos_id"), payload.get("bos_id")
    try:
        if kind == "byte":
            return ByteTokenizer(with_eos=eos_id is not None)
        if kind == "sentencepiece":
            return SentencePieceTokenizer(base64.b64decode(payload["sentencepiece_model"]), origin=origin)
        if kind in ("bpe", "huggingface") and isinstance(payload.get("tokenizer"), dict):
            hf_tokenizer = _hf_tokenizer_class().from_str(json.dumps(payload["tokenizer"]))
            return _hf_from_ids(hf_tokenizer, kind, eos_id, bos_id, payload.get("trained_vocab_size"))
    except UserError:
        raise
    except Exception as exc:
        raise UserError(
            f"{origin} holds a broken tokenizer ({_first_line(exc)}); delete it or use another run dir"
        ) from None
    raise UserError(f"{origin} names an unknown tokenizer kind {kind!r}; delete it or use another run dir")


def _hf_from_ids(hf_tokenizer, kind: str, eos_id, bos_id, trained_vocab_size) -> HuggingFaceTokenizer:
    if kind == "bpe":
        return BPETokenizer(hf_tokenizer, trained_vocab_size, eos_id=eos_id)
    return HuggingFaceTokenizer(hf_tokenizer, eos_id=eos_id, bos_id=bos_id)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def load_tokenizer(directory: str | os.PathLike) -> Tokenizer | None:
    """The tokenizer saved in `directory` (a run directory), or None when there is none."""
    directory = pathlib.Path(directory)
    config_path, json_path = directory / TOKENIZER_CONFIG_FILE, directory / TOKENIZER_FILE
    ours = _fp4lm_section(config_path)
    if ours is not None and ours.get("kind") == "sentencepiece":
        return _open_sentencepiece(directory / SENTENCEPIECE_FILE)
    if not json_path.is_file():
        return None
    return _open_tokenizer_json(json_path, ours)  # without fp4lm's tokenizer_config.json: either format


def _fp4lm_section(config_path: pathlib.Path) -> dict | None:
    """The "fp4lm" part of a tokenizer_config.json fp4lm wrote, or None."""
    config = _read_json_dict(config_path)
    ours = config.get("fp4lm") if config else None
    return ours if isinstance(ours, dict) and ours.get("format") == FORMAT else None


def _read_json_dict(path: pathlib.Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def open_tokenizer(
    spec: str | os.PathLike, *, vocab_size: int | None = None, training_text: str | None = None
) -> Tokenizer:
    """The tokenizer `spec` names: "byte", "bpe" (trained on `training_text` with `vocab_size` tokens, default
    2048), or the path of a tokenizer.json, a directory holding one (or a run directory), or a SentencePiece
    .model. `vocab_size=256` with "byte" gives the original 256-id byte vocabulary (no end-of-text token)."""
    spec = os.fspath(spec)
    if spec == "byte":
        return ByteTokenizer(with_eos=vocab_size != BYTE_VOCAB_SIZE)
    if spec == "bpe":
        if not training_text or not training_text.strip():
            raise UserError(
                "no text to train the BPE tokenizer on; use the byte tokenizer, a tokenizer file, or a text corpus",
                settings=("tokenizer",),
            )
        return BPETokenizer.train(training_text, vocab_size or DEFAULT_BPE_VOCAB_SIZE)
    return _open_path(pathlib.Path(spec).expanduser())


def _open_path(path: pathlib.Path) -> Tokenizer:
    hint = "give byte, bpe, or the path of a tokenizer.json or SentencePiece .model"
    if not path.exists():
        raise UserError(f"tokenizer {path} does not exist; {hint}", settings=("tokenizer",))
    if path.is_dir():
        saved = load_tokenizer(path)
        if saved is not None:
            return saved
        if (path / SENTENCEPIECE_FILE).is_file():
            return _open_sentencepiece(path / SENTENCEPIECE_FILE)
        raise UserError(
            f"directory {path} holds no {TOKENIZER_FILE} or {SENTENCEPIECE_FILE}; {hint}", settings=("tokenizer",)
        )
    if path.suffix == ".model":
        return _open_sentencepiece(path)
    ours = _fp4lm_section(path.parent / TOKENIZER_CONFIG_FILE) if path.name == TOKENIZER_FILE else None
    return _open_tokenizer_json(path, ours)


def _open_sentencepiece(path: pathlib.Path) -> SentencePieceTokenizer:
    _sentencepiece_module()  # a missing package is named before the file is read
    try:
        model_bytes = path.read_bytes()
    except OSError as exc:
        raise UserError(
            f"cannot read tokenizer {path} ({exc.strerror or exc}); check the path", settings=("tokenizer",)
        ) from None
    return SentencePieceTokenizer(model_bytes, origin=str(path))


def _open_tokenizer_json(path: pathlib.Path, ours: dict | None) -> Tokenizer:
    """A tokenizer.json: fp4lm's one-file format (the 256-id byte tokenizer), or the `tokenizers` library's (with
    fp4lm's tokenizer_config.json section `ours`, or otherwise with its end/start tokens found as `_special_ids`
    says)."""
    try:
        text = path.read_text(encoding="utf-8")
        payload = json.loads(text)
    except OSError as exc:
        raise UserError(
            f"cannot read tokenizer {path} ({exc.strerror or exc}); check the path", settings=("tokenizer",)
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise UserError(
            f"tokenizer {path} is not JSON, so not a tokenizer.json; give a Hugging Face tokenizer.json, "
            "a SentencePiece .model, byte or bpe",
            settings=("tokenizer",),
        ) from None
    if isinstance(payload, dict) and payload.get("format") in (LEGACY_FORMAT, FORMAT):
        return tokenizer_from_json(text, origin=str(path))
    if not isinstance(payload, dict) or not isinstance(payload.get("model"), dict):
        raise UserError(
            f'tokenizer {path} is JSON but not a tokenizer (no "model" section); give a Hugging Face '
            "tokenizer.json, a SentencePiece .model, byte or bpe",
            settings=("tokenizer",),
        )
    try:
        hf_tokenizer = _hf_tokenizer_class().from_str(text)
    except Exception as exc:  # the tokenizers library raises plain Exception with serde's message
        raise UserError(
            f"tokenizer {path} is not a usable tokenizer.json ({_first_line(exc)}); re-save it with the "
            "tokenizers library, or give another tokenizer",
            settings=("tokenizer",),
        ) from None
    if ours is not None:
        if ours.get("kind") == "byte":
            return ByteTokenizer(with_eos=ours.get("eos_id") is not None)
        kind = "bpe" if ours.get("kind") == "bpe" else "huggingface"
        return _hf_from_ids(hf_tokenizer, kind, ours.get("eos_id"), ours.get("bos_id"), ours.get("trained_vocab_size"))
    eos_id, bos_id = _special_ids(hf_tokenizer, _read_json_dict(path.parent / TOKENIZER_CONFIG_FILE))
    return HuggingFaceTokenizer(hf_tokenizer, eos_id=eos_id, bos_id=bos_id)


def _special_ids(hf_tokenizer, config: dict | None) -> tuple[int | None, int | None]:
    """(eos_id, bos_id): the tokens a Hugging Face tokenizer_config.json beside the file names, else the first
    of the well-known names the vocabulary has. A BOS equal to the EOS (GPT-2) counts as no BOS."""

    def named(key: str) -> int | None:
        token = (config or {}).get(key)
        if isinstance(token, dict):
            token = token.get("content")
        return hf_tokenizer.token_to_id(token) if isinstance(token, str) else None

    def first_known(names: Sequence[str]) -> int | None:
        return next((i for name in names if (i := hf_tokenizer.token_to_id(name)) is not None), None)

    eos_id = named("eos_token")
    eos_id = first_known(_EOS_NAMES) if eos_id is None else eos_id
    bos_id = named("bos_token")
    bos_id = first_known(_BOS_NAMES) if bos_id is None else bos_id
    return eos_id, (None if bos_id == eos_id else bos_id)


# ------------------------------------------------------------------------------ the run's tokenizer


def is_tokenizer_path(spec: str) -> bool:
    """Whether `data.tokenizer` names a file or directory (anything but the keywords byte and bpe)."""
    return spec not in TOKENIZER_KEYWORDS


def model_vocab_size(tokenizer: Tokenizer, vocab_size: int | None = None, multiple: int = VOCAB_MULTIPLE) -> int:
    """The model's vocabulary (embedding rows, LM head columns): the tokenizer's, or `vocab_size` (data.vocab_size)
    when larger (for a BPE fp4lm trained, by default the size it was asked to learn, so that the plan made before
    training, `planned_model_vocab_size`, holds), rounded up to a multiple of `multiple`. A `vocab_size` smaller
    than the tokenizer's is refused. The 256-id byte tokenizer (fp4lm's own format) keeps its 256 (unpadded)."""
    if vocab_size is not None and vocab_size < tokenizer.vocab_size:
        raise UserError(
            f"vocab_size={vocab_size} is smaller than the {tokenizer.name} tokenizer's vocabulary "
            f"({tokenizer.vocab_size} tokens); leave the vocabulary size unset (the model follows the tokenizer) "
            f"or set it to at least {tokenizer.vocab_size}",
            settings=("vocab_size",),
        )
    trained = getattr(tokenizer, "trained_vocab_size", None)  # a BPE fp4lm trained: the size it was asked for
    size = max(tokenizer.vocab_size, vocab_size or trained or 0)
    if getattr(tokenizer, "legacy", False):
        return size
    return -(-size // multiple) * multiple


def check_tokenizer_matches(tokenizer: Tokenizer, name: str, vocab_size: int | None, origin: str) -> None:
    """A saved tokenizer must be the one the config asks for: the same kind (byte, bpe), for bpe the same
    training size when one is given, for a path the same fingerprint as the file's."""
    if is_tokenizer_path(name):
        if not pathlib.Path(name).expanduser().exists():
            return  # the file is gone (moved, deleted): the copy saved with the run is the run's tokenizer
        wanted = open_tokenizer(name)
        if wanted.fingerprint != tokenizer.fingerprint:
            raise UserError(
                f"{origin} was made with another tokenizer ({tokenizer.name}, vocab {tokenizer.vocab_size}) than "
                f"{name} ({wanted.name}, vocab {wanted.vocab_size}); use the run's tokenizer or a new run directory",
                settings=("tokenizer", "run_dir"),
            )
        return
    trained = getattr(tokenizer, "trained_vocab_size", None)
    if name == "byte":  # a saved 256-id byte tokenizer fits any vocabulary size
        same = tokenizer.name == name and not (vocab_size == BYTE_VOCAB_SIZE and tokenizer.eos_id is not None)
    else:
        same = tokenizer.name == name and (vocab_size is None or trained is None or trained == vocab_size)
    if not same:
        size = trained or tokenizer.vocab_size
        raise UserError(
            f"{origin} was made with tokenizer {tokenizer.name} (vocab {size}), "
            f"but this run asks for {name} (vocab {vocab_size}); set tokenizer={tokenizer.name} "
            f"vocab_size={size} or use a new run directory",
            settings=("tokenizer", "vocab_size", "run_dir"),
        )


def load_or_train_tokenizer(
    kind: str, vocab_size: int | None, run_dir: str | os.PathLike | None, training_text: str | None
) -> Tokenizer:
    """The run's tokenizer: loaded from `run_dir` when saved there (and checked against the request),
    otherwise opened or made (BPE: trained on `training_text`) and saved into `run_dir` (if not None)."""
    if run_dir is not None:
        saved = load_tokenizer(run_dir)
        if saved is not None:
            check_tokenizer_matches(saved, kind, vocab_size, f"run dir {run_dir}")
            return saved
    tokenizer = open_tokenizer(kind, vocab_size=vocab_size, training_text=training_text)
    if run_dir is not None:
        tokenizer.save(run_dir)
    return tokenizer


def planned_model_vocab_size(data_cfg) -> int:
    """The model's vocabulary as far as the config tells before the data is read (memory estimates, `fp4lm
    project`): a bpe tokenizer is taken to learn all of its `data.vocab_size`; a tokenizer file is opened (a
    missing or broken one is refused here, early)."""
    spec, vocab_size = data_cfg.tokenizer, data_cfg.vocab_size
    multiple = getattr(data_cfg, "vocab_multiple", VOCAB_MULTIPLE)
    if spec == "byte":
        return model_vocab_size(ByteTokenizer(with_eos=vocab_size != BYTE_VOCAB_SIZE), vocab_size, multiple)
    if spec == "bpe":
        return -(-(vocab_size or DEFAULT_BPE_VOCAB_SIZE) // multiple) * multiple
    path = pathlib.Path(spec).expanduser()
    stamp = (path.stat().st_mtime_ns, path.stat().st_size) if path.is_file() else None
    return model_vocab_size(_opened(str(path), stamp), vocab_size, multiple)


@functools.lru_cache(maxsize=4)
def _opened(path: str, stamp: tuple[int, int] | None) -> Tokenizer:
    """open_tokenizer(path), kept while the file is unchanged (`stamp`): estimates ask more than once."""
    del stamp  # part of the cache key only
    return open_tokenizer(path)


def saved_model_vocab_size(run_dir: str | os.PathLike, data_cfg) -> int:
    """The model vocabulary of the run in `run_dir` (`fp4lm eval`, `sample`, export read its checkpoints with it):
    from the tokenizer saved there, or as planned from `data_cfg` when there is none."""
    saved = load_tokenizer(run_dir)
    if saved is None:
        return planned_model_vocab_size(data_cfg)
    return model_vocab_size(saved, data_cfg.vocab_size, getattr(data_cfg, "vocab_multiple", VOCAB_MULTIPLE))
