"""Reading a prepared corpus: the directory `fp4lm prepare` writes, memory-mapped, never loaded whole.

Layout of a prepared directory DIR (format "fp4lm-prepared/1"):

    DIR/manifest.json            written last, atomically: its presence means the directory is complete
    DIR/<split>-NNNNN.npy        1-D uint16 (vocabulary <= 65536) or uint32 token ids, one shard
    DIR/<split>-NNNNN.docs.npy   1-D int64: where each document starts inside that shard (0 first, increasing)

for the splits "train" and "val". Every document is stored as [bos_id if the tokenizer has one] + its tokens +
[eos_id if it has one], and lies in one shard (documents never straddle shards). A document is in "val" when
int.from_bytes(sha256(text.encode()).digest()[:8], "big") / 2**64 < val_fraction, so the split depends only on
the text. A shard's "sha256" in the manifest is the hash of its token file's bytes (the whole .npy file), and
its "max_token_id" the largest id it holds (null when empty; absent from manifests of older fp4lm versions).

`PreparedCorpus.open(DIR)` checks the manifest and every shard's size against it (cheap: no shard is read);
`check_token_ids()`, done when training opens a corpus, compares each shard's recorded largest id with the
vocabulary (reading a shard only when its entry has none); `verify()` re-hashes every token shard and checks
every document index and token id (reads everything once).
Writing shards and the manifest: fp4lm/data/shard_writer.py.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import pathlib

import numpy as np

from fp4lm.data.token_ids import id_extremes
from fp4lm.errors import UserError

FORMAT = "fp4lm-prepared/1"
MANIFEST_FILE = "manifest.json"
MAX_TOKEN_ID = "max_token_id"  # a shard entry's largest token id
SPLITS = ("train", "val")
_HASH_CHUNK_BYTES = 1 << 22


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id of the vocabulary fits (vocab_size <= 65536), else uint32; beyond uint32 is refused."""
    if vocab_size <= 1 << 16:
        return np.dtype(np.uint16)
    if vocab_size <= 1 << 32:
        return np.dtype(np.uint32)
    raise UserError(
        f"the tokenizer's vocabulary has {vocab_size:,} tokens, more than a uint32 token id can hold (4,294,967,296); "
        "use a tokenizer with a smaller vocabulary"
    )


def is_validation(text: str, val_fraction: float) -> bool:
    """Whether a document goes to the validation split: a hash of its text, so workers and order do not matter."""
    return is_validation_digest(hashlib.sha256(text.encode("utf-8")).digest(), val_fraction)


def is_validation_digest(digest: bytes, val_fraction: float) -> bool:
    """`is_validation` from the sha256 digest of the document's UTF-8 text (hashed as it streams by)."""
    return int.from_bytes(digest[:8], "big") / 2**64 < val_fraction


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 hex of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _not_prepared(directory: pathlib.Path, why: str) -> UserError:
    return UserError(f"{directory} is not a complete prepared corpus ({why}); create it with `fp4lm prepare`")


def _damaged(directory: pathlib.Path, file: str, why: str) -> UserError:
    return UserError(
        f"{directory / file}: {why}, so the prepared corpus is damaged; "
        f"prepare it again into a new directory (`fp4lm prepare ... --out NEW_DIR`)"
    )


def _check_array(directory: pathlib.Path, file: str, dtype: np.dtype, length: int) -> int:
    """Checks one .npy file's header (1-D, `dtype`, `length` entries) and its exact size on disk (a truncated or
    extended file is refused) without reading its contents; returns where its data starts."""
    path = directory / file
    if not path.is_file():
        raise _damaged(directory, file, "the file is missing")
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = (
                np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            )
            shape, fortran_order, found = read_header(f)
            offset = f.tell()
    except (ValueError, OSError, EOFError) as exc:
        raise _damaged(directory, file, f"it is not a readable .npy file ({str(exc).splitlines()[0]})") from None
    if len(shape) != 1 or fortran_order or found != dtype:
        raise _damaged(directory, file, f"it holds {found} of shape {shape}, not 1-D {dtype}")
    if shape[0] != length:
        raise _damaged(directory, file, f"it holds {shape[0]:,} entries, the manifest says {length:,}")
    size, expected = path.stat().st_size, offset + length * dtype.itemsize
    if size != expected:
        raise _damaged(
            directory, file, f"it is {size:,} bytes long, not the {expected:,} its header and manifest imply"
        )
    return offset


