"""Corpus loading: source -> tokenizer -> train/validation token streams (1-D int32 arrays).

The validation split is fixed and independent of the seed: the last `val_fraction` of the corpus.
For text sources the cut is made in the text, moved forward to the next line start, and the two parts
are tokenized separately, so the BPE tokenizer is trained on the training text only. For pre-tokenized
sources it is the last `val_fraction` of the token array.

Tokenized text is cached in RUN_DIR/data_cache/ (keyed by the source's paths, sizes and mtimes, the
tokenizer and the split), so a resumed run does not tokenize again. Loading only reads a run directory;
`save_corpus` leaves the tokenizer and the cache there (the trainer, once the run is accepted), so `fp4lm
eval` and `sample`, and a refused `fp4lm train`, never write into it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import uuid

import numpy as np

from fp4lm import resources
from fp4lm.data import readers
from fp4lm.data.tokenizer import (
    TOKENIZER_FILE,
    BPETokenizer,
    Tokenizer,
    check_tokenizer_matches,
    load_or_train_tokenizer,
    load_tokenizer,
    tokenizer_from_json,
)
from fp4lm.errors import UserError

CACHE_DIR = "data_cache"
_CACHE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Corpus:
    """A tokenized corpus. Token arrays are 1-D; integer dtype (int32 for text, as stored for token files)."""

    train_tokens: np.ndarray
    val_tokens: np.ndarray
    tokenizer: Tokenizer
    path: str
    format: str
    cache_key: str | None = None  # text sources: the name of their token cache (see save_corpus)

    @property
    def num_train_tokens(self) -> int:
        return int(self.train_tokens.size)

    @property
    def num_val_tokens(self) -> int:
        return int(self.val_tokens.size)


def split_text(text: str, val_fraction: float) -> tuple[str, str]:
    """(train, validation): the cut sits at (1 - val_fraction) of the text, moved to the next line start."""
    assert 0.0 < val_fraction < 1.0, val_fraction
    cut = int(len(text) * (1.0 - val_fraction))
    newline = text.find("\n", cut)
    if 0 <= newline < len(text) - 1:
        cut = newline + 1
    return text[:cut], text[cut:]


def split_tokens(tokens: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation): the last round(val_fraction * n) tokens are the validation split."""
    assert 0.0 < val_fraction < 1.0, val_fraction
    num_val = int(round(tokens.size * val_fraction))
    return tokens[: tokens.size - num_val], tokens[tokens.size - num_val :]


def load_corpus(data_cfg, *, run_dir: str | os.PathLike | None, tokenizer: Tokenizer | None = None) -> Corpus:
    """Reads, tokenizes and splits the source named by `data_cfg` (path, format, jsonl_field, tokenizer,
    vocab_size, seq_len, val_fraction). `run_dir` (or None): a run directory whose tokenizer and token cache
    are reused; nothing is written (see `save_corpus`). `tokenizer`: the one to use instead of the run
    directory's (e.g. a checkpoint's)."""
    if not 0.0 < data_cfg.val_fraction < 1.0:
        raise UserError(
            f"val_fraction={data_cfg.val_fraction} must lie in (0, 1); e.g. 0.02", settings=("val_fraction",)
        )
    if data_cfg.seq_len < 1:
        raise UserError(f"seq_len={data_cfg.seq_len} must be positive; e.g. 256", settings=("seq_len",))
    path = resources.data_file(data_cfg.path)  # a bundled corpus, or the path as given
    fmt = readers.resolve_format(path, data_cfg.format)
    saved = tokenizer or (load_tokenizer(run_dir) if run_dir is not None else None)
    if saved is not None:
        check_tokenizer_matches(saved, data_cfg.tokenizer, data_cfg.vocab_size, f"run dir {run_dir}")
    text = fmt not in readers.TOKEN_FORMATS
    cache_key = _cache_key(path, fmt, data_cfg, saved) if text and saved is not None else None
    cached = _read_cache(run_dir, cache_key) if cache_key is not None else None
    if cached is not None:
        assert saved is not None  # a cache key (hence a cache hit) needs the saved tokenizer
        corpus = Corpus(cached[0], cached[1], saved, str(path), fmt, cache_key)
    elif text:
        corpus = _load_text_corpus(path, fmt, data_cfg, saved)
    else:
        corpus = _load_token_corpus(path, fmt, data_cfg, saved)
    check_split_sizes(corpus, data_cfg.seq_len)
    if text and cached is None:
        key = cache_key or _cache_key(path, fmt, data_cfg, corpus.tokenizer)
        corpus = dataclasses.replace(corpus, cache_key=key)
    return corpus


def save_corpus(corpus: Corpus, run_dir: str | os.PathLike) -> None:
    """Leaves the corpus's tokenizer and (text sources) its token cache in `run_dir`, where a restarted run
    finds them; what is there already is kept. Call it only for a run that was accepted: a tokenizer kept
    from a refused attempt would be reused by the next one, whatever its data."""
    if not (pathlib.Path(run_dir) / TOKENIZER_FILE).is_file():
        corpus.tokenizer.save(run_dir)
    if corpus.cache_key is not None and not _cache_path(run_dir, corpus.cache_key).is_file():
        _write_cache(run_dir, corpus.cache_key, corpus.train_tokens, corpus.val_tokens)


