"""A raw source (a text, JSONL or Parquet file, compressed or not, a directory of them, a bundled corpus, or a
pre-tokenized file) is prepared by `fp4lm prepare`'s code into a cache, so raw text trains exactly as its
prepared form does.

A source's cache is a prepared directory named by a key: a hash of the source files' paths, sizes and
modification times (what `fp4lm prepare` records of them), the tokenizer's fingerprint and the prepare options.
A run finds it in RUN_DIR/data_cache/<key>. Otherwise it is built in a staging directory outside the run
directory (`staging_root`), because reading the data must not write into a run directory before the run is
accepted; `keep_in_run_dir` copies it there once it is, so a resume needs nothing but the run directory.

Splits: a source of several documents holds out whole documents by prepare's hash rule. A single text or token
file, and a source whose held-out documents leave a split shorter than one sequence, take the tail split
instead: the last `val_fraction` of the tokens.
"""

from __future__ import annotations

import codecs
import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import stat
import tempfile
import typing
import uuid

from fp4lm.config import DataFormat
from fp4lm.data.prepare import Options, prepare
from fp4lm.data.prepared import FORMAT, MANIFEST_FILE, PreparedCorpus, is_validation
from fp4lm.data.sources import BadLines, expand_sources, format_of, open_binary, plan_pieces, read_piece
from fp4lm.data.token_files import TOKEN_FORMATS, prepare_token_file, tokenizer_for_token_file
from fp4lm.errors import UserError
from fp4lm.tokenizer import Tokenizer, open_tokenizer

CACHE_DIR = "data_cache"
FORMATS = typing.get_args(DataFormat)  # "auto", the text formats, the token-file formats
_FILE_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
_SNIFF_BYTES = 1 << 16


def staging_root() -> pathlib.Path:
    """Where caches are built before a run directory may hold them (one directory per user)."""
    return pathlib.Path(tempfile.gettempdir()) / f"fp4lm-data-cache-{os.getuid()}"


def check_regular_file_or_directory(path: pathlib.Path) -> None:
    """Refuses devices, FIFOs and sockets before anything opens them (a FIFO would block forever, /dev/zero
    would never end): the data must be a regular file or a directory of them."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise UserError(f"{path}: cannot read it ({exc.strerror}); fix the data path", settings=("path",)) from None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return
    kind = next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")
    raise UserError(
        f"{path} is {kind}, not a regular file; point the data path at a file or a directory of files "
        "(copy a stream to a file first)",
        settings=("path",),
    )


def source_files(path: pathlib.Path, fmt: str) -> list[tuple[pathlib.Path, str]]:
    """The data files of a raw source with their formats; a single file of unknown suffix is text."""
    if fmt not in FORMATS:
        raise UserError(f"format {fmt!r} is not a known format; use one of {', '.join(FORMATS)}", settings=("format",))
    if not path.exists():
        raise UserError(
            f"data file {path} does not exist (cwd {pathlib.Path.cwd()}); fix the data path", settings=("path",)
        )
    check_regular_file_or_directory(path)
    if path.is_dir():
        if fmt in TOKEN_FORMATS:
            raise UserError(
                f"{path} is a directory, but the format {fmt} needs one token file; point the data path at that file",
                settings=("path", "format"),
            )
        try:
            return expand_sources([str(path)], fmt)
        except UserError as error:
            raise UserError(str(error), settings=("path",)) from None
    if fmt == "auto":
        name = path.name.lower()
        if name.endswith(".bin"):
            raise UserError(
                f"{path}: a raw .bin token file needs its integer width; set the format to tokens_uint16 or "
                "tokens_uint32",
                settings=("format",),
            )
        fmt = "npy" if name.endswith(".npy") else format_of(path) or "text"
    if fmt not in TOKEN_FORMATS:
        _check_text_file(path, fmt)
    return [(path.resolve(), fmt)]


def _check_text_file(path: pathlib.Path, fmt: str) -> None:
    """An empty file, or one whose first bytes hold a NUL (a binary file), is refused by name."""
    empty = UserError(f"{path}: the file is empty; put text in it or fix the data path", settings=("path",))
    if path.stat().st_size == 0:
        raise empty
    if fmt == "parquet":
        return
    try:
        with open_binary(path) as f:
            head = f.read(_SNIFF_BYTES)
    except PermissionError as exc:
        raise UserError(f"{path}: cannot read it ({exc.strerror}); fix its permissions", settings=("path",)) from None
    except Exception:  # noqa: BLE001  (reading it while preparing names the problem)
        return
    whole = len(head) < _SNIFF_BYTES
    if fmt == "text" and whole and not head.strip():
        raise empty
    nul = head.find(b"\x00")
    if nul >= 0:
        raise UserError(
            f"{path}: NUL byte at byte offset {nul}, so this looks like a binary file, not text; "
            "point the data path at a UTF-8 text file (or set the format for token arrays)",
            settings=("path", "format"),
        )
    if fmt == "text":
        try:
            codecs.getincrementaldecoder("utf-8")().decode(head, final=whole)
        except UnicodeDecodeError as exc:
            raise UserError(
                f"{path}: not valid UTF-8 at byte offset {exc.start} ({exc.reason}); "
                "convert it to UTF-8, e.g. `iconv -f latin1 -t utf-8`"
            ) from None


def make_tokenizer(files: list[tuple[pathlib.Path, str]], data_cfg, *, tail_split: bool) -> Tokenizer:
    """The tokenizer data.tokenizer names; bpe is trained on the source's training text."""
    if files[0][1] in TOKEN_FORMATS:
        return tokenizer_for_token_file(files[0][0], data_cfg)
    if data_cfg.tokenizer != "bpe":
        return open_tokenizer(data_cfg.tokenizer, vocab_size=data_cfg.vocab_size)
    text = _training_text(files, data_cfg, tail_split=tail_split)
    return open_tokenizer("bpe", vocab_size=data_cfg.vocab_size, training_text=text)


