"""Data: readers, tokenizers, the fixed train/validation split and the grain pipeline.

`build(data_cfg, run_dir=..., seed=..., batch_size=...)` is the one call the trainer needs; it only reads the
run directory, and `Data.save(run_dir)` leaves the tokenizer and token cache there once a run is accepted.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from fp4lm.data.corpus import Corpus, load_corpus, save_corpus, split_text, split_tokens
from fp4lm.data.pipeline import TrainIterator, make_eval_batches, make_train_iterator, num_sequences
from fp4lm.data.readers import FORMATS
from fp4lm.data.tokenizer import (
    BPETokenizer,
    ByteTokenizer,
    Tokenizer,
    load_or_train_tokenizer,
    load_tokenizer,
    tokenizer_from_json,
)

__all__ = [
    "FORMATS",
    "BPETokenizer",
    "ByteTokenizer",
    "Corpus",
    "Data",
    "Tokenizer",
    "TrainIterator",
    "build",
    "load_corpus",
    "load_or_train_tokenizer",
    "load_tokenizer",
    "make_eval_batches",
    "make_train_iterator",
    "num_sequences",
    "save_corpus",
    "split_text",
    "split_tokens",
    "tokenizer_from_json",
]


@dataclasses.dataclass
class Data:
    """Everything the trainer needs from the data side of one process."""

    corpus: Corpus
    tokenizer: Tokenizer
    train_iterator: TrainIterator
    seq_len: int
    vocab_size: int  # the model's vocabulary (data.vocab_size); >= tokenizer.vocab_size
    global_batch_size: int
    local_batch_size: int
    shard_index: int
    shard_count: int

    @property
    def num_train_tokens(self) -> int:
        return self.corpus.num_train_tokens

    @property
    def num_val_tokens(self) -> int:
        return self.corpus.num_val_tokens

    @property
    def train_tokens(self) -> np.ndarray:
        return self.corpus.train_tokens

    @property
    def val_tokens(self) -> np.ndarray:
        return self.corpus.val_tokens

    def eval_batches(self, num_batches: int) -> list[dict[str, np.ndarray]]:
        """This process's share of the fixed validation batches (identical on every call)."""
        return make_eval_batches(
            self.corpus.val_tokens,
            self.seq_len,
            self.global_batch_size,
            num_batches,
            shard_index=self.shard_index,
            shard_count=self.shard_count,
        )

    def save(self, run_dir: str | os.PathLike) -> None:
        """Leaves the tokenizer and the token cache in the run directory (see `save_corpus`)."""
        save_corpus(self.corpus, run_dir)

    def describe(self) -> str:
        """One line for the start-of-run banner."""
        return (
            f"data {self.corpus.path} ({self.corpus.format}), tokenizer {self.tokenizer.name} "
            f"(vocab {self.tokenizer.vocab_size}), {self.num_train_tokens:,} train / "
            f"{self.num_val_tokens:,} validation tokens, seq_len {self.seq_len}"
        )


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
    """Loads the corpus named by `data_cfg` (any object with path, format, jsonl_field, tokenizer,
    vocab_size, seq_len, val_fraction), reuses the tokenizer and token cache of `run_dir` (if any, without
    writing there) or makes the tokenizer, and builds this process's training iterator over global batches
    of `batch_size` sequences. `tokenizer`: the one to use instead of the run directory's (a checkpoint's)."""
    corpus = load_corpus(data_cfg, run_dir=run_dir, tokenizer=tokenizer)
    iterator = make_train_iterator(
        corpus.train_tokens, data_cfg.seq_len, batch_size, seed, shard_index=shard_index, shard_count=shard_count
    )
    return Data(
        corpus=corpus,
        tokenizer=corpus.tokenizer,
        train_iterator=iterator,
        seq_len=data_cfg.seq_len,
        vocab_size=data_cfg.vocab_size,
        global_batch_size=batch_size,
        local_batch_size=batch_size // shard_count,
        shard_index=shard_index,
        shard_count=shard_count,
    )
