"""Corpus readers: text files and directories, JSONL, Parquet, and pre-tokenized token arrays.

Text-like sources come back as a list of documents (strings); token arrays come back as a 1-D integer
array (memory-mapped where the file allows it). Every mistake in the input is a one-line `UserError`
naming the file, the problem and the fix; its `settings` list the data settings (`path`, `format`,
`jsonl_field`, `vocab_size`) that the fix changes, which the config layer spells as config keys.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import os
import pathlib
import stat
import typing

import numpy as np

from fp4lm.config import DataFormat
from fp4lm.errors import UserError

FORMATS = typing.get_args(DataFormat)  # "auto", then the text formats, then the token-array formats
TEXT_FORMATS = ("text", "jsonl", "parquet")
TOKEN_FORMATS = ("npy", "tokens_uint16", "tokens_uint32")

# A text, JSONL or compressed file is read whole into memory; beyond this size (counted after
# decompression) it is refused rather than exhausting the host. Token files are memory-mapped, with no limit.
MAX_WHOLE_FILE_BYTES = 4 << 30
_TOKEN_DTYPES = {"tokens_uint16": np.uint16, "tokens_uint32": np.uint32}
_COMPRESSION_SUFFIXES = (".gz", ".xz")
_TEXT_SUFFIXES = (".txt", ".text", ".md", ".rst")
_SUFFIX_FORMATS = {
    **{suffix: "text" for suffix in _TEXT_SUFFIXES},
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".npy": "npy",
}


def _suffix(path: pathlib.Path) -> str:
    """The format suffix of `path`, looking through a compression suffix: 'a.jsonl.gz' -> '.jsonl'."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in _COMPRESSION_SUFFIXES:
        suffixes = suffixes[:-1]
    return suffixes[-1] if suffixes else ""


def _format_of_file(path: pathlib.Path) -> str:
    suffix = _suffix(path)
    if suffix == ".bin":
        raise UserError(
            f"{path}: a raw .bin token file needs its integer width; set the format to tokens_uint16 or tokens_uint32",
            settings=("format",),
        )
    return _SUFFIX_FORMATS.get(suffix, "text")


def resolve_format(path: str | pathlib.Path, fmt: str) -> str:
    """The concrete format of `path` ("text", "jsonl", ...); "auto" picks by suffix, directories by content."""
    path = pathlib.Path(path)
    if fmt not in FORMATS:
        raise UserError(f"format {fmt!r} is not a known format; use one of {', '.join(FORMATS)}", settings=("format",))
    if not path.exists():
        raise UserError(
            f"data file {path} does not exist (cwd {pathlib.Path.cwd()}); fix the data path", settings=("path",)
        )
    check_regular_file_or_directory(path)
    if fmt != "auto":
        if path.is_dir() and fmt in TOKEN_FORMATS:
            raise UserError(
                f"{path} is a directory, but the format {fmt} needs one token file; point the data path at that file",
                settings=("path", "format"),
            )
        return fmt
    if path.is_dir():
        files = _directory_files(path, "auto")
        if not files:
            raise UserError(
                f"directory {path} holds no data files (*.txt, *.md, *.jsonl, *.parquet, optionally .gz/.xz); "
                "add some or fix the data path",
                settings=("path",),
            )
        formats = sorted({_format_of_file(f) for f in files})
        if len(formats) > 1:
            raise UserError(
                f"directory {path} mixes formats ({', '.join(formats)}); "
                "keep one format per directory or set the format",
                settings=("format",),
            )
        return formats[0]
    return _format_of_file(path)


_FILE_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


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


def _directory_files(directory: pathlib.Path, fmt: str) -> list[pathlib.Path]:
    """Data files under `directory` (recursive, sorted, hidden entries skipped) whose suffix fits `fmt`."""
    wanted = {"auto": set(_SUFFIX_FORMATS) - {".npy"}, "text": set(_TEXT_SUFFIXES)}.get(
        fmt, {s for s, f in _SUFFIX_FORMATS.items() if f == fmt}
    )
    files = []
    for path in sorted(directory.rglob("*")):
        relative = path.relative_to(directory)
        if any(part.startswith(".") for part in relative.parts) or not path.is_file():
            continue
        if _suffix(path) in wanted:
            files.append(path)
    return files


