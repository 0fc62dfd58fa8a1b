"""`fp4lm prepare`: tokenize text sources once into a prepared directory (format: fp4lm.data.prepared).

The result does not depend on the number of workers or on interruptions: the plan (pieces grouped into units)
depends only on the files' names and sizes; each unit is tokenized by one worker into part files under
DIR/.prepare/ and marked finished by its record, so a rerun skips finished units; at the end the parts are
renamed or concatenated, in unit order, into the shards, the tokenizer is saved beside them and manifest.json
is written last. Workers are spawned processes. A unit of work is prepare_worker.py, the last step
prepare_assemble.py, the progress display prepare_progress.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import pathlib
import shutil
import signal
import sys
import threading

import numpy as np

from fp4lm.config import DEFAULT_VAL_FRACTION
from fp4lm.data.prepare_assemble import assemble
from fp4lm.data.prepare_progress import Progress
from fp4lm.data.prepare_worker import (
    DEFAULT_PIECE_BYTES,
    DEFAULT_SHARD_TOKENS,
    Options,
    Unit,
    open_tokenizer,
    run_unit,
    set_token_sink,
    tokenizer_entry,
    worker_start,
)
from fp4lm.data.prepared import (
    MANIFEST_FILE,
    SPLITS,
    PreparedCorpus,
    file_sha256,
    read_manifest,
    token_dtype,
)
from fp4lm.data.shard_writer import make_manifest, write_manifest
from fp4lm.data.sources import Piece, expand_sources, plan_pieces
from fp4lm.errors import UserError
from fp4lm.file_lock import FileLock
from fp4lm.jsonio import write_text_atomically

__all__ = [
    "DEFAULT_PIECE_BYTES",
    "DEFAULT_SHARD_TOKENS",
    "STATE_DIR",
    "Options",
    "describe_os_error",
    "open_tokenizer",
    "prepare",
    "run_prepare_command",
    "verify",
]

STATE_DIR = ".prepare"


def _resolve_spec(spec: str) -> str:
    """A tokenizer file's absolute path (workers may start elsewhere); a name as it is."""
    path = pathlib.Path(spec).expanduser()
    return str(path.resolve()) if path.exists() else spec


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
    options: Options | None = None,
    workers: int = 1,
    progress: str = "auto",
    stream=None,
    summary: bool = True,
) -> PreparedCorpus:
    """Prepares `sources` into `out` (see the module docstring); returns the corpus. Refuses an `out` that
    holds anything but an unfinished prepare of the same inputs; a complete one of the same inputs is kept.
    `stream` takes the progress lines and, unless `summary=False`, the closing summary."""
    stream = stream or sys.stdout
    options = options or Options()
    options.check()
    if workers < 1:
        raise UserError(f"--workers {workers} is not positive; use 1 or more (e.g. the number of CPU cores)")
    spec = _resolve_spec(tokenizer)
    opened = open_tokenizer(spec)
    entry = tokenizer_entry(opened)
    token_dtype(entry["vocab_size"])  # a vocabulary no token width holds is refused before anything is made
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
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a directory (new or empty)")
    made = [d for d in (out, *out.parents) if not d.exists()]  # removed again if this run fails before any work
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        created = _make_dir(out)
        busy = f"--out {out} is in use by another `fp4lm prepare`; wait for it to finish, stop it, or choose another"
        with FileLock(out, busy):
            return _prepare_locked(
                out, created, files, request, opened, spec, options, workers, progress, stream, summary
            )
    finally:
        for directory in made:
            with contextlib.suppress(OSError):  # not empty: this run's work (or another's) is kept
                directory.rmdir()


def _make_dir(out: pathlib.Path) -> bool:
    """Makes `out`; whether this call made it (two runs racing: only one did)."""
    try:
        out.mkdir()
    except FileExistsError:
        return False
    return True


def _prepare_locked(out, created, files, request, opened, spec, options, workers, progress, stream, summary):
    """`prepare` once it holds `out`'s lock (one prepare per output directory)."""
    entry = request["tokenizer"]
    dtype = token_dtype(entry["vocab_size"])
    if (out / MANIFEST_FILE).exists():
        return _already_prepared(out, request, stream)
    pieces = plan_pieces(files, options.text_field, options.piece_bytes)
    state = _claim(out, request)
    units = [
        Unit(i, group, str(state), spec, entry, dtype.name, options)
        for i, group in enumerate(_group_units(pieces, options.piece_bytes))
    ]
    workers = _worker_count(workers, len(units), options.piece_bytes, stream)
    display = Progress(progress, stream, len(units))
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
        more = f" and {len(files) - 1} more files" if len(files) > 1 else ""
        raise UserError(
            f"{files[0][0]}{more}: no text records to tokenize (empty documents"
            f"{', skipped lines' if options.skip_bad_lines else ''}); "
            "check the sources and the text field (--text-field)",
            settings=("path", "text_field"),
        )
    shards = assemble(out, state, records, np.dtype(dtype), options.shard_tokens)
    sources_entry = [{"path": str(p), "bytes": p.stat().st_size, "sha256": hashes[str(p)]} for p, _ in files]
    manifest = make_manifest(
        tokenizer=entry, dtype=dtype, val_fraction=options.val_fraction, sources=sources_entry, shards=shards
    )
    bad = sum(r["bad_lines"] for r in records)
    nulls = sum(r.get("null_texts", 0) for r in records)
    manifest["options"] = {**dataclasses.asdict(options), "skipped_lines": bad, "null_texts": nulls}
    opened.save(out)  # its standard files (tokenizer.json or .model, tokenizer_config.json), where training finds it
    write_manifest(out, manifest)
    shutil.rmtree(state)
    corpus = PreparedCorpus.open(out)
    if summary:
        _summary(corpus, records, stream)
    return corpus


