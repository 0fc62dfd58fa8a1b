"""Raw sources (text, JSONL, Parquet, token files; compressed or not; directories) read through their prepared
cache on small fixtures written to tmp_path, and every bad input answered with one-line UserError."""

from __future__ import annotations

import gzip
import json
import lzma
import os
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from fp4lm.data import corpus, raw_source, sources, token_files
from tests.data.helpers_data import DataCfg, user_error


def _read(path, fmt="auto", field="text") -> list[str]:
    """The documents of a raw source as training reads them (its prepared cache, byte tokens), in order."""
    cfg = DataCfg(path=str(path), format=fmt, text_field=field, vocab_size=None, seq_len=1, val_fraction=1e-9)
    loaded = corpus.load_corpus(cfg, run_dir=None, need_validation=False, check_sizes=False)
    tokens = np.asarray(loaded.train_tokens)
    starts = loaded.document_starts("train")
    ends = [*starts[1:], tokens.size]
    return [loaded.tokenizer.decode(tokens[a : b - 1]) for a, b in zip(starts, ends, strict=True)]


def _format(path, fmt="auto") -> str:
    (found,) = {f for _, f in raw_source.source_files(path, fmt)}
    return found


def test_text_file_plain_gz_xz_and_zst(tmp_path):
    text = "First Citizen:\nBefore we proceed any further, hear me speak. \u00e9\n"
    (tmp_path / "a.txt").write_text(text, encoding="utf-8")
    (tmp_path / "b.txt.gz").write_bytes(gzip.compress(text.encode()))
    (tmp_path / "c.txt.xz").write_bytes(lzma.compress(text.encode()))
    (tmp_path / "d.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(text.encode()))
    (tmp_path / "noext").write_text(text, encoding="utf-8")
    for name in ("a.txt", "b.txt.gz", "c.txt.xz", "d.txt.zst", "noext"):
        assert _format(tmp_path / name) == "text"
        assert _read(tmp_path / name) == [text]


def test_directory_is_sorted_recursive_and_skips_hidden_and_empty(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "z.md").write_text("zeta\n")
    (tmp_path / "a.txt").write_text("alpha\n")
    (tmp_path / "b" / "empty.txt").write_text("")
    (tmp_path / ".hidden.txt").write_text("secret\n")
    (tmp_path / "notes.csv").write_text("x,y\n")
    assert _format(tmp_path) == "text"
    assert _read(tmp_path) == ["alpha\n", "zeta\n"]


def test_jsonl_with_default_and_custom_field(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"text": "one", "id": 1}) + "\n\n" + json.dumps({"text": "two"}) + "\n")
    assert _format(path) == "jsonl"
    assert _read(path) == ["one", "two"]
    other = tmp_path / "e.jsonl.gz"
    other.write_bytes(gzip.compress((json.dumps({"body": "hello"}) + "\n").encode()))
    assert _read(other, field="body") == ["hello"]


def test_parquet_column_and_directory_of_shards(tmp_path):
    (tmp_path / "shards").mkdir()
    pq.write_table(pa.table({"text": ["a b", None, "c d"], "n": [1, 2, 3]}), tmp_path / "shards" / "0.parquet")
    pq.write_table(pa.table({"text": ["e f"], "n": [4]}), tmp_path / "shards" / "1.parquet")
    assert _read(tmp_path / "shards" / "0.parquet") == ["a b", "c d"]
    assert _format(tmp_path / "shards") == "parquet"
    assert _read(tmp_path / "shards") == ["a b", "c d", "e f"]


def test_token_arrays_npy_and_bin(tmp_path):
    ids = np.array([5, 0, 65535, 7], dtype=np.uint16)
    np.save(tmp_path / "t.npy", ids.astype(np.int64).reshape(2, 2))
    ids.tofile(tmp_path / "t16.bin")
    ids.astype("<u4").tofile(tmp_path / "t32.bin")
    assert _format(tmp_path / "t.npy") == "npy"
    np.testing.assert_array_equal(token_files.read_token_array(tmp_path / "t.npy", "npy"), ids)
    np.testing.assert_array_equal(token_files.read_token_array(tmp_path / "t16.bin", "tokens_uint16"), ids)
    np.testing.assert_array_equal(token_files.read_token_array(tmp_path / "t32.bin", "tokens_uint32"), ids)
    token_files.check_token_ids(
        token_files.read_token_array(tmp_path / "t16.bin", "tokens_uint16"), 65536, tmp_path / "t16.bin"
    )


# --- bad inputs ------------------------------------------------------------------------------------


def test_missing_path(tmp_path):
    user_error(lambda: _format(tmp_path / "nope.txt"), "nope.txt", "does not exist", "data.path")


def test_unknown_format(tmp_path):
    (tmp_path / "a.txt").write_text("x\n")
    user_error(lambda: _format(tmp_path / "a.txt", "csv"), "'csv'", "tokens_uint16")


@pytest.mark.parametrize("content", [b"", b"  \n\n"])
def test_empty_text_file(tmp_path, content):
    path = tmp_path / "empty.txt"
    path.write_bytes(content)
    user_error(lambda: _read(path), "empty.txt", "empty")


def test_binary_file_names_nul_offset(tmp_path):
    path = tmp_path / "model.txt"
    path.write_bytes(b"hello\x00\x01\x02")
    user_error(lambda: _read(path), "model.txt", "NUL byte", "offset 5", "binary")


