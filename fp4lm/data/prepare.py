"""`fp4lm prepare`: tokenize text sources once into a prepared directory (format: fp4lm.data.prepared).

How the work is cut, so that the result does not depend on the number of workers or on interruptions:

1. The sources are expanded and cut into pieces (fp4lm.data.sources.plan_pieces), and consecutive pieces are
   grouped into units of about `piece_bytes`. The plan depends only on the files' names and sizes.
2. Each unit is tokenized by one worker into its own part files under DIR/.prepare/ (a new train part when
   the current one would pass `shard_tokens`), each written under a temporary name and renamed when whole;
   the unit's record (unit-NNNNN.json, written atomically last) marks it finished. A rerun of the same command
   skips finished units, so an interruption (Ctrl-C, kill -9) loses at most the units in flight.
3. When every unit is finished, the train parts are renamed, in unit order, to train-00000.npy, ...; the
   small validation parts are concatenated, in unit order, into val shards of up to `shard_tokens`. The
   tokenizer is saved beside them in its standard files (what `fp4lm train data.path=DIR` opens). Then
   manifest.json is written (last: it marks DIR complete) and DIR/.prepare/ is removed.

Workers are spawned processes (never forked: the parent may hold threads) that open the tokenizer themselves.
A document longer than `shard_tokens` gets a shard of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import pathlib
import shutil
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

from fp4lm.data.prepared import (
    MANIFEST_FILE,
    SPLITS,
    PreparedCorpus,
    ShardWriter,
    file_sha256,
    is_validation_digest,
    make_manifest,
    read_manifest,
    shard_names,
    token_dtype,
    write_manifest,
)
from fp4lm.data.sources import BadLines, Piece, expand_sources, plan_pieces, read_piece
from fp4lm.errors import UserError
from fp4lm.jsonio import write_text_atomically

STATE_DIR = ".prepare"
DEFAULT_SHARD_TOKENS = 1 << 27  # 256 MiB of uint16 tokens per shard at most
DEFAULT_PIECE_BYTES = 64 << 20  # source bytes per unit of work
DEFAULT_VAL_FRACTION = 0.005


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

    def check(self) -> None:
        if not 0.0 <= self.val_fraction < 1.0:
            raise UserError(f"--val-fraction {self.val_fraction} is outside [0, 1); use e.g. 0.005")
        if self.shard_tokens < 1:
            raise UserError(f"--shard-tokens {self.shard_tokens} is not positive; use e.g. {DEFAULT_SHARD_TOKENS}")
        if self.piece_bytes < 1:
            raise ValueError(f"piece_bytes={self.piece_bytes} must be positive")
        if self.text_delimiter == "":
            raise UserError("--text-delimiter is empty; give the string that separates documents, or leave it out")


# ---------------------------------------------------------------- the tokenizer, in the parent and in workers


def open_tokenizer(spec: str):
    """The tokenizer `spec` names (a path, or "byte"); its mistakes are phrased for --tokenizer."""
    from fp4lm.data.tokenizer import open_tokenizer as open_any

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


def _resolve_spec(spec: str) -> str:
    """A tokenizer file's absolute path (workers may start elsewhere); a name as it is."""
    path = pathlib.Path(spec).expanduser()
    return str(path.resolve()) if path.exists() else spec


_WORKER_TOKENIZER: dict[tuple[str, str], Any] = {}  # the tokenizer a worker opened, by (spec, fingerprint)


def _worker_tokenizer(spec: str, fingerprint: str):
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


class _UnitWriter:
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
    tokenizer = _worker_tokenizer(unit.tokenizer, entry["fingerprint"])
    bos, eos, vocab = entry["bos_id"], entry["eos_id"], entry["vocab_size"]
    head = np.array([] if bos is None else [bos], np.int64)
    tail = np.array([] if eos is None else [eos], np.int64)
    options, bad_lines = unit.options, BadLines()
    writer, reporter = _UnitWriter(unit), _Reporter()
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
                chunks.append(np.asarray(tokenizer.encode(text), dtype=np.int64))
                if not end:
                    continue
                ids = np.concatenate(chunks) if len(chunks) > 1 else chunks[0]
                reporter.add(ids.size + head.size + tail.size if ids.size else 0)
                if ids.size:
                    if ids.min() < 0 or ids.max() >= vocab:
                        raise RuntimeError(f"the tokenizer produced an id outside [0, {vocab}) for {piece.path}")
                    split = "val" if is_validation_digest(digest.digest(), options.val_fraction) else "train"
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
    }
    write_text_atomically(unit.record_path, json.dumps(record) + "\n")
    return record