def _read_bytes(path: pathlib.Path) -> bytes:
    """The file's bytes, decompressed when it ends in .gz or .xz; at most `MAX_WHOLE_FILE_BYTES` of them."""
    check_regular_file_or_directory(path)
    compressed = path.suffix.lower() in _COMPRESSION_SUFFIXES
    # An uncompressed file's size is known without reading it; a compressed one's only by reading (bounded).
    if not compressed and _stat_size(path) > MAX_WHOLE_FILE_BYTES:
        _refuse_too_large(path, compressed)
    try:
        opener = {".gz": gzip.open, ".xz": lzma.open}.get(path.suffix.lower(), open)
        with opener(path, "rb") as f:
            raw = f.read(MAX_WHOLE_FILE_BYTES + 1)
    except (OSError, lzma.LZMAError, EOFError) as exc:
        kind = path.suffix.lower().lstrip(".")
        if isinstance(exc, PermissionError):
            raise UserError(
                f"{path}: cannot read it ({exc.strerror}); fix its permissions", settings=("path",)
            ) from None
        raise UserError(f"{path}: not a valid {kind} file ({exc}); re-create it or decompress it yourself") from None
    if len(raw) > MAX_WHOLE_FILE_BYTES:
        _refuse_too_large(path, compressed)
    return raw