def test_non_utf8_file_names_offset(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("caf\u00e9 au lait".encode("latin-1"))
    user_error(lambda: _read(path), "latin1.txt", "not valid UTF-8", "byte offset 3", "iconv")


def test_corrupt_compressed_file(tmp_path):
    path = tmp_path / "broken.txt.xz"
    path.write_bytes(b"\xfd7zXZ\x00garbage")
    user_error(lambda: _read(path), "broken.txt.xz", "not a valid xz file")


def test_jsonl_line_not_json(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "fine"}\n{"text": oops}\n')
    user_error(lambda: _read(path), "d.jsonl", "line 2", "not valid JSON")


def test_jsonl_line_not_an_object(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('["text"]\n')
    user_error(lambda: _read(path), "d.jsonl", "line 1", "not an object")


def test_jsonl_missing_field_lists_keys(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a"}\n{"content": "b", "id": 3}\n')
    user_error(lambda: _read(path), "d.jsonl", "line 2", "no field 'text'", "'content', 'id'", "data.text_field")


def test_jsonl_field_not_string(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": 5}\n')
    user_error(lambda: _read(path), "line 1", "int, not a string")


def test_jsonl_empty(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n\n")
    user_error(lambda: _read(path), "d.jsonl", "no text records")


def test_corrupt_parquet(tmp_path):
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"PAR1 this is not really parquet PAR1")
    user_error(lambda: _read(path), "bad.parquet", "not a valid Parquet file")


def test_parquet_missing_column(tmp_path):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"content": ["x"]}), path)
    user_error(lambda: _read(path), "p.parquet", "no column 'text'", "'content'", "data.text_field")


def test_parquet_column_not_string(tmp_path):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"text": [1, 2]}), path)
    user_error(lambda: _read(path), "p.parquet", "not string")


def test_bin_size_not_multiple_of_dtype(tmp_path):
    path = tmp_path / "t.bin"
    path.write_bytes(b"\x01\x00\x02\x00\x03\x00")
    user_error(lambda: token_files.read_token_array(path, "tokens_uint32"), "t.bin", "6 bytes", "multiple of 4")


def test_bin_needs_explicit_width(tmp_path):
    path = tmp_path / "t.bin"
    path.write_bytes(b"\x01\x00")
    user_error(lambda: _format(path), "t.bin", "tokens_uint16 or tokens_uint32", "(data.format)")


def test_empty_token_files(tmp_path):
    (tmp_path / "t.bin").write_bytes(b"")
    user_error(lambda: token_files.read_token_array(tmp_path / "t.bin", "tokens_uint16"), "t.bin", "empty")
    np.save(tmp_path / "t.npy", np.zeros((0,), np.int32))
    user_error(lambda: token_files.read_token_array(tmp_path / "t.npy", "npy"), "t.npy", "empty")


def test_npy_not_integer_or_corrupt(tmp_path):
    np.save(tmp_path / "f.npy", np.ones(4, np.float32))
    user_error(lambda: token_files.read_token_array(tmp_path / "f.npy", "npy"), "f.npy", "float32, not integer")
    (tmp_path / "c.npy").write_bytes(b"\x93NUMPY garbage")
    user_error(lambda: token_files.read_token_array(tmp_path / "c.npy", "npy"), "c.npy", "not a valid .npy")


def test_token_ids_out_of_range():
    tokens = np.array([1, 2, 300, 4], np.uint16)
    user_error(
        lambda: token_files.check_token_ids(tokens, 256, pathlib.Path("t.bin")),
        "t.bin",
        "token id 300",
        "position 2",
        "vocabulary size to at least 301",
        "(data.vocab_size)",
    )
    user_error(
        lambda: token_files.check_token_ids(np.array([3, -1]), 256, pathlib.Path("t.npy")), "t.npy", "-1", "negative"
    )


def test_empty_directory_and_directory_of_empty_files(tmp_path):
    user_error(lambda: _format(tmp_path), str(tmp_path), "no data files", "data.path")
    (tmp_path / "a.txt").write_text("")
    user_error(lambda: _read(tmp_path), str(tmp_path), "empty")
    user_error(lambda: _read(tmp_path, fmt="jsonl"), "no jsonl files")


def test_directory_with_mixed_formats_is_read_whole_or_by_the_format_given(tmp_path):
    """As `fp4lm prepare` reads it: every data file, each in the format its suffix says."""
    (tmp_path / "a.txt").write_text("x\n")
    (tmp_path / "b.jsonl").write_text('{"text": "y"}\n')
    (tmp_path / "c.jsonl").write_text('{"text": "z"}\n')
    assert _read(tmp_path) == ["x\n", "y", "z"]
    assert _read(tmp_path, fmt="jsonl") == ["y", "z"]


# --- not a regular file, or too large to read whole -----------------------------


def test_fifo_is_refused_before_it_is_opened(tmp_path):
    fifo = tmp_path / "stream.txt"
    os.mkfifo(fifo)  # opening it for reading would block until a writer comes: the check must not open it
    user_error(lambda: _format(fifo), "stream.txt", "named pipe", "data.path")


def test_character_device_is_refused():
    user_error(lambda: _format(pathlib.Path("/dev/zero"), "text"), "/dev/zero", "character device", "data.path")


def test_fifo_inside_a_directory_is_skipped(tmp_path):
    (tmp_path / "a.txt").write_text("real text\n")
    os.mkfifo(tmp_path / "b.txt")
    assert _read(tmp_path) == ["real text\n"]


def test_unreadable_file_names_the_data_path(tmp_path, monkeypatch):
    """Permission denied (simulated: tests may run as root, who ignores modes) names data.path."""
    import errno

    path = tmp_path / "a.txt"
    path.write_text("text\n")

    def denied(file, *args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(file))

    monkeypatch.setattr(sources, "open", denied, raising=False)
    user_error(lambda: _read(path), "a.txt", "Permission denied", "fix its permissions", "data.path")