# Where a unit reports the tokens it made as it goes (for the progress bar): the parent's progress in the
# parent's process, a queue to the parent in a worker (set by the pool's initializer); None: nowhere.
_token_sink: Callable[[int], None] | None = None


def _set_token_sink(sink) -> None:
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


def _worker_start(queue) -> None:
    _set_token_sink(queue.put)


def _read_record(unit: Unit) -> dict | None:
    """The record of a unit an earlier run finished, or None."""
    try:
        return json.loads(unit.record_path.read_text())
    except (OSError, ValueError):
        return None


def _group_units(pieces: list[Piece], piece_bytes: int) -> list[tuple[Piece, ...]]:
    """Consecutive pieces grouped until each group holds about `piece_bytes` (small files share a unit)."""
    groups, current, weight = [], [], 0
    for piece in pieces:
        current.append(piece)
        weight += piece.weight
        if weight >= piece_bytes:
            groups.append(tuple(current))
            current, weight = [], 0
    if current:
        groups.append(tuple(current))
    return groups


# ---------------------------------------------------------------- the driver


def prepare(
    sources: list[str],
    *,
    tokenizer: str,
    out: str | os.PathLike,
    options: Options = Options(),
    workers: int = 1,
    progress: str = "auto",
    stream=None,
) -> PreparedCorpus:
    """Prepares `sources` into `out` (see the module docstring); returns the corpus. Refuses an `out` that
    holds anything but an unfinished prepare of the same inputs; a complete one of the same inputs is kept."""
    stream = stream or sys.stdout
    options.check()
    if workers < 1:
        raise UserError(f"--workers {workers} is not positive; use 1 or more (e.g. the number of CPU cores)")
    spec = _resolve_spec(tokenizer)
    opened = open_tokenizer(spec)
    entry = tokenizer_entry(opened)
    dtype = token_dtype(entry["vocab_size"])
    files = expand_sources(sources, options.format)
    out = pathlib.Path(out).expanduser().resolve()
    for path, _ in files:
        if path.is_relative_to(out):
            raise UserError(f"source {path} lies inside --out {out}; choose an --out outside the sources")
    request = {
        "sources": [{"path": str(p), "bytes": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns} for p, _ in files],
        "tokenizer": entry,
        "options": dataclasses.asdict(options),
    }
    if (out / MANIFEST_FILE).exists():
        return _already_prepared(out, request, stream)
    pieces = plan_pieces(files, options.text_field, options.piece_bytes)
    state, created = _claim(out, request)
    units = [
        Unit(i, group, str(state), spec, entry, dtype.name, options)
        for i, group in enumerate(_group_units(pieces, options.piece_bytes))
    ]
    display = _Progress(progress, stream, len(units))
    try:
        records, hashes = _run(units, [p for p, _ in files], workers, display)
    except UserError:
        _forget(out, state, created)
        raise
    except KeyboardInterrupt:
        raise KeyboardInterrupt(
            f"interrupted; run the same command again to resume (finished parts in {state} are kept)"
        ) from None
    finally:
        display.finish()
    if not any(record["parts"]["train"] or record["parts"]["val"] for record in records):
        _forget(out, state, created)
        raise UserError(
            f"the sources ({len(files)} files) hold no text to tokenize (empty documents"
            f"{', skipped lines' if options.skip_bad_lines else ''}); check the SOURCEs and --text-field"
        )
    shards = _assemble(out, state, records, np.dtype(dtype), options.shard_tokens)
    sources_entry = [{"path": str(p), "bytes": p.stat().st_size, "sha256": hashes[str(p)]} for p, _ in files]
    manifest = make_manifest(
        tokenizer=entry, dtype=dtype, val_fraction=options.val_fraction, sources=sources_entry, shards=shards
    )
    bad = sum(r["bad_lines"] for r in records)
    manifest["options"] = {**dataclasses.asdict(options), "skipped_lines": bad}
    opened.save(out)  # its standard files (tokenizer.json or .model, tokenizer_config.json), where training finds it
    write_manifest(out, manifest)
    shutil.rmtree(state)
    corpus = PreparedCorpus.open(out)
    _summary(corpus, records, stream)
    return corpus


