"""Corpus loading: source -> tokenizer -> train/validation token streams (1-D int32 arrays).

The validation split is fixed and independent of the seed:
- A raw source of several documents (JSONL lines, Parquet rows, the files of a directory) holds out whole
  documents by `fp4lm prepare`'s rule: a document is validation when the first 8 bytes of sha256(its UTF-8
  text), read as an integer / 2**64, are below `val_fraction` (fp4lm.data.prepared.is_validation). The split
  so depends on nothing but each document's text: not on the order of files, nor on the other documents.
  When that rule leaves the validation or the training split without one sequence (seq_len + 1 tokens), as
  it does for a handful of documents or one dominating document, the source is too small for a held-out set
  of whole documents to mean much, and the tail split below is taken instead (a split that always exists
  when the source is large enough at all).
- A single document (one plain text file, or a source holding one document), and the fallback above: the
  tail split, the last `val_fraction` of the text. The cut is moved forward to the next line start; the
  document it falls in is split there into two documents.
The two parts are tokenized separately, so a BPE tokenizer is trained on the training text only. For
pre-tokenized sources the validation split is the last `val_fraction` of the token array.

A prepared directory (`fp4lm prepare`, fp4lm/data/prepared.py) is not loaded: its train and validation
splits are memory-mapped token views (`PreparedTokens`), its validation split holds the documents `fp4lm
prepare` held out, and its tokenizer must be the run's (compared by fingerprint).

Tokenized text is cached in RUN_DIR/data_cache/ (keyed by the source's paths, sizes and mtimes, the
tokenizer, the split and the cache version), so a resumed run does not tokenize again. A run directory whose
cache was made before documents were held out (version 2: always the tail split) keeps that cache, and so
resumes on the data it was trained on. Loading only reads a run directory;
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
from typing import Any

import numpy as np

from fp4lm import resources
from fp4lm.config import BYTE_VOCAB_SIZE, DataConfig, check_section_rules
from fp4lm.data import readers
from fp4lm.data.pipeline import join_documents
from fp4lm.data.prepared import MANIFEST_FILE, PreparedCorpus, TokenShards, is_validation
from fp4lm.data.tokenizer import (
    SENTENCEPIECE_FILE,
    TOKENIZER_FILE,
    BPETokenizer,
    Tokenizer,
    check_tokenizer_matches,
    load_or_train_tokenizer,
    load_tokenizer,
    open_tokenizer,
    tokenizer_from_json,
)
from fp4lm.errors import UserError

CACHE_DIR = "data_cache"
# 2: documents end with the tokenizer's end-of-text token; their starts are cached too. 3: a source of several
# documents holds out whole documents (see the module docstring). A version-2 cache is still read (it keeps the
# tail split its run was trained with) but never written.
_CACHE_VERSION = 3
_TAIL_SPLIT_CACHE_VERSION = 2


class PreparedTokens:
    """One split of a prepared corpus seen as a 1-D token array: `size`, `dtype`, `view[offsets]` (any shape of
    integer offsets; reads only the pages holding them). Never loads a shard whole."""

    def __init__(self, shards: TokenShards):
        self.shards = shards
        self.size = shards.num_tokens
        self.dtype = shards.dtype

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, offsets) -> np.ndarray:
        return self.shards.gather(np.asarray(offsets, dtype=np.int64))


@dataclasses.dataclass(frozen=True)
class Corpus:
    """A tokenized corpus. Token arrays are 1-D; integer dtype (int32 for text, as stored for token files);
    for a prepared directory they are memory-mapped `PreparedTokens` views."""

    train_tokens: np.ndarray | PreparedTokens
    val_tokens: np.ndarray | PreparedTokens
    tokenizer: Tokenizer
    path: str
    format: str
    cache_key: str | None = None  # text sources: the name of their token cache (see save_corpus)
    # text sources whose tokenizer has an end-of-text token: where each document starts (pipeline.join_documents)
    train_document_starts: np.ndarray | None = None
    val_document_starts: np.ndarray | None = None

    @property
    def num_train_tokens(self) -> int:
        return int(self.train_tokens.size)

    @property
    def num_val_tokens(self) -> int:
        return int(self.val_tokens.size)

    @property
    def prepared(self) -> bool:
        return isinstance(self.train_tokens, PreparedTokens)

    def document_starts(self, split: str) -> np.ndarray | None:
        """Start offsets of the documents of `split` ("train" | "val"); None where not recorded (token files,
        text read with a tokenizer that has no end-of-text token)."""
        tokens = self.train_tokens if split == "train" else self.val_tokens
        if isinstance(tokens, PreparedTokens):
            return tokens.shards.document_starts
        return self.train_document_starts if split == "train" else self.val_document_starts


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


def is_prepared_dir(path: pathlib.Path) -> bool:
    """A directory `fp4lm prepare` wrote (or began writing): it holds a manifest or token shards."""
    return path.is_dir() and (
        (path / MANIFEST_FILE).is_file() or (path / ".prepare").exists() or any(path.glob("train-*.npy"))
    )


def load_corpus(
    data_cfg,
    *,
    run_dir: str | os.PathLike | None,
    tokenizer: Tokenizer | None = None,
    need_validation: bool = True,
    check_tokenizer: bool = True,
) -> Corpus:
    """Reads, tokenizes and splits the source named by `data_cfg` (path, format, jsonl_field, tokenizer,
    vocab_size, seq_len, val_fraction), or opens the prepared directory it names. `run_dir` (or None): a run
    directory whose tokenizer and token cache are reused; nothing is written (see `save_corpus`). `tokenizer`:
    the one to use instead of the run directory's (e.g. a checkpoint's). `need_validation`: whether the source's
    validation split must hold a sequence (not when data.val_path replaces it). `check_tokenizer`: whether a
    given or saved tokenizer must be the one data.tokenizer names (not for a mixture's later sources, which
    take the first source's)."""
    check_section_rules(DataConfig, data_cfg)  # the data keys' own rules, for a section built in code
    path = resources.data_file(data_cfg.path)  # a bundled corpus, or the path as given
    if is_prepared_dir(path):
        saved = tokenizer or (load_tokenizer(run_dir) if run_dir is not None else None)
        origin = f"run dir {run_dir}" if tokenizer is None else "the run's tokenizer"
        corpus = _load_prepared_corpus(path, data_cfg, saved, origin)
        check_split_sizes(corpus, data_cfg.seq_len, need_validation=need_validation)
        return corpus
    fmt = readers.resolve_format(path, data_cfg.format)
    saved = tokenizer or (load_tokenizer(run_dir) if run_dir is not None else None)
    if saved is not None and check_tokenizer:
        check_tokenizer_matches(saved, data_cfg.tokenizer, data_cfg.vocab_size, f"run dir {run_dir}")
    text = fmt not in readers.TOKEN_FORMATS
    cache_key = _cache_key(path, fmt, data_cfg, saved) if text and saved is not None else None
    cached = None
    if cache_key is not None and run_dir is not None:
        assert saved is not None
        cached = _read_cache(run_dir, cache_key)
        if cached is None:  # a run directory from before documents were held out keeps its tail split
            old_key = _cache_key(path, fmt, data_cfg, saved, version=_TAIL_SPLIT_CACHE_VERSION)
            cached = _read_cache(run_dir, old_key)
            cache_key = old_key if cached is not None else cache_key
    if cached is not None:
        assert saved is not None  # a cache key (hence a cache hit) needs the saved tokenizer
        starts = (cached.get("train_starts"), cached.get("val_starts"))
        corpus = Corpus(cached["train"], cached["val"], saved, str(path), fmt, cache_key, *starts)
    elif text:
        corpus = _load_text_corpus(path, fmt, data_cfg, saved)
    else:
        corpus = _load_token_corpus(path, fmt, data_cfg, saved)
    check_split_sizes(corpus, data_cfg.seq_len, need_validation=need_validation)
    if text and cached is None:
        key = cache_key or _cache_key(path, fmt, data_cfg, corpus.tokenizer)
        corpus = dataclasses.replace(corpus, cache_key=key)
    return corpus


def save_corpus(corpus: Corpus, run_dir: str | os.PathLike, *, also: tuple[Corpus, ...] = ()) -> None:
    """Leaves the corpus's tokenizer and (text sources) the token caches of it and of `also` (the other
    sources of a mixture) in `run_dir`, where a restarted run finds them; what is there already is kept, other
    caches are removed. Call it only for a run that was accepted: a tokenizer kept from a refused attempt would
    be reused by the next one, whatever its data."""
    if not (pathlib.Path(run_dir) / TOKENIZER_FILE).is_file():
        corpus.tokenizer.save(run_dir)
    keys = set()
    for each in (corpus, *also):
        if each.cache_key is None:
            continue
        keys.add(each.cache_key)
        if not _cache_path(run_dir, each.cache_key).is_file():
            _write_cache(run_dir, each.cache_key, _cache_arrays(each))
    if keys:
        _remove_caches_except(run_dir, keys)


def check_split_sizes(corpus: Corpus, seq_len: int, *, need_validation: bool = True) -> None:
    """Each split must hold at least one sequence of seq_len + 1 tokens (the validation split only when
    `need_validation`)."""
    need = seq_len + 1
    splits = [("training", corpus.train_tokens)] + ([("validation", corpus.val_tokens)] if need_validation else [])
    for split, tokens in splits:
        if corpus.prepared and tokens.size < need:
            fix = (
                "prepare it with a larger --val-fraction, or name one with data.val_path"
                if split == "validation"
                else "use a larger corpus"
            )
            raise UserError(
                f"prepared corpus {corpus.path} is too small: its {split} split has {tokens.size} tokens, but "
                f"seq_len={seq_len} needs at least {need}; {fix}, or use a smaller sequence length",
                settings=("seq_len", "val_path") if split == "validation" else ("seq_len",),
            )
        if tokens.size < need:
            raise UserError(
                f"corpus {corpus.path} is too small: its {split} split has {tokens.size} tokens "
                f"(train {corpus.num_train_tokens}, validation {corpus.num_val_tokens}), but seq_len={seq_len} "
                f"needs at least {need} in each; use a larger corpus, a smaller sequence length"
                + (" or a larger validation fraction" if split == "validation" else ""),
                settings=("seq_len", "val_fraction") if split == "validation" else ("seq_len",),
            )


def hold_out_documents(documents: list[str], val_fraction: float) -> tuple[list[str], list[str]]:
    """(train, validation) documents, each whole, by `fp4lm prepare`'s hash rule (see the module docstring)."""
    train, val = [], []
    for document in documents:
        (val if is_validation(document, val_fraction) else train).append(document)
    return train, val


def split_documents(documents: list[str], val_fraction: float) -> tuple[list[str], list[str]]:
    """(train, validation) documents: `split_text`'s cut in the documents joined by blank lines; the document
    the cut falls in is split there, its two parts counting as two documents."""
    cut = len(split_text("\n\n".join(documents), val_fraction)[0])
    train, val, start = [], [], 0
    for document in documents:
        train.append(document[: max(0, cut - start)])
        val.append(document[max(0, cut - start) :])
        start += len(document) + 2
    return [d for d in train if d], [d for d in val if d]


def _load_text_corpus(path: pathlib.Path, fmt: str, data_cfg, saved: Tokenizer | None) -> Corpus:
    """Each document ends with the tokenizer's end-of-text token (BOS first where it has one) and its start is
    recorded, for document masking; a tokenizer without one (a run directory's from before) gets the documents
    joined by blank lines and the tail split, as such runs were trained. The split: held-out documents, or the
    tail split for a single document or when those leave a split without one sequence (module docstring)."""
    documents = readers.read_documents(path, fmt, data_cfg.jsonl_field)
    if len(documents) > 1:
        train_documents, val_documents = hold_out_documents(documents, data_cfg.val_fraction)
        if train_documents and val_documents:
            tokenizer = saved or _make_tokenizer(data_cfg, "\n\n".join(train_documents))
            if tokenizer.eos_id is not None:
                corpus = _documents_corpus(path, fmt, tokenizer, train_documents, val_documents)
                if min(corpus.num_train_tokens, corpus.num_val_tokens) >= data_cfg.seq_len + 1:
                    return corpus
    train_text, val_text = split_text("\n\n".join(documents), data_cfg.val_fraction)
    tokenizer = saved or _make_tokenizer(data_cfg, train_text)  # (trained again: on this split's training text)
    if tokenizer.eos_id is None:
        return Corpus(tokenizer.encode(train_text), tokenizer.encode(val_text), tokenizer, str(path), fmt)
    return _documents_corpus(path, fmt, tokenizer, *split_documents(documents, data_cfg.val_fraction))


def _make_tokenizer(data_cfg, train_text: str) -> Tokenizer:
    return load_or_train_tokenizer(data_cfg.tokenizer, data_cfg.vocab_size, None, train_text)


def _documents_corpus(path, fmt: str, tokenizer: Tokenizer, train: list[str], val: list[str]) -> Corpus:
    (train_tokens, train_starts), (val_tokens, val_starts) = (join_documents(tokenizer, part) for part in (train, val))
    return Corpus(train_tokens, val_tokens, tokenizer, str(path), fmt, None, train_starts, val_starts)


def _prepared_tokenizer(prepared: PreparedCorpus, data_cfg, saved: Tokenizer | None, saved_origin: str) -> Tokenizer:
    """The run's tokenizer for a prepared directory: the saved one (run directory, checkpoint, or another source
    of the mixture), else the one data.tokenizer names (byte or a path), else the one the directory was prepared
    with (data.tokenizer=bpe, the default: there is no text to train on). Its fingerprint must be the manifest's."""
    path, info = prepared.directory, prepared.tokenizer
    if saved is None and data_cfg.tokenizer != "bpe":
        saved = open_tokenizer(data_cfg.tokenizer, vocab_size=data_cfg.vocab_size)
        saved_origin = f"data.tokenizer={data_cfg.tokenizer}"
    if saved is not None:
        if saved.fingerprint != prepared.tokenizer_fingerprint:
            raise UserError(
                f"prepared corpus {path} was made with another tokenizer ({info.get('name')}, vocab "
                f"{info.get('vocab_size')}) than this run's ({saved_origin}: {saved.name}, vocab {saved.vocab_size}); "
                "prepare the data again with the run's tokenizer, or set data.tokenizer to the one it was prepared "
                "with (data.tokenizer=bpe, the default, takes a byte corpus's or a tokenizer kept in the directory) "
                "in a new run directory",
                settings=("path", "tokenizer", "run_dir"),
            )
        return saved
    if info.get("name") == "byte" and not (path / TOKENIZER_FILE).is_file():
        tokenizer = open_tokenizer("byte", vocab_size=None if info.get("eos_id") is not None else BYTE_VOCAB_SIZE)
    elif not (path / TOKENIZER_FILE).is_file() and not (path / SENTENCEPIECE_FILE).is_file():
        raise UserError(
            f"prepared corpus {path} does not hold its tokenizer ({TOKENIZER_FILE}); name it with data.tokenizer=PATH",
            settings=("path", "tokenizer"),
        )
    else:
        tokenizer = open_tokenizer(path)
    if tokenizer.fingerprint != prepared.tokenizer_fingerprint:
        raise UserError(
            f"the tokenizer in {path} is not the one recorded in {path / MANIFEST_FILE} (fingerprints differ); "
            "prepare the data again into a new directory",
            settings=("path",),
        )
    return tokenizer


def _load_prepared_corpus(path: pathlib.Path, data_cfg, saved: Tokenizer | None, saved_origin: str) -> Corpus:
    prepared = PreparedCorpus.open(path)
    tokenizer = _prepared_tokenizer(prepared, data_cfg, saved, saved_origin)
    train, val = PreparedTokens(prepared.split("train")), PreparedTokens(prepared.split("val"))
    return Corpus(train, val, tokenizer, str(path), "prepared")


def _load_token_corpus(path: pathlib.Path, fmt: str, data_cfg, saved: Tokenizer | None) -> Corpus:
    tokens = readers.read_token_array(path, fmt)
    tokenizer = saved or _tokenizer_for_token_file(path, data_cfg)
    readers.check_token_ids(tokens, data_cfg.vocab_size or tokenizer.vocab_size, path)
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


def _cache_key(path: pathlib.Path, fmt: str, data_cfg, tokenizer: Tokenizer, *, version: int = _CACHE_VERSION) -> str:
    parts = {
        "version": version,
        "source": readers.source_fingerprint(path),
        "format": fmt,
        "field": data_cfg.jsonl_field,
        "val_fraction": data_cfg.val_fraction,
        "tokenizer": hashlib.sha256(tokenizer.to_json().encode()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def _cache_path(run_dir, key: str) -> pathlib.Path:
    return pathlib.Path(run_dir) / CACHE_DIR / f"tokens-{key}.npz"


def _cache_arrays(corpus: Corpus) -> dict[str, np.ndarray]:
    arrays = {"train": np.asarray(corpus.train_tokens), "val": np.asarray(corpus.val_tokens)}
    if corpus.train_document_starts is not None and corpus.val_document_starts is not None:
        arrays.update(train_starts=corpus.train_document_starts, val_starts=corpus.val_document_starts)
    return arrays


def _read_cache(run_dir, key: str) -> dict[str, np.ndarray] | None:
    """{"train", "val"} token arrays and, where recorded, {"train_starts", "val_starts"}."""
    path = _cache_path(run_dir, key)
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as cached:
            arrays = {name: cached[name] for name in cached.files}
            return arrays if {"train", "val"} <= arrays.keys() else None
    except (OSError, ValueError, KeyError, EOFError):
        return None  # a damaged cache is rebuilt


def _write_cache(run_dir, key: str, arrays: dict[str, Any]) -> None:
    """Best effort: a failure to cache costs only time, never the run."""
    directory = pathlib.Path(run_dir) / CACHE_DIR
    final = directory / f"tokens-{key}.npz"
    temporary = directory / f".tokens-{key}.{uuid.uuid4().hex}.tmp.npz"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        np.savez(temporary, **arrays)
        os.replace(temporary, final)
    except OSError:
        if directory.is_dir():
            temporary.unlink(missing_ok=True)


def _remove_caches_except(run_dir, keys: set[str]) -> None:
    """Best effort: caches of other data (an earlier attempt's) are removed."""
    directory = pathlib.Path(run_dir) / CACHE_DIR
    keep = {_cache_path(run_dir, key) for key in keys}
    try:
        for stale in directory.glob("tokens-*.npz"):
            if stale not in keep:
                stale.unlink(missing_ok=True)
    except OSError:
        pass