def check_split_sizes(corpus: Corpus, seq_len: int) -> None:
    """Each split must hold at least one sequence of seq_len + 1 tokens."""
    need = seq_len + 1
    for split, tokens in (("training", corpus.train_tokens), ("validation", corpus.val_tokens)):
        if tokens.size < need:
            raise UserError(
                f"corpus {corpus.path} is too small: its {split} split has {tokens.size} tokens "
                f"(train {corpus.num_train_tokens}, validation {corpus.num_val_tokens}), but seq_len={seq_len} "
                f"needs at least {need} in each; use a larger corpus, a smaller sequence length"
                + (" or a larger validation fraction" if split == "validation" else ""),
                settings=("seq_len", "val_fraction") if split == "validation" else ("seq_len",),
            )


def _load_text_corpus(path: pathlib.Path, fmt: str, data_cfg, saved: Tokenizer | None) -> Corpus:
    documents = readers.read_documents(path, fmt, data_cfg.jsonl_field)
    train_text, val_text = split_text("\n\n".join(documents), data_cfg.val_fraction)
    tokenizer = saved or load_or_train_tokenizer(data_cfg.tokenizer, data_cfg.vocab_size, None, train_text)
    return Corpus(tokenizer.encode(train_text), tokenizer.encode(val_text), tokenizer, str(path), fmt)


def _load_token_corpus(path: pathlib.Path, fmt: str, data_cfg, saved: Tokenizer | None) -> Corpus:
    tokens = readers.read_token_array(path, fmt)
    readers.check_token_ids(tokens, data_cfg.vocab_size, path)
    tokenizer = saved or _tokenizer_for_token_file(path, data_cfg)
    train_tokens, val_tokens = split_tokens(tokens, data_cfg.val_fraction)
    return Corpus(train_tokens, val_tokens, tokenizer, str(path), fmt)


def _tokenizer_for_token_file(path: pathlib.Path, data_cfg) -> Tokenizer:
    """Pre-tokenized data cannot train a BPE; its tokenizer.json must sit beside it."""
    if data_cfg.tokenizer == "byte":
        return load_or_train_tokenizer(data_cfg.tokenizer, data_cfg.vocab_size, None, None)
    beside = path.parent / TOKENIZER_FILE
    if not beside.is_file():
        raise UserError(
            f"{path} is pre-tokenized, so the bpe tokenizer needs the tokenizer that made it; put its "
            f"tokenizer.json at {beside} (or use the byte tokenizer)",
            settings=("tokenizer",),
        )
    tokenizer = _read_foreign_tokenizer(beside, data_cfg.vocab_size)
    check_tokenizer_matches(tokenizer, data_cfg.tokenizer, data_cfg.vocab_size, str(beside))
    return tokenizer


def _read_foreign_tokenizer(path: pathlib.Path, vocab_size: int) -> Tokenizer:
    """An fp4lm tokenizer file, or a plain `tokenizers` JSON file (taken as BPE with `vocab_size`)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        payload = json.loads(text)
    except json.JSONDecodeError:
        payload = None
    if isinstance(payload, dict) and "model" in payload and "format" not in payload:
        try:
            return BPETokenizer.from_json_dict(payload, vocab_size)
        except UserError:
            raise
        except Exception as exc:  # tokenizers raises plain Exception
            raise UserError(f"{path} is not a usable tokenizers file ({exc}); re-save it") from None
    return tokenizer_from_json(text, origin=str(path))


def _cache_key(path: pathlib.Path, fmt: str, data_cfg, tokenizer: Tokenizer) -> str:
    parts = {
        "version": _CACHE_VERSION,
        "source": readers.source_fingerprint(path),
        "format": fmt,
        "field": data_cfg.jsonl_field,
        "val_fraction": data_cfg.val_fraction,
        "tokenizer": hashlib.sha256(tokenizer.to_json().encode()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def _cache_path(run_dir, key: str) -> pathlib.Path:
    return pathlib.Path(run_dir) / CACHE_DIR / f"tokens-{key}.npz"


def _read_cache(run_dir, key: str) -> tuple[np.ndarray, np.ndarray] | None:
    path = _cache_path(run_dir, key)
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as cached:
            return cached["train"], cached["val"]
    except (OSError, ValueError, KeyError, EOFError):
        return None  # a damaged cache is rebuilt


def _write_cache(run_dir, key: str, train_tokens: np.ndarray, val_tokens: np.ndarray) -> None:
    """Best effort: a failure to cache costs only time, never the run."""
    directory = pathlib.Path(run_dir) / CACHE_DIR
    final = directory / f"tokens-{key}.npz"
    temporary = directory / f".tokens-{key}.{uuid.uuid4().hex}.tmp.npz"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        np.savez(temporary, train=train_tokens, val=val_tokens)
        os.replace(temporary, final)
        for stale in directory.glob("tokens-*.npz"):
            if stale != final:
                stale.unlink(missing_ok=True)
    except OSError:
        if directory.is_dir():
            temporary.unlink(missing_ok=True)