def _already_prepared(out: pathlib.Path, request: dict, stream) -> PreparedCorpus:
    """`out` is complete: nothing to do when it was prepared from these inputs, else a refusal."""
    manifest = read_manifest(out)
    differences = []
    if manifest["tokenizer"].get("fingerprint") != request["tokenizer"]["fingerprint"]:
        differences.append("another tokenizer")
    recorded = {k: v for k, v in manifest.get("options", {}).items() if k != "skipped_lines"}
    if recorded != request["options"]:
        differences.append("other options")
    paths = [(s["path"], s["bytes"]) for s in manifest["sources"]]
    if paths != [(s["path"], s["bytes"]) for s in request["sources"]]:
        differences.append("other sources")
    elif any(file_sha256(s["path"]) != s["sha256"] for s in manifest["sources"]):
        differences.append("sources whose contents changed since")
    if differences:
        raise UserError(
            f"--out {out} already holds a prepared corpus made from {' and '.join(differences)}; "
            "choose a new --out (prepare never overwrites)"
        )
    corpus = PreparedCorpus.open(out)
    shutil.rmtree(out / STATE_DIR, ignore_errors=True)  # left by a run stopped between its manifest and cleanup
    print(f"{out} is already prepared from these sources with this tokenizer; nothing to do", file=stream)
    return corpus


def _claim(out: pathlib.Path, request: dict) -> tuple[pathlib.Path, bool]:
    """DIR/.prepare for this request: resumed when an earlier run of the same request left it, created in a
    new or empty `out`; anything else is refused. Returns it and whether `out` itself was created now."""
    state = out / STATE_DIR
    request_file = state / "request.json"
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a directory (new or empty)")
    if request_file.is_file():
        if json.loads(request_file.read_text()) != request:
            raise UserError(
                f"--out {out} holds an unfinished prepare of other sources, tokenizer or options; "
                f"rerun that command to finish it, or choose another --out"
            )
        return state, False
    created = not out.exists()
    # (A state directory without its request is a run stopped right after creating it: nothing in it yet.)
    if not created and any(p.name != STATE_DIR or not p.is_dir() or any(p.iterdir()) for p in out.iterdir()):
        raise UserError(f"--out {out} is not empty; choose a new or empty directory (prepare never overwrites)")
    state.mkdir(parents=True, exist_ok=True)
    write_text_atomically(request_file, json.dumps(request) + "\n")
    return state, created


def _forget(out: pathlib.Path, state: pathlib.Path, created: bool) -> None:
    """After a user error: remove what this run created, so the corrected command starts afresh."""
    shutil.rmtree(state, ignore_errors=True)
    if created:
        with contextlib.suppress(OSError):  # not empty: something else was put there meanwhile
            out.rmdir()


