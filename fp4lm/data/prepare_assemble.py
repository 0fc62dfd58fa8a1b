"""`fp4lm prepare`'s last step: the output directory's shards from the finished units' parts (step 3 of
fp4lm/data/prepare.py's docstring)."""

from __future__ import annotations

import os
import pathlib
import uuid

import numpy as np

from fp4lm.data.prepared import SPLITS, file_sha256
from fp4lm.data.shard_writer import ShardWriter, combined_max_token_id, shard_names
from fp4lm.errors import UserError


def assemble(out: pathlib.Path, state: pathlib.Path, records: list[dict], dtype: np.dtype, shard_tokens: int):
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
            **combined_max_token_id(group),
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
