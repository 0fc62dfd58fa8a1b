"""Writing and reading safetensors files, sharded with an index above a size threshold.

The file format (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length, a JSON
header `{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}` padded with spaces
to a multiple of 8 bytes, then the tensors' bytes, row-major, back to back. Files are written here
directly (the safetensors library's NumPy writer has no float8 types), one tensor after the other; the
tests read every export back with the library itself.

Above `max_shard_bytes` the tensors are split, in order, over `model-0000i-of-0000n.safetensors`, and
`model.safetensors.index.json` maps each tensor name to its file (Hugging Face's layout).
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import struct
from collections.abc import Iterable, Iterator
from typing import Any

import ml_dtypes
import numpy as np

from fp4lm.errors import UserError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3  # Hugging Face's default shard size (5 GB)

DTYPE_CODES = {
    np.dtype(np.float32): "F32",
    np.dtype(ml_dtypes.bfloat16): "BF16",
    np.dtype(np.float16): "F16",
    np.dtype(np.uint8): "U8",
    np.dtype(np.int32): "I32",
    np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3",
}
DTYPES_BY_CODE = {code: dtype for dtype, code in DTYPE_CODES.items()}


def _header(tensors: list[tuple[str, np.ndarray]], metadata: dict[str, str]) -> bytes:
    entries: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for name, array in tensors:
        entries[name] = {
            "dtype": DTYPE_CODES[array.dtype],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
    text = json.dumps(entries, separators=(",", ":")).encode("utf-8")
    return text + b" " * (-len(text) % 8)


def write_file(path: pathlib.Path, tensors: list[tuple[str, np.ndarray]], metadata: dict[str, str]) -> None:
    """One safetensors file holding `tensors` (name, array) in order."""
    tensors = [(name, np.asarray(array, order="C")) for name, array in tensors]  # 0-d arrays stay 0-d
    header = _header(tensors, metadata)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(header)))
        out.write(header)
        for _, array in tensors:
            out.write(array.tobytes())


def _shards(tensors: list[tuple[str, np.ndarray]], max_shard_bytes: int) -> list[list[tuple[str, np.ndarray]]]:
    shards: list[list[tuple[str, np.ndarray]]] = [[]]
    size = 0
    for name, array in tensors:
        if shards[-1] and size + array.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, array))
        size += array.nbytes
    return shards


def write_checkpoint(
    directory: pathlib.Path,
    tensors: Iterable[tuple[str, np.ndarray]],
    *,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    metadata: dict[str, str] | None = None,
) -> list[str]:
    """`model.safetensors`, or shards and an index when the tensors exceed `max_shard_bytes`; the file names.
    `metadata` adds entries to each file's `__metadata__`."""
    tensors = list(tensors)
    metadata = {"format": "pt", **(metadata or {})}  # transformers reads files marked "pt"
    shards = _shards(tensors, max_shard_bytes)
    if len(shards) == 1:
        write_file(directory / SINGLE_FILE, shards[0], metadata)
        return [SINGLE_FILE]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map = {}
    for file_name, shard in zip(names, shards, strict=True):
        write_file(directory / file_name, shard, metadata)
        weight_map.update({name: file_name for name, _ in shard})
    index = {"metadata": {"total_size": sum(a.nbytes for _, a in tensors)}, "weight_map": weight_map}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return [*names, INDEX_FILE]


@contextlib.contextmanager
def opened(path: pathlib.Path, what: str) -> Iterator[Any]:
    """`safetensors.safe_open(path)` (NumPy); a truncated or corrupt file, on opening or reading a tensor, is a
    one-line UserError naming the file and `what` gave it (e.g. "train.init_from=DIR"), not a library error."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as handle:
            yield handle
    except (SafetensorError, OSError) as error:
        detail = str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__
        raise UserError(
            f"{what}: {path} is damaged or not a safetensors file ({detail}); copy or download it again"
        ) from None


def read_index(path: pathlib.Path, what: str) -> dict[str, str]:
    """The weight map (tensor name -> file name) of a model.safetensors.index.json; a damaged index is one line."""
    try:
        weight_map = json.loads(path.read_text(encoding="utf-8"))["weight_map"]
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise TypeError("weight_map is not a mapping of tensor names to file names")
    except (ValueError, KeyError, TypeError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        detail = f"no {error.args[0]}" if isinstance(error, KeyError) else str(error).splitlines()[0][:160]
        raise UserError(f"{what}: {path} is damaged ({detail}); copy or download it again") from None
    return weight_map
