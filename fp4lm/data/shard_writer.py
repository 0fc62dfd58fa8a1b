"""Writing a prepared directory (layout: fp4lm/data/prepared.py): shards streamed the way `numpy.save` would
write them, so a shard never has to fit in memory, and the manifest, written last."""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np

from fp4lm.data.prepared import FORMAT, MANIFEST_FILE, MAX_TOKEN_ID, SPLITS, file_sha256
from fp4lm.jsonio import write_text_atomically


class ShardWriter:
    """Streams documents into one token shard and its document index under temporary names.

    The token file is a .npy written as `numpy.save` would write the whole array: a header sized for the final
    length (numpy leaves room in the header for that) is rewritten once the length is known. `finish()` returns
    the shard's manifest entry, with the largest token id written (seen as the tokens stream by: training
    checks it against the vocabulary without reading the shard); the caller renames the files into place
    (`tokens_path`, `docs_path` are the temporary paths, `file`/`docs` the final names).
    """

    def __init__(self, directory: pathlib.Path, file: str, docs: str, dtype: np.dtype, *, suffix: str = ".tmp"):
        self.file, self.docs, self.dtype = file, docs, np.dtype(dtype)
        self.tokens_path = directory / (file + suffix)
        self.docs_path = directory / (docs + suffix)
        self._f = open(self.tokens_path, "wb")  # noqa: SIM115 (closed by finish or abandon)
        self._header_bytes = self._write_header(0)
        self._starts: list[int] = []
        self.num_tokens = 0
        self.max_token_id: int | None = None

    def _write_header(self, length: int) -> int:
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": (length,)}
        start = self._f.tell()
        np.lib.format.write_array_header_1_0(self._f, header)
        return self._f.tell() - start

    def add(self, tokens: np.ndarray, *, new_document: bool = True) -> None:
        """Appends one whole document (its tokens, BOS/EOS included), or with `new_document=False` more of the
        last one; an empty one is left out."""
        if len(tokens) == 0:
            return
        if new_document or not self._starts:
            self._starts.append(self.num_tokens)
        written = np.ascontiguousarray(tokens, dtype=self.dtype)
        largest = int(written.max())
        self.max_token_id = largest if self.max_token_id is None else max(self.max_token_id, largest)
        self._f.write(written.tobytes())
        self.num_tokens += len(tokens)

    @property
    def num_documents(self) -> int:
        return len(self._starts)

    def finish(self) -> dict:
        self._f.seek(0)
        if self._write_header(self.num_tokens) != self._header_bytes:  # numpy reserves room for 21 digits
            raise RuntimeError("the .npy header changed size")
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        with open(self.docs_path, "wb") as f:
            np.save(f, np.asarray(self._starts, dtype=np.int64))
            f.flush()
            os.fsync(f.fileno())
        return {
            "file": self.file,
            "docs": self.docs,
            "tokens": self.num_tokens,
            "documents": self.num_documents,
            MAX_TOKEN_ID: self.max_token_id,
            "sha256": file_sha256(self.tokens_path),
        }

    def abandon(self) -> None:
        self._f.close()
        for path in (self.tokens_path, self.docs_path):
            path.unlink(missing_ok=True)


def combined_max_token_id(entries: list[dict]) -> dict:
    """{MAX_TOKEN_ID: the largest of the entries'} for a shard made of their parts; {} when one part has none
    (written by an older fp4lm before a resumed prepare): opening the corpus then reads that shard instead."""
    if not all(MAX_TOKEN_ID in entry for entry in entries):
        return {}
    ids = [entry[MAX_TOKEN_ID] for entry in entries if entry[MAX_TOKEN_ID] is not None]
    return {MAX_TOKEN_ID: max(ids) if ids else None}


def shard_names(split: str, index: int) -> tuple[str, str]:
    """The file names of shard `index` of `split`: ("train-00003.npy", "train-00003.docs.npy")."""
    return f"{split}-{index:05d}.npy", f"{split}-{index:05d}.docs.npy"


def make_manifest(
    *, tokenizer: dict, dtype: np.dtype, val_fraction: float, sources: list[dict], shards: dict[str, list[dict]]
) -> dict:
    """The manifest of a prepared directory (see the module docstring), keys in a fixed order."""
    splits = {
        name: {
            "tokens": sum(s["tokens"] for s in shards.get(name, [])),
            "documents": sum(s["documents"] for s in shards.get(name, [])),
            "shards": list(shards.get(name, [])),
        }
        for name in SPLITS
    }
    return {
        "format": FORMAT,
        "tokenizer": tokenizer,
        "dtype": np.dtype(dtype).name,
        "val_fraction": float(val_fraction),
        "sources": sources,
        "splits": splits,
    }


def write_manifest(directory: pathlib.Path, manifest: dict) -> None:
    """Writes manifest.json atomically (the last file of a prepare: it marks the directory complete)."""
    write_text_atomically(directory / MANIFEST_FILE, json.dumps(manifest, indent=1) + "\n")
