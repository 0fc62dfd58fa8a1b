"""Pre-tokenized sources (a .npy array of integer ids, or raw little-endian uint16/uint32 ids): checked, and
copied into a prepared directory as one document, so training reads them like any other source."""

from __future__ import annotations

import os
import pathlib

import numpy as np

from fp4lm.data.prepare_worker import tokenizer_entry
from fp4lm.data.prepared import token_dtype
from fp4lm.data.shard_writer import ShardWriter, make_manifest, shard_names, write_manifest
from fp4lm.data.token_ids import CHUNK_TOKENS, first_position, id_extremes
from fp4lm.errors import UserError
from fp4lm.tokenizer import TOKENIZER_FILE, BPETokenizer, Tokenizer, check_tokenizer_matches, open_tokenizer

TOKEN_FORMATS = ("npy", "tokens_uint16", "tokens_uint32")
_RAW_DTYPES = {"tokens_uint16": np.uint16, "tokens_uint32": np.uint32}


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def read_token_array(path: pathlib.Path, fmt: str) -> np.ndarray:
    """A 1-D array of token ids, memory-mapped: from a .npy file (any integer dtype) or a raw .bin."""
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
        dtype = np.dtype(_RAW_DTYPES[fmt]).newbyteorder("<")
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


def check_token_ids(tokens: np.ndarray, vocab_size: int, path: pathlib.Path) -> None:
    """Every id must lie in [0, vocab_size); one scan in chunks, so memory-mapped arrays stay on disk."""
    low, high = id_extremes(tokens)
    if low is not None:
        raise UserError(
            f"{path}: token id {low} at position {first_position(tokens, low)} is negative; token ids must be >= 0"
        )
    if high is not None and high >= vocab_size:
        raise UserError(
            f"{path}: token id {high} at position {first_position(tokens, high)} is >= the vocabulary size "
            f"{vocab_size}; set the vocabulary size to at least {high + 1}",
            settings=("vocab_size",),
        )


def check_token_file(path: pathlib.Path, fmt: str, vocab_size: int) -> None:
    """A readable token file whose ids all lie in [0, vocab_size) (checked on every load: the limit is the
    run's, not the cache's)."""
    check_token_ids(read_token_array(path, fmt), vocab_size, path)


def tokenizer_for_token_file(path: pathlib.Path, data_cfg) -> Tokenizer:
    """The byte tokenizer, a tokenizer file data.tokenizer names, or (bpe) the tokenizer.json beside the file:
    ids that are already made cannot train a BPE."""
    if data_cfg.tokenizer != "bpe":
        return open_tokenizer(data_cfg.tokenizer, vocab_size=data_cfg.vocab_size)
    beside = path.parent / TOKENIZER_FILE
    if not beside.is_file():
        raise UserError(
            f"{path} is pre-tokenized, so the bpe tokenizer needs the tokenizer that made it; put its "
            f"tokenizer.json at {beside} (or use the byte tokenizer)",
            settings=("tokenizer",),
        )
    tokenizer = open_tokenizer(beside)
    if isinstance(tokenizer, BPETokenizer):
        check_tokenizer_matches(tokenizer, data_cfg.tokenizer, data_cfg.vocab_size, str(beside))
    return tokenizer


def prepare_token_file(
    path: pathlib.Path, fmt: str, tokenizer: Tokenizer, vocab_size: int | None, options: dict, out: pathlib.Path
) -> None:
    """Writes the token file's ids into `out` as a prepared directory of one document in "train" (read with the
    tail split, see fp4lm/data/prepared.py); `options` are recorded in its manifest."""
    tokens = read_token_array(path, fmt)
    out.mkdir(parents=True)
    dtype = token_dtype(max(vocab_size or 0, tokenizer.vocab_size))
    writer = ShardWriter(out, *shard_names("train", 0), dtype)
    for start in range(0, tokens.size, CHUNK_TOKENS):
        writer.add(np.asarray(tokens[start : start + CHUNK_TOKENS]), new_document=False)
    shards: dict[str, list[dict]] = {"train": [writer.finish()], "val": []}
    os.replace(writer.tokens_path, out / writer.file)
    os.replace(writer.docs_path, out / writer.docs)
    stat = path.stat()
    manifest = make_manifest(
        tokenizer=tokenizer_entry(tokenizer),
        dtype=dtype,
        val_fraction=options["val_fraction"],
        sources=[{"path": str(path), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}],
        shards=shards,
    )
    manifest["options"] = options
    tokenizer.save(out)
    write_manifest(out, manifest)
