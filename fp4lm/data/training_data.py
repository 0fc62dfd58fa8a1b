"""One process's training data: `build(data_cfg, ...)` -> `Data` (the corpus or mixture, its tokenizer, the
training iterator and the fixed validation sets). See fp4lm/data/__init__.py for the sources it takes."""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from fp4lm import resources
from fp4lm.config import DataConfig
from fp4lm.data.corpus import Corpus, is_prepared_dir, load_corpus, save_corpus
from fp4lm.data.mixture import ConcatenatedTokens, Mixture, make_mixture_iterator
from fp4lm.data.pipeline import TokenStream, TrainIterator, make_eval_batches, make_train_iterator, num_sequences
from fp4lm.data.prepared import PreparedCorpus
from fp4lm.errors import UserError
from fp4lm.tokenizer import Tokenizer, model_vocab_size


@dataclasses.dataclass(frozen=True)
class ValidationSet:
    """One fixed validation set: a token stream (array or view), its document starts when document masking is
    on, and its weight in the overall val_loss (the source's mixture weight; 1 for a single set)."""

    tokens: TokenStream
    document_starts: np.ndarray | None
    weight: float
    origin: str  # the path it comes from, for messages


@dataclasses.dataclass
class Data:
    """Everything the trainer needs from the data side of one process."""

    corpus: Corpus  # the (first) training source
    tokenizer: Tokenizer
    train_iterator: TrainIterator
    seq_len: int
    vocab_size: int  # the model's vocabulary: the tokenizer's, padded to data.vocab_multiple (>= tokenizer.vocab_size)
    global_batch_size: int
    local_batch_size: int
    shard_index: int
    shard_count: int
    validation: dict[str, ValidationSet] = dataclasses.field(default_factory=dict)  # name -> set
    sources: dict[str, Corpus] = dataclasses.field(default_factory=dict)  # a mixture's sources, by name
    mixture: Mixture | None = None

    @property
    def num_train_tokens(self) -> int:
        return sum(c.num_train_tokens for c in self.sources.values()) if self.sources else self.corpus.num_train_tokens

    @property
    def num_val_tokens(self) -> int:
        return sum(int(v.tokens.size) for v in self.validation.values())

    def eval_sets(self, num_batches: int) -> dict[str, list[dict[str, np.ndarray]]]:
        """Per validation set, this process's share of its fixed batches (identical on every call)."""
        return {
            name: make_eval_batches(
                v.tokens,
                self.seq_len,
                self.global_batch_size,
                num_batches,
                shard_index=self.shard_index,
                shard_count=self.shard_count,
                document_starts=v.document_starts,
            )
            for name, v in self.validation.items()
        }

    def eval_batches(self, num_batches: int) -> list[dict[str, np.ndarray]]:
        """This process's share of the fixed validation batches of every set (identical on every call)."""
        return [batch for batches in self.eval_sets(num_batches).values() for batch in batches]

    def val_loss(self, losses: dict[str, float]) -> float:
        """The overall validation loss from each set's: their mean weighted by the sources' mixture weights."""
        total = sum(self.validation[name].weight for name in losses)
        return sum(loss * self.validation[name].weight / total for name, loss in losses.items())

    def save(self, run_dir: str | os.PathLike) -> None:
        """Leaves the tokenizer and the token caches in the run directory (see `save_corpus`)."""
        save_corpus(self.corpus, run_dir, also=tuple(self.sources.values()))

    def describe(self) -> str:
        """The lines for the start-of-run banner."""
        sources = (
            ", ".join(f"{name}: {c.path} ({c.format})" for name, c in self.sources.items())
            if self.sources
            else f"{self.corpus.path} ({self.corpus.format})"
        )
        validation = ", ".join(f"{name or 'validation'}: {v.origin}" for name, v in self.validation.items())
        line = (
            f"data {sources}, tokenizer {self.tokenizer.name} (vocab {self.tokenizer.vocab_size}), "
            f"{self.num_train_tokens:,} train / {self.num_val_tokens:,} validation tokens ({validation}), "
            f"seq_len {self.seq_len}"
        )
        if self.mixture is not None:
            line += "\n" + self.mixture.describe(self.seq_len)
        return line


def source_names(paths: list[str]) -> list[str]:
    """Short distinct names for sources (metrics keys val_loss/<name>): the file or directory name without
    its extensions, numbered where two would be the same."""
    names = []
    for path in paths:
        base = path.split(":", 1)[1] if resources.is_bundled(path) else os.path.basename(os.path.normpath(path))
        name = base.split(".")[0] or base or "source"
        names.append(name)
    return [f"{n}{i}" if names.count(n) > 1 else n for i, n in enumerate(names)]


def _masking(data_cfg) -> bool:
    return bool(getattr(data_cfg, "document_masking", True))