class TokenShards:
    """One split's shards seen as one token array (their concatenation in manifest order), memory-mapped.

    At most `max_open` shards are mapped at once (the least recently used is let go), so a corpus of thousands
    of shards stays within the process's limit on open files.
    """

    def __init__(self, directory: pathlib.Path, shards: list[dict], dtype: np.dtype, *, max_open: int = 64):
        self.directory = directory
        self.dtype = dtype
        self.shard_entries = shards
        self._offsets = [_check_array(directory, s["file"], dtype, int(s["tokens"])) for s in shards]
        for s in shards:
            _check_array(directory, s["docs"], np.dtype(np.int64), int(s["documents"]))
        sizes = np.array([int(s["tokens"]) for s in shards], dtype=np.int64)
        self._bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)  # shard i: [bounds[i], bounds[i+1])
        self.num_tokens = int(self._bounds[-1])
        self.num_documents = sum(int(s["documents"]) for s in shards)
        self._document_starts: np.ndarray | None = None
        self._open: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
        self._max_open = max_open

    @property
    def num_shards(self) -> int:
        return len(self.shard_entries)

    def gather(self, offsets: np.ndarray) -> np.ndarray:
        """The tokens at global `offsets` (any shape of int64 in [0, num_tokens)), in the shards' dtype.

        Reads only the pages holding those tokens: a contiguous window of offsets (a training sequence) touches
        one or two shards.
        """
        offsets = np.asarray(offsets, dtype=np.int64)
        flat = offsets.reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() >= self.num_tokens):
            raise IndexError(f"token offsets must lie in [0, {self.num_tokens}); got [{flat.min()}, {flat.max()}]")
        out = np.empty(flat.shape, dtype=self.dtype)
        shard_of = np.searchsorted(self._bounds, flat, side="right") - 1
        for shard in np.unique(shard_of):
            where = shard_of == shard
            out[where] = self.shard_tokens(int(shard))[flat[where] - self._bounds[shard]]
        return out.reshape(offsets.shape)

    @property
    def document_starts(self) -> np.ndarray:
        """Global start offset (int64) of every document of the split, increasing; read once, then kept (8 bytes
        per document)."""
        if self._document_starts is None:
            parts = [self.shard_document_starts(i) + self._bounds[i] for i in range(self.num_shards)]
            self._document_starts = np.concatenate(parts) if parts else np.zeros((0,), np.int64)
        return self._document_starts

    def shard_tokens(self, index: int) -> np.ndarray:
        """Shard `index`'s tokens, memory-mapped."""
        if index in self._open:
            self._open.move_to_end(index)
            return self._open[index]
        entry = self.shard_entries[index]
        length = int(entry["tokens"])
        if length == 0:
            return np.zeros((0,), self.dtype)
        tokens = np.memmap(
            self.directory / entry["file"], dtype=self.dtype, mode="r", offset=self._offsets[index], shape=(length,)
        )
        self._open[index] = tokens
        if len(self._open) > self._max_open:
            self._open.popitem(last=False)
        return tokens

    def shard_document_starts(self, index: int) -> np.ndarray:
        """Shard `index`'s document starts (offsets inside the shard), read into memory."""
        return np.load(self.directory / self.shard_entries[index]["docs"], allow_pickle=False)


