"""`fp4lm prepare`'s refusals: one line naming the problem and the fix, exit code 2, and nothing that existed
before changed (a failed prepare into a new directory leaves no directory behind)."""

from __future__ import annotations

import json
import pathlib

import pytest

from fp4lm.data import prepare as prepare_module
from fp4lm.data.prepare import Options, prepare
from fp4lm.data.prepared import PreparedCorpus
from fp4lm.errors import UserError
from tests.reliability.helpers_reliability import assert_one_line_user_error, run_cli_in_process, snapshot


def _refused(fn, *fragments: str) -> str:
    with pytest.raises(UserError) as info:
        fn()
    message = str(info.value)
    assert "\n" not in message and "; " in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


def _jsonl(path: pathlib.Path, lines: list[str]) -> pathlib.Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _prepare(sources, out, **options):
    return prepare([str(s) for s in sources], tokenizer="byte", out=out, options=Options(**options), progress="off")


def test_a_glob_that_matches_nothing(tmp_path):
    _refused(lambda: _prepare([tmp_path / "*.jsonl"], tmp_path / "out"), "*.jsonl", "matches no files")
    assert not (tmp_path / "out").exists()


def test_a_jsonl_line_that_is_not_json_names_file_and_line_even_deep_in_a_large_file(tmp_path):
    lines = [json.dumps({"text": f"document number {i} " * 3}) for i in range(300)]
    lines[236] = '{"text": "unterminated'
    source = _jsonl(tmp_path / "big.jsonl", lines)
    # Pieces of 2000 bytes: line 237 lies in a later piece, whose line numbers start after the earlier ones.
    _refused(lambda: _prepare([source], tmp_path / "out", piece_bytes=2000), "big.jsonl: line 237", "JSON")
    assert not (tmp_path / "out").exists()


def test_a_jsonl_line_without_the_field(tmp_path):
    source = _jsonl(tmp_path / "a.jsonl", ['{"text": "fine"}', '{"body": "no text here"}'])
    _refused(lambda: _prepare([source], tmp_path / "out"), "a.jsonl: line 2", "'text'", "--text-field")


def test_a_parquet_file_without_the_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["words"] * 10}), tmp_path / "t.parquet")
    _refused(lambda: _prepare([tmp_path / "t.parquet"], tmp_path / "out"), "t.parquet", "column 'text'", "'body'")
    assert not (tmp_path / "out").exists()


def test_a_tokenizer_file_that_is_not_a_tokenizer(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"hello": "world"}')
    source = _jsonl(tmp_path / "a.jsonl", ['{"text": "fine"}'])
    message = _refused(
        lambda: prepare([str(source)], tokenizer=str(tmp_path / "tokenizer.json"), out=tmp_path / "out"),
        "tokenizer.json",
        "not a tokenizer",
    )
    assert "data.tokenizer" not in message
    assert not (tmp_path / "out").exists()


def test_a_vocabulary_larger_than_uint32(tmp_path, monkeypatch):
    class Huge:
        name, vocab_size, eos_id, bos_id, fingerprint = "huge", 2**32 + 5, None, None, "0" * 64

    monkeypatch.setattr(prepare_module, "open_tokenizer", lambda spec: Huge())
    source = _jsonl(tmp_path / "a.jsonl", ['{"text": "fine"}'])
    _refused(lambda: _prepare([source], tmp_path / "out"), "4,294,967,301", "uint32")
    assert not (tmp_path / "out").exists()


def test_out_that_holds_other_files_is_refused_and_unchanged(tmp_path):
    source = _jsonl(tmp_path / "a.jsonl", ['{"text": "fine"}'])
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    before = snapshot(tmp_path / "out")
    _refused(lambda: _prepare([source], tmp_path / "out"), "not empty", "--out")
    assert snapshot(tmp_path / "out") == before


def test_a_complete_prepare_of_other_inputs_is_refused_and_unchanged(tmp_path):
    first = _jsonl(tmp_path / "a.jsonl", ['{"text": "fine"}'])
    second = _jsonl(tmp_path / "b.jsonl", ['{"text": "other"}'])
    _prepare([first], tmp_path / "out")
    before = snapshot(tmp_path / "out")
    _refused(lambda: _prepare([second], tmp_path / "out"), "other sources", "new --out")
    _refused(lambda: _prepare([first], tmp_path / "out", val_fraction=0.5), "other options")
    first.write_text('{"text": "FINE"}\n')  # same size, other contents
    _refused(lambda: _prepare([first], tmp_path / "out"), "contents changed")
    assert snapshot(tmp_path / "out") == before


