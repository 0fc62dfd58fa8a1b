"""Text sources for `fp4lm prepare`, streamed: no source file is ever held whole in memory.

A SOURCE is a file, a directory (its data files, recursively, sorted, hidden entries skipped), a glob or a
bundled corpus (`bundled:shakespeare`). Formats, by suffix unless `--format` names one: jsonl (.jsonl .ndjson;
the document is a text field), parquet (.parquet; a text column), text (.txt .text .md .rst; a file, or the
pieces between a delimiter); all but Parquet also .gz, .zst or .xz. Work is cut into `Piece`s that workers can
share (uncompressed JSONL by byte ranges, Parquet by row groups); `read_piece` yields `(text, end_of_document)`.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import io
import json
import lzma
import os
import pathlib
from collections.abc import Iterator

from fp4lm import resources
from fp4lm.errors import UserError

SOURCE_FORMATS = ("auto", "jsonl", "parquet", "text")
_COMPRESSION = (".gz", ".zst", ".xz")
_SUFFIX_FORMATS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".txt": "text",
    ".text": "text",
    ".md": "text",
    ".rst": "text",
}
TEXT_CHUNK_CHARS = 1 << 20  # an undelimited text file is tokenized in pieces of about this many characters


@dataclasses.dataclass(frozen=True)
class Piece:
    """A slice of one source file: bytes [start, stop) of an uncompressed JSONL file, row groups [start, stop)
    of a Parquet file, or the whole file (start 0, stop -1). `weight` is its size in bytes, for planning."""

    path: str
    format: str
    start: int
    stop: int
    weight: int


@dataclasses.dataclass
class BadLines:
    """JSONL lines and Parquet rows skipped with --skip-bad-lines: how many, and where the first one was; and
    Parquet rows whose text is null (always skipped, and counted)."""

    count: int = 0
    first: str = ""
    nulls: int = 0

    def add(self, where: str) -> None:
        self.count += 1
        self.first = self.first or where

    def merge(self, other: BadLines) -> None:
        self.count += other.count
        self.first = self.first or other.first
        self.nulls += other.nulls


def _compression(path: pathlib.Path) -> str:
    suffix = path.suffix.lower()
    return suffix if suffix in _COMPRESSION else ""


def format_of(path: pathlib.Path) -> str | None:
    """The format its suffix says ('a.jsonl.zst' -> 'jsonl'), or None for a file that is no data file."""
    name = path.name.lower()
    compression = _compression(path)
    stem = name[: -len(compression)] if compression else name
    suffix = os.path.splitext(stem)[1]
    fmt = _SUFFIX_FORMATS.get(suffix)
    if fmt == "parquet" and compression:
        return None  # Parquet compresses inside the file
    return fmt


def _is_glob(source: str) -> bool:
    return any(c in source for c in "*?[")


def expand_sources(sources: list[str], fmt: str = "auto") -> list[tuple[pathlib.Path, str]]:
    """Every data file the SOURCE arguments name, in argument order (each directory or glob sorted), once
    each, with its format."""
    if fmt not in SOURCE_FORMATS:
        raise UserError(f"--format {fmt} is not a source format; use one of {', '.join(SOURCE_FORMATS)}")
    if not sources:
        raise UserError("no SOURCE given; name the files, directories or globs to prepare")
    files: dict[pathlib.Path, str] = {}
    for source in sources:
        for path in _files_of(source, fmt):
            path = path.resolve()
            chosen = fmt if fmt != "auto" else format_of(path)
            if chosen is None:
                raise UserError(
                    f"{path}: cannot tell its format from its name; rename it (.jsonl, .parquet, .txt, "
                    "optionally .gz/.zst/.xz) or give --format jsonl|parquet|text"
                )
            files.setdefault(path, chosen)
    return list(files.items())


def _files_of(source: str, fmt: str) -> list[pathlib.Path]:
    if resources.is_bundled(source):  # a corpus shipped in the package (bundled:shakespeare)
        try:
            return [resources.data_file(source)]
        except UserError as error:
            raise UserError(str(error)) from None  # a SOURCE, not data.path
    path = pathlib.Path(source).expanduser()
    if _is_glob(source) and not path.exists():
        matches = sorted(pathlib.Path(p) for p in glob.glob(str(path), recursive=True))
        matches = [m for m in matches if m.is_file()]
        if not matches:
            raise UserError(f"the glob {source!r} matches no files; fix the pattern or the directory it starts from")
        return matches
    if path.is_dir():
        found = [
            f
            for f in sorted(path.rglob("*"))
            if f.is_file()
            and not any(part.startswith(".") for part in f.relative_to(path).parts)
            and (format_of(f) is not None and (fmt == "auto" or format_of(f) == fmt))
        ]
        if not found:
            raise UserError(
                f"directory {source} holds no {'data' if fmt == 'auto' else fmt} files (.jsonl, .parquet, .txt, "
                "optionally .gz/.zst/.xz); add some or fix the SOURCE"
            )
        return found
    if not path.exists():
        raise UserError(f"source {source} does not exist (cwd {pathlib.Path.cwd()}); fix the SOURCE path")
    if not path.is_file():
        raise UserError(f"source {source} is not a regular file or a directory; point SOURCE at data files")
    return [path]


def plan_pieces(files: list[tuple[pathlib.Path, str]], text_field: str, piece_bytes: int) -> list[Piece]:
    """Cuts the files into pieces of about `piece_bytes` (see the module docstring). Parquet files are checked
    here (readable, with a string column `text_field`), so a missing column stops before any work."""
    pieces = []
    for path, fmt in files:
        size = path.stat().st_size
        if fmt == "parquet":
            pieces.extend(_parquet_pieces(path, text_field, piece_bytes))
        elif fmt == "jsonl" and not _compression(path) and size > piece_bytes:
            pieces.extend(
                Piece(str(path), fmt, a, min(a + piece_bytes, size), min(piece_bytes, size - a))
                for a in range(0, size, piece_bytes)
            )
        else:
            pieces.append(Piece(str(path), fmt, 0, -1, size))
    return pieces


def _parquet_pieces(path: pathlib.Path, column: str, piece_bytes: int) -> list[Piece]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        metadata = pq.read_metadata(path)
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as exc:
        raise _not_parquet(path, exc) from None
    if column not in schema.names:
        names = ", ".join(repr(n) for n in schema.names[:10]) or "none"
        raise UserError(
            f"{path}: Parquet file has no column {column!r} (columns: {names}); "
            "give --text-field the column that holds the text",
            settings=("text_field",),
        )
    kind = schema.field(column).type
    values = kind.value_type if pa.types.is_dictionary(kind) else kind  # a dictionary-encoded column of strings
    if not any(test(values) for test in (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view)):
        raise UserError(
            f"{path}: Parquet column {column!r} has type {kind}, not string; give --text-field the text column",
            settings=("text_field",),
        )
    pieces, first, weight = [], 0, 0
    for group in range(metadata.num_row_groups):
        weight += metadata.row_group(group).total_byte_size
        if weight >= piece_bytes or group == metadata.num_row_groups - 1:
            pieces.append(Piece(str(path), "parquet", first, group + 1, weight))
            first, weight = group + 1, 0
    return pieces


def read_piece(
    piece: Piece, *, text_field: str, text_delimiter: str | None, skip_bad_lines: bool, bad_lines: BadLines
) -> Iterator[tuple[str, bool]]:
    """The documents of one piece as `(text, end_of_document)` pairs (see the module docstring)."""
    path = pathlib.Path(piece.path)
    if piece.format == "jsonl":
        yield from _jsonl(piece, text_field, skip_bad_lines, bad_lines)
    elif piece.format == "parquet":
        yield from _parquet(path, piece.start, piece.stop, text_field, skip_bad_lines, bad_lines)
    else:
        yield from _text(path, text_delimiter)


def open_binary(path: pathlib.Path):
    compression = _compression(path)
    if compression == ".gz":
        return gzip.open(path, "rb")
    if compression == ".xz":
        return lzma.open(path, "rb")
    if compression == ".zst":
        return io.BufferedReader(_ZstdReader(path))
    return open(path, "rb")  # noqa: SIM115


class _ZstdReader(io.RawIOBase):
    """A .zst file's frames, decompressed; EOFError when the file ends inside a frame (zstandard's own stream
    reader ends quietly there, so a truncated file would read as a shorter one)."""

    def __init__(self, path: pathlib.Path):
        import zstandard

        self._new = zstandard.ZstdDecompressor().decompressobj
        self._file = open(path, "rb")  # noqa: SIM115 (closed by close)
        self._frame, self._in_frame = self._new(), False
        self._out, self._at = b"", 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self._at == len(self._out):
            compressed = self._file.read(1 << 14)  # small reads bound what one call decompresses
            if not compressed:
                if self._in_frame:
                    raise EOFError("the compressed stream ends inside a frame: the file is truncated")
                return 0
            self._out, self._at = self._decompress(compressed), 0
        count = min(len(buffer), len(self._out) - self._at)
        buffer[:count] = self._out[self._at : self._at + count]
        self._at += count
        return count

    def _decompress(self, compressed: bytes) -> bytes:
        out = []
        while compressed:
            if self._frame.eof:
                self._frame = self._new()
            out.append(self._frame.decompress(compressed))
            self._in_frame = not self._frame.eof
            compressed = self._frame.unused_data if self._frame.eof else b""
        return b"".join(out)

    def close(self) -> None:
        self._file.close()
        super().close()


def _unreadable(path: pathlib.Path, exc: BaseException) -> UserError:
    kind = _compression(path).lstrip(".") or "text"
    return UserError(
        f"{path}: not a valid {kind} file ({exc}); the whole file is needed (--skip-bad-lines does not skip "
        "a damaged file): re-create or re-download it"
    )


def _read_errors():
    import zlib

    import zstandard

    return (OSError, EOFError, lzma.LZMAError, zlib.error, zstandard.ZstdError)


def _line_number(path: pathlib.Path, start: int, index_in_piece: int) -> int:
    """1-based number of the `index_in_piece`-th (0-based) line of the piece that starts at byte `start`. Counts
    the newlines before the piece only when asked (for a bad line), reading in chunks. A piece starting inside
    a line skips that line (the previous piece's), so its first line is one after the line holding byte start-1.
    """
    if start == 0:
        return index_in_piece + 1
    newlines, remaining = 0, start - 1
    with open(path, "rb") as f:
        while remaining:
            chunk = f.read(min(remaining, 1 << 22))
            if not chunk:
                break
            newlines += chunk.count(b"\n")
            remaining -= len(chunk)
    return newlines + 2 + index_in_piece


def _jsonl(piece: Piece, field: str, skip_bad_lines: bool, bad_lines: BadLines) -> Iterator[tuple[str, bool]]:
    path = pathlib.Path(piece.path)
    try:
        with open_binary(path) as f:
            if (
                piece.stop >= 0 and piece.start > 0
            ):  # a byte range: the line holding byte start-1 is the previous piece's
                f.seek(piece.start - 1)
                f.readline()
            index = 0
            while piece.stop < 0 or f.tell() < piece.stop:
                line = f.readline()
                if not line:
                    break
                problem = _jsonl_problem(line, field) if line.strip() else None
                if isinstance(problem, str):
                    where = f"{path}: line {_line_number(path, piece.start, index)}"
                    _bad(where, problem, "line", skip_bad_lines, bad_lines)
                elif problem is not None:
                    yield problem[0], True
                index += 1
    except _read_errors() as exc:
        raise _unreadable(path, exc) from None


def _jsonl_problem(line: bytes, field: str) -> str | tuple[str]:
    """(text,) of a good line, or what is wrong with it."""
    try:
        record = json.loads(line)
    except UnicodeDecodeError as exc:
        return f"is not UTF-8 ({exc.reason})"
    except json.JSONDecodeError as exc:
        return f"is not valid JSON ({exc.msg}, column {exc.colno})"
    if not isinstance(record, dict):
        return f"is a JSON {type(record).__name__}, not an object"
    if field not in record:
        keys = ", ".join(repr(k) for k in list(record)[:10]) or "none"
        return f"has no field {field!r} (keys: {keys}); choose the field that holds the text (--text-field)"
    if not isinstance(record[field], str):
        return f"field {field!r} is a JSON {type(record[field]).__name__}, not a string"
    if b"\\u" in line:  # an escape may encode half of a surrogate pair, which no UTF-8 text holds
        try:
            record[field].encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"holds an invalid Unicode escape (a lone surrogate at character {exc.start} of {field!r})"
    return (record[field],)


def _bad(where: str, problem: str, kind: str, skip_bad_lines: bool, bad_lines: BadLines) -> None:
    """A bad line or row: counted with --skip-bad-lines, else a UserError naming it."""
    if not skip_bad_lines:
        raise UserError(
            f"{where} {problem}; fix the {kind}, or skip such {kind}s with --skip-bad-lines",
            settings=("text_field",) if "has no field" in problem else (),
        )
    bad_lines.add(where)


def _parquet(
    path: pathlib.Path, start: int, stop: int, column: str, skip_bad_lines: bool, bad_lines: BadLines
) -> Iterator[tuple[str, bool]]:
    """Row groups [start, stop): each row's text; a null is skipped and counted, invalid UTF-8 is a bad row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
        row = sum(parquet.metadata.row_group(group).num_rows for group in range(start)) + 1
        for batch in parquet.iter_batches(batch_size=1024, row_groups=range(start, stop), columns=[column]):
            for text in _parquet_texts(batch.column(0)):
                if isinstance(text, str):
                    yield text, True
                elif text is None:
                    bad_lines.nulls += 1
                else:
                    _bad(f"{path}: row {row}", f"is not valid UTF-8 ({text.reason})", "row", skip_bad_lines, bad_lines)
                row += 1
    except (pa.ArrowException, OSError) as exc:
        raise _not_parquet(path, exc) from None


def _not_parquet(path: pathlib.Path, exc: BaseException) -> UserError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return UserError(f"{path}: not a valid Parquet file ({first}); re-create or re-download it")


def _parquet_texts(values) -> list:
    """The column's values as str or None, or the UnicodeDecodeError of a value that is not UTF-8."""
    try:
        return values.to_pylist()
    except UnicodeDecodeError:
        texts = []
        for index in range(len(values)):
            try:
                texts.append(values[index].as_py())
            except UnicodeDecodeError as exc:
                texts.append(exc)
        return texts


def _text(path: pathlib.Path, delimiter: str | None) -> Iterator[tuple[str, bool]]:
    try:
        with open_binary(path) as raw, io.TextIOWrapper(raw, encoding="utf-8-sig", newline="") as f:
            if delimiter is None:
                chunk = _next_lines(f)
                while chunk:
                    following = _next_lines(f)
                    yield chunk, not following
                    chunk = following
                return
            pending = ""
            while chunk := _next_lines(f):
                pending += chunk
                *documents, pending = pending.split(delimiter)
                for document in documents:
                    yield document, True
            yield pending, True
    except UnicodeDecodeError as exc:
        raise UserError(
            f"{path}: not valid UTF-8 ({exc.reason}); convert it to UTF-8, e.g. `iconv -f latin1 -t utf-8`"
        ) from None
    except _read_errors() as exc:
        raise _unreadable(path, exc) from None


def _next_lines(f) -> str:
    """About TEXT_CHUNK_CHARS characters, ending at a line end (or the end of the file)."""
    chunk = f.read(TEXT_CHUNK_CHARS)
    if chunk and not chunk.endswith("\n"):
        chunk += f.readline()
    return chunk
