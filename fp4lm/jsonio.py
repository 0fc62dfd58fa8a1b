"""JSON files written so that a killed process never leaves half of one, and read tolerantly.

The one home for: the plain-JSON form of values (`json_value`), atomic writes (`write_bytes_atomically`,
and the text and JSON forms on top of it), and reading a JSON-lines file whose last line may be torn (`read_jsonl`).
Imports nothing beyond the standard library, so the report and the trainer can both use it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pathlib
import uuid
from typing import Any


def json_value(value: Any) -> Any:
    """Plain-JSON form: numpy/jax scalars to Python numbers, non-finite floats to None, recursively."""
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    value = float(value)
    return value if math.isfinite(value) else None


def write_bytes_atomically(path: str | pathlib.Path, content: bytes) -> None:
    """Writes `content` to a temporary file beside `path`, then renames it over `path`: fp4lm's one atomic
    writer. The temporary name is unique, so processes (or hosts sharing a file system) writing the same file
    never mix their bytes; a failed write removes it."""
    path = pathlib.Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(content)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def write_text_atomically(path: str | pathlib.Path, text: str) -> None:
    """`text` in UTF-8, written atomically (`write_bytes_atomically`)."""
    write_bytes_atomically(path, text.encode("utf-8"))


def write_json_atomically(path: str | pathlib.Path, payload: Any) -> None:
    """`payload` in plain-JSON form (see `json_value`), indented, written atomically."""
    write_text_atomically(path, json.dumps(json_value(payload), indent=1, allow_nan=False) + "\n")


def read_jsonl(path: str | pathlib.Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file, in order ([] when there is no file). Lines that are not a JSON
    object (a torn last line of a process killed mid-write) are skipped."""
    path = pathlib.Path(path)
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records