@contextlib.contextmanager
def _interrupts_ignored():
    """SIGINT ignored while processes are started (they inherit it); as it was before, after."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set signal handlers, and only it receives SIGINT
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _run(units: list[Unit], files: list[pathlib.Path], workers: int, progress: _Progress):
    """Runs every unfinished unit and hashes every source; returns (records in unit order, path -> sha256)."""
    records: dict[int, dict] = {}
    for unit in units:
        record = _read_record(unit)
        if record is not None:
            records[unit.index] = record
            progress.done(record, resumed=True)
    pending = [u for u in units if u.index not in records]
    hashes: dict[str, str] = {}
    if workers == 1:
        _set_token_sink(progress.tokens)
        try:
            for unit in pending:
                records[unit.index] = run_unit(unit)
                progress.done(records[unit.index])
        finally:
            _set_token_sink(None)
        hashes = {str(f): file_sha256(f) for f in files}
    else:
        import multiprocessing

        # Workers ignore Ctrl-C: they start with SIGINT ignored (inherited, so even while they import), and
        # the parent stops them (terminate) and says how to resume. A worker stopped mid-unit leaves only
        # temporary files.
        context = multiprocessing.get_context("spawn")
        token_queue = context.Queue()
        with _interrupts_ignored():
            pool = context.Pool(workers, initializer=_worker_start, initargs=(token_queue,))
        with pool:
            done = pool.imap_unordered(run_unit, pending)
            hashing = pool.map_async(file_sha256, files)
            for _ in pending:
                record = _next_record(done, token_queue, progress)
                records[record["unit"]] = record
                progress.done(record)
            hashes = dict(zip(map(str, files), hashing.get(), strict=True))
    return [records[u.index] for u in units], hashes


def _next_record(done, token_queue, progress: _Progress) -> dict:
    """The next record from the pool's unordered results; meanwhile the workers' token counts are shown."""
    import multiprocessing
    import queue

    while True:
        with contextlib.suppress(queue.Empty):
            while True:
                progress.tokens(token_queue.get_nowait())
        try:
            return done.next(timeout=0.2)
        except multiprocessing.TimeoutError:
            pass


def _assemble(out: pathlib.Path, state: pathlib.Path, records: list[dict], dtype: np.dtype, shard_tokens: int):
    """The shards of `out` from the units' parts (see the module docstring); idempotent, so a run interrupted
    here finishes on the next. Returns the manifest's shard entries per split."""
    shards: dict[str, list[dict]] = {split: [] for split in SPLITS}
    for record in records:
        for part in record["parts"]["train"]:
            file, docs = shard_names("train", len(shards["train"]))
            _move(out, state, part["docs"], docs)
            _move(out, state, part["file"], file)
            shards["train"].append({**part, "file": file, "docs": docs})
    groups: list[list[dict]] = []
    tokens = 0
    for part in (part for record in records for part in record["parts"]["val"]):
        if not groups or tokens + part["tokens"] > shard_tokens:
            groups.append([])
            tokens = 0
        groups[-1].append(part)
        tokens += part["tokens"]
    for index, group in enumerate(groups):
        file, docs = shard_names("val", index)
        if not (out / file).exists():
            _concatenate(out, state, group, file, docs, dtype)
        entry = {
            "file": file,
            "docs": docs,
            "tokens": sum(p["tokens"] for p in group),
            "documents": sum(p["documents"] for p in group),
            "sha256": file_sha256(out / file),
        }
        shards["val"].append(entry)
    return shards


def _move(out: pathlib.Path, state: pathlib.Path, part: str, final: str) -> None:
    if (state / part).exists():
        os.replace(state / part, out / final)
    elif not (out / final).exists():
        raise UserError(f"the unfinished prepare in {out} lost its part {part}; remove {out} and run the command again")


def _concatenate(out: pathlib.Path, state: pathlib.Path, parts: list[dict], file: str, docs: str, dtype) -> None:
    """One val shard from several small parts, document by document (the docs index is written first)."""
    writer = ShardWriter(state, file, docs, dtype, suffix=f".{uuid.uuid4().hex[:8]}.tmp")  # temporary files in state
    for part in parts:
        tokens = np.load(state / part["file"], mmap_mode="r")
        starts = np.load(state / part["docs"])
        for begin, end in zip(starts, np.append(starts[1:], tokens.shape[0]), strict=True):
            writer.add(np.asarray(tokens[begin:end]))
    writer.finish()
    os.replace(writer.docs_path, out / docs)
    os.replace(writer.tokens_path, out / file)


