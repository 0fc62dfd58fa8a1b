"""`fp4lm prepare`'s unit of work, run in a worker process (or in the parent with --workers 1): the options
that decide the prepared bytes, the tokenizer as a worker opens it, and a unit's part files and record. See
fp4lm/data/prepare.py for how the work is cut. Imports neither JAX nor grain: workers are spawned processes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

from fp4lm.config import DEFAULT_VAL_FRACTION
from fp4lm.data.prepared import SPLITS, is_validation_digest
from fp4lm.data.shard_writer import ShardWriter
from fp4lm.data.sources import BadLines, Piece, read_piece
from fp4lm.errors import UserError
from fp4lm.jsonio import write_text_atomically

DEFAULT_SHARD_TOKENS = 1 << 27  # 256 MiB of uint16 tokens per shard at most
MAX_SHARD_TOKENS = 1 << 32
DEFAULT_PIECE_BYTES = 64 << 20  # source bytes per unit of work


@dataclasses.dataclass(frozen=True)
class Options:
    """What, besides the sources and the tokenizer, decides the prepared bytes (recorded in the manifest)."""

    format: str = "auto"
    text_field: str = "text"
    text_delimiter: str | None = None
    skip_bad_lines: bool = False
    val_fraction: float = DEFAULT_VAL_FRACTION
    shard_tokens: int = DEFAULT_SHARD_TOKENS
    piece_bytes: int = DEFAULT_PIECE_BYTES
    tail_split: bool = False  # every document in "train"; validation is its last val_fraction (prepared.py)

    def check(self) -> None:
        if not 0.0 <= self.val_fraction < 1.0:
            raise UserError(f"--val-fraction {self.val_fraction} is outside [0, 1); use e.g. {DEFAULT_VAL_FRACTION}")
        if not 1 <= self.shard_tokens <= MAX_SHARD_TOKENS:
            raise UserError(
                f"--shard-tokens {self.shard_tokens} is outside [1, 2**32] (a shard of 2**32 uint32 tokens is 16 GiB); "
                f"use e.g. {DEFAULT_SHARD_TOKENS} (the default, 2**27)"
            )
        if self.piece_bytes < 1:
            raise ValueError(f"piece_bytes={self.piece_bytes} must be positive")
        if self.text_delimiter == "":
            raise UserError("--text-delimiter is empty; give the string that separates documents, or leave it out")


# ---------------------------------------------------------------- the tokenizer, in the parent and in workers


def open_tokenizer(spec: str):
    """The tokenizer `spec` names (a path, or "byte"); its mistakes are phrased for --tokenizer."""
    from fp4lm.tokenizer import open_tokenizer as open_any

    if spec == "bpe":
        raise UserError(
            "--tokenizer bpe: prepare needs a tokenizer that already exists; give byte, the path of a tokenizer.json "
            "(e.g. the one an `fp4lm train` run with data.tokenizer=bpe saved in its run directory) or a .model"
        )
    try:
        return open_any(spec)
    except UserError as error:
        raise UserError(str(error)) from None  # its settings name data.tokenizer; here it is --tokenizer


def tokenizer_entry(tokenizer) -> dict:
    """The manifest's tokenizer entry."""
    return {
        "fingerprint": tokenizer.fingerprint,
        "name": tokenizer.name,
        "vocab_size": int(tokenizer.vocab_size),
        "eos_id": tokenizer.eos_id,
        "bos_id": tokenizer.bos_id,
    }


_WORKER_TOKENIZER: dict[tuple[str, str], Any] = {}  # the tokenizer a worker opened, by (spec, fingerprint)


def worker_tokenizer(spec: str, fingerprint: str):
    """The tokenizer, opened once per process; it must be the one the parent opened (not since edited)."""
    key = (spec, fingerprint)
    if key not in _WORKER_TOKENIZER:
        tokenizer = open_tokenizer(spec)
        if tokenizer.fingerprint != fingerprint:
            raise UserError(f"tokenizer {spec} changed while preparing; run the same command again")
        _WORKER_TOKENIZER.clear()
        _WORKER_TOKENIZER[key] = tokenizer
    return _WORKER_TOKENIZER[key]


# ---------------------------------------------------------------- one unit of work (runs in a worker)


@dataclasses.dataclass(frozen=True)
class Unit:
    index: int
    pieces: tuple[Piece, ...]
    state: str  # DIR/.prepare
    tokenizer: str  # what open_tokenizer opens in the worker
    tokenizer_entry: dict  # the manifest's entry for it (ids of BOS and EOS, vocabulary size)
    dtype: str
    options: Options

    @property
    def record_path(self) -> pathlib.Path:
        return pathlib.Path(self.state) / f"unit-{self.index:05d}.json"


