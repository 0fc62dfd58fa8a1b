"""Reading an export back with the safetensors library itself (its NumPy loader lacks float8, so the raw
bytes it returns are viewed here)."""

from __future__ import annotations

import json
import pathlib

import ml_dtypes
import numpy as np
import safetensors

NUMPY_DTYPES = {
    "F32": np.float32,
    "BF16": ml_dtypes.bfloat16,
    "F16": np.float16,
    "U8": np.uint8,
    "F8_E4M3": ml_dtypes.float8_e4m3fn,
}


def read_file(path: pathlib.Path) -> dict[str, np.ndarray]:
    tensors = {}
    for name, entry in safetensors.deserialize(path.read_bytes()):
        array = np.frombuffer(bytes(entry["data"]), NUMPY_DTYPES[entry["dtype"]]).reshape(entry["shape"])
        tensors[name] = array
    with safetensors.safe_open(str(path), framework="numpy") as opened:  # the header, as transformers reads it
        assert opened.metadata()["format"] == "pt"
        assert sorted(opened.keys()) == sorted(tensors)
    return tensors


def read_checkpoint(directory: pathlib.Path) -> dict[str, np.ndarray]:
    """Every tensor of model.safetensors, or of the shards the index names (each name in exactly one file)."""
    index = directory / "model.safetensors.index.json"
    if not index.exists():
        return read_file(directory / "model.safetensors")
    weight_map = json.loads(index.read_text())["weight_map"]
    tensors: dict[str, np.ndarray] = {}
    for file_name in sorted(set(weight_map.values())):
        shard = read_file(directory / file_name)
        assert all(weight_map[name] == file_name for name in shard)
        assert not set(shard) & set(tensors)
        tensors.update(shard)
    assert sorted(tensors) == sorted(weight_map)
    return tensors