def _training_text(files: list[tuple[pathlib.Path, str]], data_cfg, *, tail_split: bool) -> str:
    """The documents a BPE learns from, joined by blank lines: those not held out, or the text before the tail."""
    documents, chunks = [], []
    for piece in plan_pieces(files, data_cfg.text_field, 1 << 62):
        read = read_piece(
            piece, text_field=data_cfg.text_field, text_delimiter=None, skip_bad_lines=False, bad_lines=BadLines()
        )
        for text, end in read:
            chunks.append(text)
            if end:
                documents.append("".join(chunks))
                chunks = []
    if not tail_split:
        kept = [d for d in documents if not is_validation(d, data_cfg.val_fraction)]
        documents = kept or documents
    text = "\n\n".join(documents)
    return text[: int(len(text) * (1.0 - data_cfg.val_fraction))] if tail_split else text


def prepare_options(files: list[tuple[pathlib.Path, str]], data_cfg, *, tail_split: bool) -> Options:
    """The options under which prepare reads exactly `files`: the format data.format names, else a single
    file's own (its suffix may say nothing), else each file's by suffix."""
    fmt = data_cfg.format if data_cfg.format not in ("auto", *TOKEN_FORMATS) else "auto"
    fmt = files[0][1] if fmt == "auto" and len(files) == 1 else fmt
    return Options(
        format=fmt, text_field=data_cfg.text_field, val_fraction=data_cfg.val_fraction, tail_split=tail_split
    )


def cache_key(files: list[tuple[pathlib.Path, str]], tokenizer: Tokenizer, options: Options) -> str:
    parts = {
        "format": FORMAT,
        "sources": [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p, _ in files],
        "tokenizer": tokenizer.fingerprint,
        "options": dataclasses.asdict(options),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def open_cached(
    source: pathlib.Path,
    files: list[tuple[pathlib.Path, str]],
    data_cfg,
    tokenizer: Tokenizer,
    run_dir,
    *,
    tail_split: bool,
) -> tuple[PreparedCorpus, str]:
    """The prepared cache of `source` (see the module docstring): the run directory's, or the staged one,
    built now if there is none. Returns it and its key."""
    options = prepare_options(files, data_cfg, tail_split=tail_split)
    key = cache_key(files, tokenizer, options)
    if run_dir is not None and (pathlib.Path(run_dir) / CACHE_DIR / key / MANIFEST_FILE).is_file():
        return PreparedCorpus.open(pathlib.Path(run_dir) / CACHE_DIR / key), key
    staged = staging_root() / key
    if not (staged / MANIFEST_FILE).is_file():
        _build(source, files, data_cfg, tokenizer, options, staged)
    return PreparedCorpus.open(staged), key


def _build(source, files, data_cfg, tokenizer: Tokenizer, options: Options, staged: pathlib.Path) -> None:
    """Prepares the source into a private directory, then renames it into place (whole, or not at all)."""
    building = staged.with_name(f".{staged.name}.{uuid.uuid4().hex[:8]}.tmp")
    building.mkdir(parents=True)
    try:
        if files[0][1] in TOKEN_FORMATS:
            path, fmt = files[0]
            out = building / "corpus"
            prepare_token_file(path, fmt, tokenizer, data_cfg.vocab_size, dataclasses.asdict(options), out)
        else:
            tokenizer.save(building / "tokenizer")
            out = building / "corpus"
            print(f"data: tokenizing {source} into a token cache (once per source, tokenizer and options)", flush=True)
            corpus = prepare(
                [str(source.resolve())],
                tokenizer=str(building / "tokenizer"),
                out=out,
                options=options,
                progress="plain",  # a line every few seconds while a large source is tokenized
                summary=False,  # it would name the staging directory
            )
            if nulls := corpus.manifest["options"].get("null_texts", 0):
                print(f"data: note: skipped {nulls:,} Parquet rows of {source} whose text is null", flush=True)
        try:
            os.rename(out, staged)
        except OSError:
            if not (staged / MANIFEST_FILE).is_file():  # another process staged the same cache meanwhile
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)


def keep_in_run_dir(corpus: PreparedCorpus, key: str, run_dir) -> None:
    """Copies a staged cache into RUN_DIR/data_cache/<key> (hard links where the file system allows)."""
    final = pathlib.Path(run_dir) / CACHE_DIR / key
    if final.exists() or corpus.directory == final:
        return
    partial = final.with_name(f".{key}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        shutil.copytree(corpus.directory, partial, copy_function=_link_or_copy)
        os.rename(partial, final)
    except OSError:
        pass  # best effort: without it a resumed run prepares the source again, with the run's tokenizer
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


def remove_other_caches(run_dir, keys: set[str]) -> None:
    """Best effort: caches of other data (an earlier attempt's) are removed from the run directory."""
    directory = pathlib.Path(run_dir) / CACHE_DIR
    try:
        for entry in directory.iterdir():
            if entry.name not in keys:
                shutil.rmtree(entry, ignore_errors=True)
    except OSError:
        pass


def check_no_old_cache(run_dir) -> None:
    """A run directory made before raw sources were prepared holds an npz token cache, which is not read."""
    if run_dir is not None and any((pathlib.Path(run_dir) / CACHE_DIR).glob("tokens-*.npz")):
        raise UserError(
            f"run directory {run_dir} holds a token cache of an older fp4lm ({CACHE_DIR}/tokens-*.npz), which this "
            "version does not read; start a new run directory, or resume it with the fp4lm that made it",
            settings=("run_dir",),
        )
