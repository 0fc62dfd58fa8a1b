"""Reading tokenizers back: fp4lm's saved forms, a tokenizer.json (with or without its tokenizer_config.json),
a SentencePiece .model, a directory holding one; `open_tokenizer` names what `data.tokenizer` asks for."""

from __future__ import annotations

import base64
import json
import os
import pathlib
from collections.abc import Sequence

from fp4lm.config import BYTE_VOCAB_SIZE, DEFAULT_BPE_VOCAB_SIZE
from fp4lm.errors import UserError
from fp4lm.tokenizer.base import (
    FORMAT,
    LEGACY_FORMAT,
    SENTENCEPIECE_FILE,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    Tokenizer,
    first_line,
    hf_tokenizer_class,
)
from fp4lm.tokenizer.byte import ByteTokenizer
from fp4lm.tokenizer.huggingface import BPETokenizer, HuggingFaceTokenizer
from fp4lm.tokenizer.sentencepiece import SentencePieceTokenizer, sentencepiece_module

# Special tokens that end or start a document in well-known tokenizers (GPT-2, Llama 3, SentencePiece models,
# Gemma), tried in order when the tokenizer.json has no tokenizer_config.json beside it that names them.
_EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>")
_BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "<|bos|>")


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
            hf_tokenizer = hf_tokenizer_class().from_str(json.dumps(payload["tokenizer"]))
            return _hf_from_ids(hf_tokenizer, kind, eos_id, bos_id, payload.get("trained_vocab_size"))
    except UserError:
        raise
    except Exception as exc:
        raise UserError(
            f"{origin} holds a broken tokenizer ({first_line(exc)}); delete it or use another run dir"
        ) from None
    raise UserError(f"{origin} names an unknown tokenizer kind {kind!r}; delete it or use another run dir")


def _hf_from_ids(hf_tokenizer, kind: str, eos_id, bos_id, trained_vocab_size) -> HuggingFaceTokenizer:
    if kind == "bpe":
        return BPETokenizer(hf_tokenizer, trained_vocab_size, eos_id=eos_id)
    return HuggingFaceTokenizer(hf_tokenizer, eos_id=eos_id, bos_id=bos_id)


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
    sentencepiece_module()  # a missing package is named before the file is read
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
        hf_tokenizer = hf_tokenizer_class().from_str(text)
    except Exception as exc:  # the tokenizers library raises plain Exception with serde's message
        raise UserError(
            f"tokenizer {path} is not a usable tokenizer.json ({first_line(exc)}); re-save it with the "
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