def _already_prepared(out: pathlib.Path, request: dict, stream) -> PreparedCorpus:
    """`out` is complete: nothing to do when it was prepared from these inputs, else a refusal."""
    manifest = read_manifest(out)
    differences = []
    if manifest["tokenizer"].get("fingerprint") != request["tokenizer"]["fingerprint"]:
        differences.append("another tokenizer")
    recorded = {k: v for k, v in manifest.get("options", {}).items() if k not in ("skipped_lines", "null_texts")}
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


def _worker_count(workers: int, units: int, piece_bytes: int, stream) -> int:
    """--workers, at most one per unit of work and one per CPU core the process may use; a note says so."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    used = min(workers, units, cores)
    if used < workers:
        why = f"{units} unit{'s' if units != 1 else ''} of work (about {piece_bytes / 2**20:g} MiB of source each)"
        print(f"note: --workers {workers}: using {used} ({why}, {cores} CPU cores)", file=stream)
    return used


def _claim(out: pathlib.Path, request: dict) -> pathlib.Path:
    """DIR/.prepare for this request: resumed when an earlier run of the same request left it, created in a
    new or empty `out`; anything else is refused."""
    state = out / STATE_DIR
    request_file = state / "request.json"
    if request_file.is_file():
        if json.loads(request_file.read_text()) != request:
            raise UserError(
                f"--out {out} holds an unfinished prepare of other sources, tokenizer or options; "
                f"rerun that command to finish it, or choose another --out"
            )
        return state
    # (A state directory without its request is a run stopped right after creating it: nothing in it yet.)
    if any(p.name != STATE_DIR or not p.is_dir() or any(p.iterdir()) for p in out.iterdir()):
        raise UserError(f"--out {out} is not empty; choose a new or empty directory (prepare never overwrites)")
    state.mkdir(exist_ok=True)
    write_text_atomically(request_file, json.dumps(request) + "\n")
    return state


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


def _run(units: list[Unit], files: list[pathlib.Path], workers: int, progress: Progress):
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
        set_token_sink(progress.tokens)
        try:
            for unit in pending:
                records[unit.index] = run_unit(unit)
                progress.done(records[unit.index])
        finally:
            set_token_sink(None)
        hashes = {str(f): file_sha256(f) for f in files}
    else:
        import multiprocessing

        # Workers ignore Ctrl-C: they start with SIGINT ignored (inherited, so even while they import), and
        # the parent stops them (terminate) and says how to resume. A worker stopped mid-unit leaves only
        # temporary files.
        context = multiprocessing.get_context("spawn")
        token_queue = context.Queue()
        with _interrupts_ignored():
            pool = context.Pool(workers, initializer=worker_start, initargs=(token_queue, os.getpid()))
        with pool:
            done = pool.imap_unordered(run_unit, pending)
            hashing = pool.map_async(file_sha256, files)
            for _ in pending:
                record = _next_record(done, token_queue, progress)
                records[record["unit"]] = record
                progress.done(record)
            hashes = dict(zip(map(str, files), hashing.get(), strict=True))
    return [records[u.index] for u in units], hashes


def _next_record(done, token_queue, progress: Progress) -> dict:
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
        print(f"skipped {bad:,} bad lines or rows (the first: {first})", file=stream)
    nulls = sum(r.get("null_texts", 0) for r in records)
    if nulls:
        print(f"skipped {nulls:,} Parquet rows whose text is null", file=stream)


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
            val_fraction=DEFAULT_VAL_FRACTION if ns.val_fraction is None else ns.val_fraction,
            shard_tokens=DEFAULT_SHARD_TOKENS if ns.shard_tokens is None else ns.shard_tokens,
            tail_split=ns.tail_split,
        )
        prepare(
            ns.sources, tokenizer=ns.tokenizer, out=ns.out, options=options, workers=ns.workers, progress=ns.progress
        )
        if ns.verify:
            verify(ns.out)
    except OSError as error:
        raise UserError(describe_os_error(error)) from None
    except UserError as error:  # the settings it names are training's (data.text_field); here they are flags
        raise UserError(str(error)) from None
    return 0