class TokenView:
    """Tokens [start, stop) of one split's shards seen as a 1-D array: `size`, `dtype`, `view[offsets]` (any
    shape of integer offsets; reads only the pages holding them) and `document_starts`. The one kind of token
    stream training reads."""

    def __init__(self, shards: TokenShards, start: int = 0, stop: int | None = None):
        self.shards = shards
        self.start = start
        self.stop = shards.num_tokens if stop is None else stop
        self.size = self.stop - self.start
        self.dtype = shards.dtype

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, offsets) -> np.ndarray:
        if isinstance(offsets, (int, np.integer, slice)):  # as for an array: negative from the end, slices
            offsets = np.arange(self.size, dtype=np.int64)[offsets]
        return self.shards.gather(np.asarray(offsets, dtype=np.int64) + self.start)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """Every token, read into memory (np.asarray(view))."""
        del copy  # always a new array
        return self[:].astype(dtype or self.dtype)

    @property
    def document_starts(self) -> np.ndarray:
        """Where each document starts inside the view; a document cut by the view's start begins at 0."""
        starts = self.shards.document_starts
        inside = starts[(starts >= self.start) & (starts < self.stop)] - self.start
        if self.size and (inside.size == 0 or inside[0] != 0):
            inside = np.concatenate([[0], inside]).astype(np.int64)
        return inside


class PreparedCorpus:
    """A complete prepared directory: `manifest`, `dtype`, `tokenizer_fingerprint`, `split(name)`, `verify()`.

    Prepared with the tail split (manifest option "tail_split", for single-document sources), every document
    is stored in "train" and the validation split is the last `val_fraction` of its tokens."""

    def __init__(self, directory: pathlib.Path, manifest: dict):
        self.directory = directory
        self.manifest = manifest
        self.dtype = np.dtype(manifest["dtype"])
        self.tokenizer_fingerprint: str = manifest["tokenizer"]["fingerprint"]
        self._shards = {name: TokenShards(directory, manifest["splits"][name]["shards"], self.dtype) for name in SPLITS}
        train = self._shards["train"]
        if manifest.get("options", {}).get("tail_split"):
            cut = train.num_tokens - int(round(train.num_tokens * float(manifest["val_fraction"])))
            self._views = {"train": TokenView(train, 0, cut), "val": TokenView(train, cut)}
        else:
            self._views = {name: TokenView(shards) for name, shards in self._shards.items()}

    @classmethod
    def open(cls, directory: str | os.PathLike) -> PreparedCorpus:
        directory = pathlib.Path(directory)
        manifest = read_manifest(directory)
        return cls(directory, manifest)

    @property
    def tokenizer(self) -> dict:
        return self.manifest["tokenizer"]

    def split(self, name: str) -> TokenShards:
        """The shards stored for split `name`."""
        if name not in self._shards:
            raise KeyError(f"no split {name!r}; the splits are {', '.join(SPLITS)}")
        return self._shards[name]

    def view(self, name: str) -> TokenView:
        """The tokens training reads as split `name` (with the tail split: a part of the stored "train")."""
        return self._views[name]

    def check_token_ids(self, *, scan: bool = False) -> None:
        """Every token id is below the tokenizer's vocabulary size (an id beyond it trains to NaN); done when
        training opens the corpus. Each shard's largest id is the one its manifest entry records (nothing is
        read); a shard whose entry has none (a corpus prepared before fp4lm recorded it), or every shard with
        `scan` (`verify`), is read once, and a recorded largest id the shard contradicts is damage too.
        UserError naming the first bad shard."""
        vocab = int(self.manifest["tokenizer"]["vocab_size"])
        any_id_fits = vocab > np.iinfo(self.dtype).max  # every id the dtype holds is in the vocabulary
        for name in SPLITS:
            shards = self._shards[name]
            for index, entry in enumerate(shards.shard_entries):
                if MAX_TOKEN_ID in entry and not scan:
                    largest, said = entry[MAX_TOKEN_ID], "the manifest records token id"
                elif any_id_fits and not scan:
                    continue
                else:
                    largest, said = self._scanned_largest_id(shards, index), "it holds token id"
                if largest is not None and largest >= vocab:
                    why = f"{said} {largest}, outside the tokenizer's vocabulary of {vocab} ids"
                    raise _damaged(self.directory, entry["file"], why)

    def _scanned_largest_id(self, shards: TokenShards, index: int) -> int | None:
        """Shard `index`'s largest token id, read (None when empty); it must be the one its entry records."""
        entry = shards.shard_entries[index]
        _, largest = id_extremes(shards.shard_tokens(index))
        if MAX_TOKEN_ID in entry and entry[MAX_TOKEN_ID] != largest:
            why = f"its largest token id is {largest}, the manifest records {entry[MAX_TOKEN_ID]}"
            raise _damaged(self.directory, entry["file"], why)
        return largest

    def verify(self) -> None:
        """Re-hashes every token shard against the manifest and checks every document index (first start 0,
        increasing, each document ending with the tokenizer's EOS where it has one) and every token id;
        UserError naming the shard."""
        eos_id = self.manifest["tokenizer"].get("eos_id")
        for name in SPLITS:
            shards = self._shards[name]
            for index, entry in enumerate(shards.shard_entries):
                if file_sha256(self.directory / entry["file"]) != entry["sha256"]:
                    raise _damaged(self.directory, entry["file"], "its contents differ from the manifest's sha256")
                _check_documents(
                    self.directory, entry, shards.shard_tokens(index), shards.shard_document_starts(index), eos_id
                )
        self.check_token_ids(scan=True)