def test_an_unfinished_prepare_of_other_inputs_is_refused(tmp_path):
    first = _jsonl(tmp_path / "a.jsonl", ['{"text": "fine"}'])
    (tmp_path / "out" / ".prepare").mkdir(parents=True)
    (tmp_path / "out" / ".prepare" / "request.json").write_text('{"sources": []}\n')
    before = snapshot(tmp_path / "out")
    _refused(lambda: _prepare([first], tmp_path / "out"), "unfinished prepare", "another --out")
    assert snapshot(tmp_path / "out") == before


@pytest.fixture
def prepared_dir(tmp_path) -> pathlib.Path:
    lines = [json.dumps({"text": f"document {i} " * (i % 7 + 1)}) for i in range(200)]
    source = _jsonl(tmp_path / "a.jsonl", lines)
    return _prepare([source], tmp_path / "prepared", val_fraction=0.1, shard_tokens=1000).directory


def test_cli_verify_finds_a_truncated_shard_on_open(prepared_dir):
    shard = prepared_dir / "train-00001.npy"
    shard.write_bytes(shard.read_bytes()[:-6])
    before = snapshot(prepared_dir)
    assert_one_line_user_error(
        run_cli_in_process("prepare", "--verify", str(prepared_dir)), expect_in=("train-00001.npy", "damaged")
    )
    with pytest.raises(UserError, match="train-00001.npy"):
        PreparedCorpus.open(prepared_dir)
    assert snapshot(prepared_dir) == before


def test_cli_verify_finds_an_edited_shard_by_its_hash(prepared_dir):
    shard = prepared_dir / "val-00000.npy"
    data = bytearray(shard.read_bytes())
    data[130] = (data[130] + 1) % 256  # a token changed, the size kept
    shard.write_bytes(bytes(data))
    before = snapshot(prepared_dir)
    PreparedCorpus.open(prepared_dir)  # sizes agree: opening does not read the contents
    line = assert_one_line_user_error(
        run_cli_in_process("prepare", "--verify", str(prepared_dir)), expect_in=("val-00000.npy", "sha256")
    )
    assert line.startswith("error: ")
    assert snapshot(prepared_dir) == before


def test_cli_verify_accepts_an_intact_directory(prepared_dir):
    result = run_cli_in_process("prepare", "--verify", str(prepared_dir))
    assert result.code == 0, result.stderr
    assert "match the manifest" in result.stdout


def test_cli_prepare_without_tokenizer_or_out(tmp_path):
    source = _jsonl(tmp_path / "a.jsonl", ['{"text": "fine"}'])
    assert_one_line_user_error(run_cli_in_process("prepare", str(source)), expect_in=("--tokenizer", "--out"))


def test_failed_prepare_into_an_empty_directory_leaves_it_empty(tmp_path):
    source = _jsonl(tmp_path / "a.jsonl", ['{"text": "fine"}', "[1, 2]"])
    (tmp_path / "out").mkdir()
    _refused(lambda: _prepare([source], tmp_path / "out"), "line 2", "not an object")
    assert list((tmp_path / "out").iterdir()) == []


def test_sources_without_any_text_are_refused(tmp_path):
    source = _jsonl(tmp_path / "a.jsonl", ['{"text": ""}', "", '{"text": ""}'])
    _refused(lambda: _prepare([source], tmp_path / "out"), "no text", "--text-field")
    assert not (tmp_path / "out").exists()


def test_zstd_reader_reads_every_frame_and_refuses_a_cut_one(tmp_path):
    """Several concatenated frames read whole; a file ending inside a frame is an error."""
    import zstandard

    from fp4lm.data.sources import open_binary

    data = b"".join(json.dumps({"text": f"line {i} " * 9}).encode() + b"\n" for i in range(4000))
    frame = zstandard.ZstdCompressor().compress(data)
    (tmp_path / "two.jsonl.zst").write_bytes(frame + frame)
    with open_binary(tmp_path / "two.jsonl.zst") as f:
        assert f.read() == data + data
    (tmp_path / "cut.jsonl.zst").write_bytes(frame + frame[:-3])
    with open_binary(tmp_path / "cut.jsonl.zst") as f, pytest.raises(EOFError, match="truncated"):
        f.read()