def _stat_size(path: pathlib.Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0  # opening it below reports the problem


def _refuse_too_large(path: pathlib.Path, compressed: bool) -> typing.NoReturn:
    decompressed = " once decompressed" if compressed else ""
    raise UserError(
        f"{path}: larger than {_size(MAX_WHOLE_FILE_BYTES)}{decompressed}, the most a text or JSONL file may "
        "hold (it is read whole into memory); split it into several files in one directory, or use a "
        "pre-tokenized token file (.npy, tokens_uint16, tokens_uint32), which is memory-mapped",
        settings=("path",),
    )


def _size(n: int) -> str:
    return f"{n / (1 << 30):g} GiB" if n >= 1 << 30 else f"{n:,} bytes"


def _decode_utf8(path: pathlib.Path, raw: bytes) -> str:
    """UTF-8 text of `raw`; NUL bytes or invalid UTF-8 mean the file is binary or in another encoding."""
    where = "decompressed byte offset" if path.suffix.lower() in _COMPRESSION_SUFFIXES else "byte offset"
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise UserError(
            f"{path}: NUL byte at {where} {nul}, so this looks like a binary file, not text; "
            "point the data path at a UTF-8 text file (or set the format for token arrays)",
            settings=("path", "format"),
        )
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UserError(
            f"{path}: not valid UTF-8 at {where} {exc.start} ({exc.reason}); "
            "convert it to UTF-8, e.g. `iconv -f latin1 -t utf-8`"
        ) from None


def read_text_file(path: pathlib.Path, *, allow_empty: bool = False) -> str:
    """The whole text of one (optionally .gz/.xz compressed) UTF-8 file; empty files are an error."""
    text = _decode_utf8(path, _read_bytes(path))
    if not text.strip() and not allow_empty:
        raise UserError(f"{path}: the file is empty; put text in it or fix the data path", settings=("path",))
    return text


def read_jsonl_file(path: pathlib.Path, field: str) -> list[str]:
    """The `field` string of every JSON object, one per non-blank line."""
    text = _decode_utf8(path, _read_bytes(path))
    documents = []
    for line_number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(
                f"{path}: line {line_number} is not valid JSON ({exc.msg}, column {exc.colno}); "
                "each line must be one JSON object"
            ) from None
        if not isinstance(record, dict):
            raise UserError(
                f"{path}: line {line_number} is a JSON {type(record).__name__}, not an object; "
                f'write one object per line, e.g. {{"{field}": "..."}}'
            )
        if field not in record:
            keys = ", ".join(repr(k) for k in list(record)[:10]) or "none"
            raise UserError(
                f"{path}: line {line_number} has no field {field!r} (keys: {keys}); "
                "set the JSON field to the one that holds the text",
                settings=("jsonl_field",),
            )
        value = record[field]
        if not isinstance(value, str):
            raise UserError(
                f"{path}: line {line_number} field {field!r} is a JSON {type(value).__name__}, not a string; "
                "set the JSON field to the one that holds the text",
                settings=("jsonl_field",),
            )
        documents.append(value)
    if not any(doc.strip() for doc in documents):
        raise UserError(f"{path}: the file has no text records; put JSON lines with a {field!r} field in it")
    return documents


def read_parquet_file(path: pathlib.Path, column: str) -> list[str]:
    """The strings of one column of a Parquet file (the column's name is the `jsonl_field` setting)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as exc:
        raise UserError(f"{path}: not a valid Parquet file ({_first_line(exc)}); re-create or re-download it") from None
    if column not in schema.names:
        names = ", ".join(repr(n) for n in schema.names[:10]) or "none"
        raise UserError(
            f"{path}: Parquet file has no column {column!r} (columns: {names}); "
            "set the text field to the column that holds the text",
            settings=("jsonl_field",),
        )
    if not (pa.types.is_string(schema.field(column).type) or pa.types.is_large_string(schema.field(column).type)):
        raise UserError(
            f"{path}: Parquet column {column!r} has type {schema.field(column).type}, not string; "
            "set the text field to the column that holds the text",
            settings=("jsonl_field",),
        )
    try:
        values = pq.read_table(path, columns=[column]).column(column).to_pylist()
    except (pa.ArrowException, OSError) as exc:
        raise UserError(f"{path}: not a valid Parquet file ({_first_line(exc)}); re-create or re-download it") from None
    documents = [value for value in values if value is not None]
    if not any(doc.strip() for doc in documents):
        raise UserError(
            f"{path}: Parquet column {column!r} holds no text; fill it or fix the data path", settings=("path",)
        )
    return documents


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def read_documents(path: str | pathlib.Path, fmt: str, field: str = "text") -> list[str]:
    """All documents of a text-like source: one per text file, JSONL line or Parquet row.

    `fmt` is a concrete text format (see `resolve_format`). A directory is read recursively in sorted
    order; empty text files inside a directory are skipped.
    """
    path = pathlib.Path(path)
    assert fmt in TEXT_FORMATS, fmt
    if not path.is_dir():
        return _read_one(path, fmt, field)
    files = _directory_files(path, fmt)
    if not files:
        raise UserError(
            f"directory {path} holds no {fmt} files; add some or fix the data path or the format",
            settings=("path", "format"),
        )
    documents = []
    for file in files:
        if fmt == "text":
            text = read_text_file(file, allow_empty=True)  # an empty file among others is harmless
            documents.extend([text] if text.strip() else [])
        else:
            documents.extend(_read_one(file, fmt, field))
    if not documents:
        raise UserError(
            f"directory {path}: all its {fmt} files are empty; put text in them or fix the data path",
            settings=("path",),
        )
    return documents


def _read_one(path: pathlib.Path, fmt: str, field: str) -> list[str]:
    if fmt == "text":
        return [read_text_file(path)]
    if fmt == "jsonl":
        return read_jsonl_file(path, field)
    return read_parquet_file(path, field)


def read_token_array(path: str | pathlib.Path, fmt: str) -> np.ndarray:
    """A 1-D array of token ids from .npy (any integer dtype) or a raw little-endian uint16/uint32 .bin."""
    path = pathlib.Path(path)
    assert fmt in TOKEN_FORMATS, fmt
    if path.stat().st_size == 0:
        raise UserError(f"{path}: the file is empty; write token ids into it or fix the data path", settings=("path",))
    if fmt == "npy":
        try:
            tokens = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise UserError(f"{path}: not a valid .npy file ({_first_line(exc)}); save it with numpy.save") from None
        if not np.issubdtype(tokens.dtype, np.integer):
            raise UserError(f"{path}: token array has dtype {tokens.dtype}, not integer; save integer token ids")
        tokens = tokens.reshape(-1)
    else:
        dtype = np.dtype(_TOKEN_DTYPES[fmt]).newbyteorder("<")
        size = path.stat().st_size
        if size % dtype.itemsize:
            raise UserError(
                f"{path}: size {size} bytes is not a multiple of {dtype.itemsize} ({fmt}); "
                "check the format (tokens_uint16 or tokens_uint32) or re-write the file",
                settings=("format",),
            )
        tokens = np.memmap(path, dtype=dtype, mode="r")
    if tokens.size == 0:
        raise UserError(
            f"{path}: the token array is empty; write token ids into it or fix the data path", settings=("path",)
        )
    return tokens


def check_token_ids(tokens: np.ndarray, vocab_size: int, path: str | pathlib.Path) -> None:
    """Every id must lie in [0, vocab_size); scans in chunks so memory-mapped arrays stay on disk."""
    chunk = 1 << 24
    for start in range(0, tokens.size, chunk):
        part = np.asarray(tokens[start : start + chunk])
        low, high = int(part.min()), int(part.max())
        if low < 0:
            offset = start + int(np.argmin(part))
            raise UserError(f"{path}: token id {low} at position {offset} is negative; token ids must be >= 0")
        if high >= vocab_size:
            offset = start + int(np.argmax(part))
            raise UserError(
                f"{path}: token id {high} at position {offset} is >= the vocabulary size {vocab_size}; "
                f"set the vocabulary size to at least {high + 1}",
                settings=("vocab_size",),
            )


def source_fingerprint(path: str | pathlib.Path) -> str:
    """A cheap identity of the source (paths, sizes, modification times) for cache keys."""
    path = pathlib.Path(path).resolve()
    files = [path] if path.is_file() else [f for f in sorted(path.rglob("*")) if f.is_file()]
    digest = hashlib.sha256()
    for file in files:
        stat = file.stat()
        digest.update(f"{file}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()