def _check_documents(directory: pathlib.Path, entry: dict, tokens: np.ndarray, starts: np.ndarray, eos_id) -> None:
    starts = np.asarray(starts)
    if starts.size == 0:
        if tokens.shape[0]:
            raise _damaged(directory, entry["docs"], "it lists no documents for a shard that holds tokens")
        return
    if starts[0] != 0 or np.any(np.diff(starts) <= 0) or starts[-1] >= tokens.shape[0]:
        raise _damaged(directory, entry["docs"], "its document starts are not increasing offsets into the shard")
    if eos_id is not None:
        ends = np.append(starts[1:], tokens.shape[0]) - 1
        if np.any(np.asarray(tokens[ends]) != eos_id):
            raise _damaged(directory, entry["file"], f"a document does not end with the end-of-text token {eos_id}")


def read_manifest(directory: pathlib.Path) -> dict:
    """The manifest of a complete prepared directory, checked for the keys and shard entries readers use."""
    if not directory.is_dir():
        raise UserError(f"prepared corpus {directory} does not exist or is not a directory; fix the path")
    path = directory / MANIFEST_FILE
    if not path.is_file():
        why = "no manifest.json"
        if any(directory.glob("*.npy")) or (directory / ".prepare").exists():
            why += ": an unfinished `fp4lm prepare`; run the same command again to finish it"
        raise _not_prepared(directory, why)
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _damaged(directory, MANIFEST_FILE, f"it is not readable JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise _not_prepared(directory, f"manifest format {found!r}, expected {FORMAT!r}")
    try:
        _check_manifest(manifest)
    except (KeyError, TypeError, ValueError) as exc:
        raise _damaged(directory, MANIFEST_FILE, f"it lacks or garbles an entry ({exc!r})") from None
    return manifest


def _check_manifest(manifest: dict) -> None:
    if manifest["dtype"] not in ("uint16", "uint32"):
        raise ValueError(f"dtype {manifest['dtype']}")
    tokenizer = manifest["tokenizer"]
    if not isinstance(tokenizer["fingerprint"], str) or int(tokenizer["vocab_size"]) <= 0:
        raise ValueError("tokenizer")
    for name in SPLITS:
        split = manifest["splits"][name]
        shards = split["shards"]
        for shard in shards:
            for key in ("file", "docs", "sha256"):
                if not isinstance(shard[key], str) or (key != "sha256" and "/" in shard[key]):
                    raise ValueError(f"shard {key} {shard[key]!r}")
            if int(shard["tokens"]) < 0 or int(shard["documents"]) < 0:
                raise ValueError(f"shard {shard['file']} counts")
            if MAX_TOKEN_ID in shard:
                largest = shard[MAX_TOKEN_ID]
                valid = largest is None or (type(largest) is int and largest >= 0)
                if not valid or (largest is None) != (int(shard["tokens"]) == 0):
                    raise ValueError(f"shard {shard['file']} {MAX_TOKEN_ID} {largest!r}")
        if sum(int(s["tokens"]) for s in shards) != int(split["tokens"]):
            raise ValueError(f"{name} tokens")
        if sum(int(s["documents"]) for s in shards) != int(split["documents"]):
            raise ValueError(f"{name} documents")