class _Progress:
    """A rich progress bar (units done, tokens, tokens/s) on a terminal; plain lines every few seconds
    otherwise; nothing with mode "off". Workers report tokens as they go (`tokens`), units when done."""

    def __init__(self, mode: str, stream, total_units: int, *, every_s: float = 5.0):
        from fp4lm.extras import available

        self.stream, self.total_units, self.every_s = stream, total_units, every_s
        self.enabled = mode != "off"
        terminal = hasattr(stream, "isatty") and stream.isatty()
        self.rich = self.enabled and mode != "plain" and terminal and available("rich.progress")
        self.units = self.earlier_tokens = self.new_tokens = 0
        self.start = self.last = time.perf_counter()
        self._bar = self._task = None
        if self.rich:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                TextColumn("[bold]prepare"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("units {task.fields[tokens]} tokens {task.fields[rate]} tok/s"),
                TimeElapsedColumn(),
                console=Console(file=stream),
            )
            self._bar.start()
            self._task = self._bar.add_task("prepare", total=total_units, tokens="0", rate="-")

    def tokens(self, count: int) -> None:
        self.new_tokens += count
        self._show()

    def done(self, record: dict, *, resumed: bool = False) -> None:
        self.units += 1
        if resumed:  # an earlier run's unit: counted, but not in this run's rate
            self.earlier_tokens += sum(part["tokens"] for split in SPLITS for part in record["parts"][split])
        self._show()

    def _show(self) -> None:
        rate = self.new_tokens / max(time.perf_counter() - self.start, 1e-9)
        tokens = self.earlier_tokens + self.new_tokens
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=self.units, tokens=f"{tokens:,}", rate=f"{rate:,.0f}")
        elif self.enabled and time.perf_counter() - self.last >= self.every_s:
            self.last = time.perf_counter()
            line = f"prepare: {self.units}/{self.total_units} units, {tokens:,} tokens, {rate:,.0f} tok/s"
            print(line, file=self.stream, flush=True)

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def _summary(corpus: PreparedCorpus, records: list[dict], stream) -> None:
    splits = corpus.manifest["splits"]
    parts = [
        f"{name} {splits[name]['tokens']:,} tokens in {splits[name]['documents']:,} documents "
        f"({len(splits[name]['shards'])} shard{'' if len(splits[name]['shards']) == 1 else 's'})"
        for name in SPLITS
    ]
    print(f"prepared {corpus.directory}: {', '.join(parts)}; {corpus.manifest['dtype']}", file=stream)
    bad = sum(r["bad_lines"] for r in records)
    if bad:
        first = next(r["first_bad_line"] for r in records if r["first_bad_line"])
        print(f"skipped {bad:,} bad JSONL lines (the first: {first})", file=stream)


def verify(directory: str | os.PathLike, stream=None) -> PreparedCorpus:
    """Checks a prepared directory's every byte against its manifest (`fp4lm prepare --verify DIR`)."""
    corpus = PreparedCorpus.open(directory)
    corpus.verify()
    shards = sum(len(corpus.manifest["splits"][name]["shards"]) for name in SPLITS)
    print(f"{corpus.directory}: {shards} shards match the manifest", file=stream or sys.stdout)
    return corpus


def describe_os_error(error: OSError) -> str:
    """One line for a failed read or write while preparing."""
    where = f" {error.filename}" if error.filename else ""
    if error.errno == errno.ENOSPC:
        return f"no space left on the device writing{where}; free disk space and run the same command again to resume"
    return f"cannot access{where}: {error.strerror or error}; check the paths and permissions, then run it again"


def run_prepare_command(ns) -> int:
    """`fp4lm prepare` with its parsed arguments (fp4lm.cli)."""
    try:
        if ns.verify and ns.out is None:
            for directory in ns.sources:
                verify(directory)
            return 0
        if ns.out is None or ns.tokenizer is None:
            raise UserError(
                "fp4lm prepare: --tokenizer and --out are required (or --verify DIR to check a prepared directory); "
                "see fp4lm prepare --help"
            )
        options = Options(
            format=ns.format,
            text_field=ns.text_field,
            text_delimiter=ns.text_delimiter,
            skip_bad_lines=ns.skip_bad_lines,
            val_fraction=ns.val_fraction,
            shard_tokens=ns.shard_tokens or DEFAULT_SHARD_TOKENS,
        )
        prepare(
            ns.sources, tokenizer=ns.tokenizer, out=ns.out, options=options, workers=ns.workers, progress=ns.progress
        )
        if ns.verify:
            verify(ns.out)
    except OSError as error:
        raise UserError(describe_os_error(error)) from None
    return 0