def _validation_source(data_cfg, tokenizer: Tokenizer, masking: bool, run_dir) -> ValidationSet:
    """data.val_path: every document of a source (both splits), prepared or raw (prepared into a cache as a
    training source is), read with the training data's tokenizer; with their document starts when `masking`."""
    path = resources.data_file(data_cfg.val_path)
    if not path.exists():
        raise UserError(f"data.val_path={path} does not exist; fix the path", settings=("val_path",))
    if is_prepared_dir(path):
        prepared = PreparedCorpus.open(path)
        prepared.check_token_ids()
        if prepared.tokenizer_fingerprint != tokenizer.fingerprint:
            raise UserError(
                f"data.val_path={path} was prepared with another tokenizer ({prepared.tokenizer.get('name')}) than "
                "the training data's; prepare it again with the training data's tokenizer",
                settings=("val_path",),
            )
        splits = [prepared.view(name) for name in ("train", "val")]
    else:
        val_cfg = dataclasses.replace(data_cfg, path=data_cfg.val_path)
        try:
            corpus = load_corpus(
                val_cfg, run_dir=run_dir, tokenizer=tokenizer, check_tokenizer=False, check_sizes=False
            )
        except UserError as error:  # the source's path is data.val_path, not data.path
            settings = tuple("val_path" if s == "path" else s for s in error.settings)
            raise UserError(str(error), settings=settings) from None
        splits = [corpus.train_tokens, corpus.val_tokens]
    splits = [s for s in splits if s.size]
    tokens = ConcatenatedTokens(splits)
    starts = tokens.document_starts([s.document_starts for s in splits])
    if tokens.size < data_cfg.seq_len + 1:
        raise UserError(
            f"data.val_path={path} is too small: {tokens.size} tokens, but seq_len={data_cfg.seq_len} needs at least "
            f"{data_cfg.seq_len + 1}; use a larger validation source or a smaller sequence length",
            settings=("val_path", "seq_len"),
        )
    return ValidationSet(tokens, starts if masking else None, 1.0, str(path))


def build(
    data_cfg,
    *,
    run_dir: str | os.PathLike | None,
    seed: int,
    batch_size: int,
    shard_index: int = 0,
    shard_count: int = 1,
    tokenizer: Tokenizer | None = None,
) -> Data:
    """Loads the corpus (or the mixture's corpora) named by `data_cfg` (any object with path, format,
    text_field, tokenizer, vocab_size, seq_len, val_fraction, and optionally sources and val_path), reuses the
    tokenizer and token cache of `run_dir` (if any, without writing there) or makes the tokenizer, and builds
    this process's training iterator over global batches of `batch_size` sequences. `tokenizer`: the one to
    use instead of the run directory's (a checkpoint's)."""
    _check_path_or_sources(data_cfg)
    sources = [s for s in getattr(data_cfg, "sources", ()) if s.weight > 0]
    val_path = getattr(data_cfg, "val_path", None)
    corpora = _load_sources(data_cfg, sources, run_dir, tokenizer, need_validation=not val_path)
    first = next(iter(corpora.values()))
    masking = _masking(data_cfg)
    mixture = None
    if sources:
        mixture = Mixture(
            names=tuple(corpora),
            weights=tuple(s.weight for s in sources),
            sequences=tuple(num_sequences(c.num_train_tokens, data_cfg.seq_len) for c in corpora.values()),
        )
        view = ConcatenatedTokens([c.train_tokens for c in corpora.values()], align=data_cfg.seq_len)
        starts = view.document_starts([c.document_starts("train") for c in corpora.values()]) if masking else None
        iterator = make_mixture_iterator(
            view,
            mixture,
            data_cfg.seq_len,
            batch_size,
            seed,
            shard_index=shard_index,
            shard_count=shard_count,
            document_starts=starts,
        )
    else:
        starts = first.document_starts("train") if masking else None
        iterator = make_train_iterator(
            first.train_tokens,
            data_cfg.seq_len,
            batch_size,
            seed,
            shard_index=shard_index,
            shard_count=shard_count,
            document_starts=starts,
        )
    if val_path:
        validation = {"": _validation_source(data_cfg, first.tokenizer, masking, run_dir)}
    else:
        weights = [s.weight for s in sources] or [1.0]
        validation = {
            name: ValidationSet(c.val_tokens, c.document_starts("val") if masking else None, w, f"{c.path} (held out)")
            for (name, c), w in zip(corpora.items(), weights, strict=True)
        }
    return Data(
        corpus=first,
        tokenizer=first.tokenizer,
        train_iterator=iterator,
        seq_len=data_cfg.seq_len,
        vocab_size=model_vocab_size(first.tokenizer, data_cfg.vocab_size, getattr(data_cfg, "vocab_multiple", 128)),
        global_batch_size=batch_size,
        local_batch_size=batch_size // shard_count,
        shard_index=shard_index,
        shard_count=shard_count,
        validation=validation,
        sources=corpora if sources else {},
        mixture=mixture,
    )


def _check_path_or_sources(data_cfg) -> None:
    """A mixture reads only data.sources: a data.path set beside it, and not among them, would be ignored."""
    default, sources = DataConfig().path, getattr(data_cfg, "sources", ())
    if sources and data_cfg.path not in (default, *(source.path for source in sources)):
        raise UserError(
            f"data.path={data_cfg.path} is set beside data.sources, which replaces it (a mixture reads only its "
            f"sources); add it to data.sources as PATH:WEIGHT, or leave data.path at its default ({default})",
            settings=("path", "sources"),
        )


def _load_sources(data_cfg, sources, run_dir, tokenizer, *, need_validation: bool) -> dict[str, Corpus]:
    """data.path as {"": corpus}, or data.sources by name, every source with one tokenizer (the first source's,
    or the given or saved one)."""
    if not sources:
        return {"": load_corpus(data_cfg, run_dir=run_dir, tokenizer=tokenizer, need_validation=need_validation)}
    corpora: dict[str, Corpus] = {}
    for index, (name, source) in enumerate(zip(source_names([s.path for s in sources]), sources, strict=True)):
        source_cfg = dataclasses.replace(data_cfg, path=source.path)
        try:
            corpus = load_corpus(
                source_cfg,
                run_dir=run_dir,
                tokenizer=tokenizer,
                need_validation=need_validation,
                check_tokenizer=index == 0,
            )
        except UserError as error:  # the source's path is an entry of data.sources, not data.path
            settings = tuple("sources" if s == "path" else s for s in error.settings)
            raise UserError(str(error), settings=settings) from None
        tokenizer = tokenizer or corpus.tokenizer
        corpora[name] = corpus
    return corpora
