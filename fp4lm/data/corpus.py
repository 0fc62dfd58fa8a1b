"""One training source as a prepared corpus with its tokenizer: a directory `fp4lm prepare` wrote, or a raw
source prepared into a cache by the same code (fp4lm/data/raw_source.py), so both train alike.

Loading only reads a run directory (its tokenizer and data cache); `save_corpus` leaves the tokenizer and the
caches there once the run is accepted, so `fp4lm eval` and `sample`, and a refused `fp4lm train`, never write
into it.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib

import numpy as np

from fp4lm import resources
from fp4lm.config import BYTE_VOCAB_SIZE, DataConfig, check_section_rules
from fp4lm.data import raw_source
from fp4lm.data.prepared import MANIFEST_FILE, PreparedCorpus, TokenView
from fp4lm.data.token_files import check_token_file
from fp4lm.errors import UserError
from fp4lm.tokenizer import (
    SENTENCEPIECE_FILE,
    TOKENIZER_FILE,
    Tokenizer,
    check_tokenizer_matches,
    load_tokenizer,
    open_tokenizer,
)


@dataclasses.dataclass(frozen=True)
class Corpus:
    """A tokenized source: its prepared directory (`shards`), tokenizer, path and format; `cache_key` names
    a raw source's cache (see `save_corpus`)."""

    shards: PreparedCorpus
    tokenizer: Tokenizer
    path: str
    format: str
    cache_key: str | None = None

    @property
    def train_tokens(self) -> TokenView:
        return self.shards.view("train")

    @property
    def val_tokens(self) -> TokenView:
        return self.shards.view("val")

    @property
    def num_train_tokens(self) -> int:
        return self.train_tokens.size

    @property
    def num_val_tokens(self) -> int:
        return self.val_tokens.size

    def document_starts(self, split: str) -> np.ndarray:
        """Start offsets of the documents of `split` ("train" | "val")."""
        return self.shards.view(split).document_starts


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
    check_sizes: bool = True,
) -> Corpus:
    """Opens the source `data_cfg` names (path, format, text_field, tokenizer, vocab_size, seq_len,
    val_fraction). `run_dir` (or None): a run directory whose tokenizer and data cache are reused; nothing is
    written (see `save_corpus`). `tokenizer`: the one to use instead of the run directory's (e.g. a
    checkpoint's). `need_validation`: whether the validation split must hold a sequence (not when data.val_path
    replaces it). `check_tokenizer`: whether a given or saved tokenizer must be the one data.tokenizer names
    (not for a mixture's later sources, which take the first source's)."""
    check_section_rules(DataConfig, data_cfg)  # the data keys' own rules, for a section built in code
    raw_source.check_no_old_cache(run_dir)
    path = resources.data_file(data_cfg.path)  # a bundled corpus, or the path as given
    saved = tokenizer or (load_tokenizer(run_dir) if run_dir is not None else None)
    if is_prepared_dir(path):
        origin = f"run dir {run_dir}" if tokenizer is None else "the run's tokenizer"
        prepared = PreparedCorpus.open(path)
        prepared.check_token_ids()
        corpus = Corpus(prepared, _prepared_tokenizer(prepared, data_cfg, saved, origin), str(path), "prepared")
    else:
        if saved is not None and check_tokenizer:
            check_tokenizer_matches(saved, data_cfg.tokenizer, data_cfg.vocab_size, f"run dir {run_dir}")
        corpus = _load_raw(path, data_cfg, saved, run_dir, need_validation)
    if check_sizes:
        check_split_sizes(corpus, data_cfg.seq_len, need_validation=need_validation)
    return corpus


def _load_raw(path: pathlib.Path, data_cfg, saved: Tokenizer | None, run_dir, need_validation: bool) -> Corpus:
    """A raw source through its cache: held-out documents, or the tail split (raw_source's docstring)."""
    files = raw_source.source_files(path, data_cfg.format)
    tail = len(files) == 1 and files[0][1] in ("text", *raw_source.TOKEN_FORMATS)
    tokenizer = saved or raw_source.make_tokenizer(files, data_cfg, tail_split=tail)
    if files[0][1] in raw_source.TOKEN_FORMATS:
        check_token_file(*files[0], data_cfg.vocab_size or tokenizer.vocab_size)
    fmt = files[0][1] if len({f for _, f in files}) == 1 else "mixed"
    prepared, key = raw_source.open_cached(path, files, data_cfg, tokenizer, run_dir, tail_split=tail)
    corpus = Corpus(prepared, tokenizer, str(path), fmt, key)
    need = data_cfg.seq_len + 1
    if not tail and min(corpus.num_train_tokens, corpus.num_val_tokens if need_validation else need) < need:
        prepared, key = raw_source.open_cached(path, files, data_cfg, tokenizer, run_dir, tail_split=True)
        corpus = Corpus(prepared, tokenizer, str(path), fmt, key)
    return corpus


def save_corpus(corpus: Corpus, run_dir: str | os.PathLike, *, also: tuple[Corpus, ...] = ()) -> None:
    """Leaves the corpus's tokenizer and the data caches of it and of `also` (the other sources of a mixture)
    in `run_dir`, where a restarted run finds them; what is there already is kept, other caches are removed.
    Call it only for a run that was accepted: a tokenizer kept from a refused attempt would be reused by the
    next one, whatever its data."""
    if not (pathlib.Path(run_dir) / TOKENIZER_FILE).is_file():
        corpus.tokenizer.save(run_dir)
    keys = set()
    for each in (corpus, *also):
        if each.cache_key is not None:
            keys.add(each.cache_key)
            raw_source.keep_in_run_dir(each.shards, each.cache_key, run_dir)
    if keys:
        raw_source.remove_other_caches(run_dir, keys)


def check_split_sizes(corpus: Corpus, seq_len: int, *, need_validation: bool = True) -> None:
    """Each split must hold at least one sequence of seq_len + 1 tokens (the validation split only when
    `need_validation`)."""
    need = seq_len + 1
    splits = [("training", corpus.train_tokens)] + ([("validation", corpus.val_tokens)] if need_validation else [])
    for split, tokens in splits:
        if corpus.format == "prepared" and tokens.size < need:
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