class UnitWriter:
    """The part files of one unit: one open ShardWriter per split; a new train part when one would be full."""

    def __init__(self, unit: Unit):
        self.unit = unit
        self.state = pathlib.Path(unit.state)
        self.tmp = f".{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"  # unique: a killed run's orphan may still write
        self.open: dict[str, ShardWriter | None] = dict.fromkeys(SPLITS)
        self.parts: dict[str, list[dict]] = {split: [] for split in SPLITS}

    def add(self, split: str, document: np.ndarray) -> None:
        writer = self.open[split]
        limit = self.unit.options.shard_tokens if split == "train" else None
        if writer is not None and limit and writer.num_documents and writer.num_tokens + len(document) > limit:
            self._close(split)
            writer = None
        if writer is None:
            name = f"unit-{self.unit.index:05d}-{split}-{len(self.parts[split]):03d}"
            writer = ShardWriter(
                self.state, f"{name}.npy", f"{name}.docs.npy", np.dtype(self.unit.dtype), suffix=self.tmp
            )
            self.open[split] = writer
        writer.add(document)

    def _close(self, split: str) -> None:
        writer = self.open[split]
        assert writer is not None
        entry = writer.finish()
        os.replace(writer.tokens_path, self.state / writer.file)
        os.replace(writer.docs_path, self.state / writer.docs)
        self.parts[split].append(entry)
        self.open[split] = None

    def finish(self) -> dict[str, list[dict]]:
        for split in SPLITS:
            if self.open[split] is not None:
                self._close(split)
        return self.parts

    def abandon(self) -> None:
        for writer in self.open.values():
            if writer is not None:
                writer.abandon()


def run_unit(unit: Unit) -> dict:
    """Tokenizes one unit into its part files and writes its record; returns the record."""
    entry = unit.tokenizer_entry
    tokenizer = worker_tokenizer(unit.tokenizer, entry["fingerprint"])
    bos, eos, vocab = entry["bos_id"], entry["eos_id"], entry["vocab_size"]
    head = np.array([] if bos is None else [bos], unit.dtype)
    tail = np.array([] if eos is None else [eos], unit.dtype)
    options, bad_lines = unit.options, BadLines()
    writer, reporter = UnitWriter(unit), _Reporter()
    try:
        for piece in unit.pieces:
            digest, chunks = hashlib.sha256(), []
            for text, end in read_piece(
                piece,
                text_field=options.text_field,
                text_delimiter=options.text_delimiter,
                skip_bad_lines=options.skip_bad_lines,
                bad_lines=bad_lines,
            ):
                digest.update(text.encode("utf-8"))
                ids = np.asarray(tokenizer.encode(text))
                if ids.size and (ids.min() < 0 or ids.max() >= vocab):
                    raise RuntimeError(f"the tokenizer produced an id outside [0, {vocab}) for {piece.path}")
                chunks.append(ids.astype(unit.dtype))  # the shard's width: 2 bytes per token, not 8
                if not end:
                    continue
                ids = np.concatenate(chunks) if len(chunks) > 1 else chunks[0]
                reporter.add(ids.size + head.size + tail.size if ids.size else 0)
                if ids.size:
                    held_out = not options.tail_split and is_validation_digest(digest.digest(), options.val_fraction)
                    split = "val" if held_out else "train"
                    writer.add(split, np.concatenate([head, ids, tail]))
                digest, chunks = hashlib.sha256(), []
        parts = writer.finish()
        reporter.flush()
    except BaseException:
        writer.abandon()
        raise
    record = {
        "unit": unit.index,
        "parts": parts,
        "bad_lines": bad_lines.count,
        "first_bad_line": bad_lines.first,
        "null_texts": bad_lines.nulls,
    }
    write_text_atomically(unit.record_path, json.dumps(record) + "\n")
    return record


# Where a unit reports the tokens it made as it goes (for the progress bar): the parent's progress in the
# parent's process, a queue to the parent in a worker (set by the pool's initializer); None: nowhere.
_token_sink: Callable[[int], None] | None = None


def set_token_sink(sink) -> None:
    global _token_sink
    _token_sink = sink


class _Reporter:
    """Passes the token count on to `_token_sink` about twice a second."""

    def __init__(self, every_s: float = 0.5):
        self.every_s, self.pending, self.last = every_s, 0, time.perf_counter()

    def add(self, tokens: int) -> None:
        self.pending += tokens
        if time.perf_counter() - self.last >= self.every_s:
            self.flush()

    def flush(self) -> None:
        if _token_sink is not None and self.pending:
            _token_sink(self.pending)
        self.pending, self.last = 0, time.perf_counter()


def worker_start(queue, parent_pid: int) -> None:
    """A pool worker's set-up: token counts go to the parent's queue, and the worker ends itself when the
    parent is gone (killed: SIGTERM or SIGKILL leave it no chance to stop its workers)."""
    set_token_sink(queue.put)
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()


def _exit_with_parent(parent_pid: int, every_s: float = 0.5) -> None:
    while os.getppid() == parent_pid:
        time.sleep(every_s)
    os._exit(1)  # the parent's next run resumes; this worker's part files are temporary ones
