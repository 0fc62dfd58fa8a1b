"""The prepared-corpus reader (fp4lm.data.prepared): gather across shards, document starts, and refusals of a
directory that is incomplete or whose shards disagree with the manifest."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from fp4lm.data.prepared import (
    PreparedCorpus,
    TokenShards,
    file_sha256,
    is_validation,
    token_dtype,
)
from fp4lm.data.shard_writer import ShardWriter, combined_max_token_id
from fp4lm.errors import UserError
from tests.data.helpers_data import write_prepared_corpus

EOS = 1
TOKENIZER = {"fingerprint": "f" * 64, "name": "test", "vocab_size": 300, "eos_id": EOS, "bos_id": None}


def _documents(rng, count, vocab):
    """`count` documents of random length, ids in [2, vocab), each ending with EOS."""
    return [np.append(rng.integers(2, vocab, rng.integers(1, 9)), EOS) for _ in range(count)]


@pytest.fixture
def corpus(tmp_path):
    rng = np.random.default_rng(0)
    train = [_documents(rng, n, 300) for n in (3, 1, 5)]
    val = [_documents(rng, 2, 300)]
    prepared = write_prepared_corpus(tmp_path / "prep", {"train": train, "val": val}, tokenizer=TOKENIZER)
    return prepared, train, val


def test_gather_reads_across_shard_boundaries(corpus):
    prepared, train, _ = corpus
    flat = np.concatenate([doc for shard in train for doc in shard])
    shards = prepared.split("train")
    assert shards.num_tokens == flat.size and shards.num_shards == 3
    offsets = np.arange(flat.size, dtype=np.int64)
    np.testing.assert_array_equal(shards.gather(offsets), flat)
    windows = np.array([[0, 1, 2], [flat.size - 3, flat.size - 2, flat.size - 1], [5, 4, 3]], np.int64)
    np.testing.assert_array_equal(shards.gather(windows), flat[windows])
    assert shards.gather(offsets).dtype == np.uint16
    with pytest.raises(IndexError):
        shards.gather(np.array([flat.size]))


def test_gather_maps_at_most_max_open_shards_at_once(corpus):
    prepared, train, _ = corpus
    flat = np.concatenate([doc for shard in train for doc in shard])
    entries = prepared.manifest["splits"]["train"]["shards"]
    shards = TokenShards(prepared.directory, entries, prepared.dtype, max_open=1)
    offsets = np.random.default_rng(1).permutation(flat.size)
    np.testing.assert_array_equal(shards.gather(offsets), flat[offsets])
    assert len(shards._open) == 1


def test_document_starts_are_global_and_every_document_ends_with_eos(corpus):
    prepared, train, val = corpus
    docs = [doc for shard in train for doc in shard]
    shards = prepared.split("train")
    expected = np.cumsum([0] + [len(d) for d in docs[:-1]])
    np.testing.assert_array_equal(shards.document_starts, expected)
    assert shards.num_documents == len(docs) == prepared.manifest["splits"]["train"]["documents"]
    ends = np.append(shards.document_starts[1:], shards.num_tokens) - 1
    assert (shards.gather(ends) == EOS).all()
    assert prepared.split("val").num_documents == 2
    assert prepared.tokenizer_fingerprint == "f" * 64
    prepared.verify()


def test_uint32_when_the_vocabulary_does_not_fit_uint16(tmp_path):
    assert token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32
    big = {**TOKENIZER, "vocab_size": 128_256}
    docs = [[np.array([70_000, 128_000, EOS])]]
    prepared = write_prepared_corpus(tmp_path / "p", {"train": docs}, tokenizer=big)
    assert prepared.dtype == np.uint32 and prepared.manifest["dtype"] == "uint32"
    np.testing.assert_array_equal(prepared.split("train").gather(np.arange(3)), [70_000, 128_000, EOS])
    assert prepared.split("val").num_tokens == 0 and prepared.split("val").document_starts.size == 0


def test_a_vocabulary_beyond_uint32_is_refused():
    with pytest.raises(UserError, match="uint32"):
        token_dtype(2**32 + 1)


def test_shard_writer_writes_what_numpy_save_writes(tmp_path):
    writer = ShardWriter(tmp_path, "a.npy", "a.docs.npy", np.uint16)
    writer.add(np.array([5, 6, EOS]))
    writer.add(np.array([], np.int64))  # an empty document is left out
    writer.add(np.array([7, EOS]))
    entry = writer.finish()
    expected = io.BytesIO()
    np.save(expected, np.array([5, 6, EOS, 7, EOS], np.uint16))
    assert writer.tokens_path.read_bytes() == expected.getvalue()
    np.testing.assert_array_equal(np.load(writer.docs_path), [0, 3])
    assert (entry["tokens"], entry["documents"], entry["max_token_id"]) == (5, 2, 7)


def test_validation_routing_follows_the_text_hash():
    texts = [f"document number {i}" for i in range(2000)]
    chosen = [t for t in texts if is_validation(t, 0.1)]
    assert 120 < len(chosen) < 280  # 10% of 2000 = 200, far inside binomial tolerance
    assert chosen == [t for t in texts if is_validation(t, 0.1)]
    assert not any(is_validation(t, 0.0) for t in texts)
    assert all(is_validation(t, 1.0) for t in texts)


def _error(fn) -> str:
    with pytest.raises(UserError) as info:
        fn()
    message = str(info.value)
    assert "\n" not in message and "; " in message
    return message


def test_a_truncated_shard_is_refused_on_open(corpus):
    prepared, _, _ = corpus
    path = prepared.directory / "train-00001.npy"
    path.write_bytes(path.read_bytes()[:-2])
    assert "train-00001.npy" in _error(lambda: PreparedCorpus.open(prepared.directory))


def test_an_extended_shard_is_refused_on_open(corpus):
    prepared, _, _ = corpus
    with open(prepared.directory / "val-00000.docs.npy", "ab") as f:
        f.write(b"\0" * 8)
    assert "val-00000.docs.npy" in _error(lambda: PreparedCorpus.open(prepared.directory))


def test_an_edited_shard_is_found_by_verify(corpus):
    prepared, _, _ = corpus
    path = prepared.directory / "train-00002.npy"
    data = bytearray(path.read_bytes())
    data[-4] ^= 0xFF  # same size, other contents: open accepts it, verify does not
    path.write_bytes(bytes(data))
    reopened = PreparedCorpus.open(prepared.directory)
    message = _error(reopened.verify)
    assert "train-00002.npy" in message and "sha256" in message


def test_a_manifest_that_disagrees_with_a_shard_is_refused(corpus):
    prepared, _, _ = corpus
    manifest_path = prepared.directory / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["splits"]["train"]["shards"][0]["tokens"] += 1
    manifest["splits"]["train"]["tokens"] += 1
    manifest_path.write_text(json.dumps(manifest))
    assert "train-00000.npy" in _error(lambda: PreparedCorpus.open(prepared.directory))


def test_a_directory_without_manifest_is_not_a_prepared_corpus(corpus, tmp_path):
    prepared, _, _ = corpus
    (prepared.directory / "manifest.json").unlink()
    assert "unfinished" in _error(lambda: PreparedCorpus.open(prepared.directory))
    (tmp_path / "empty").mkdir()
    assert "fp4lm prepare" in _error(lambda: PreparedCorpus.open(tmp_path / "empty"))
    assert "does not exist" in _error(lambda: PreparedCorpus.open(tmp_path / "nowhere"))


def test_the_tail_split_is_fixed_disjoint_and_complete(tmp_path):
    """Prepared with the tail split, validation is the last val_fraction of the tokens; the document the cut
    falls in continues as the validation split's first document."""
    docs = [np.append(np.arange(2, 2 + n), EOS) for n in (29, 49, 19)]  # 100 tokens
    written = write_prepared_corpus(tmp_path / "p", {"train": [docs]}, tokenizer=TOKENIZER, val_fraction=0.1)
    manifest = {**written.manifest, "options": {"tail_split": True}}
    tail = PreparedCorpus(written.directory, manifest)
    train, val = tail.view("train"), tail.view("val")
    assert train.size == 90 and val.size == 10
    np.testing.assert_array_equal(np.concatenate([train[:], val[:]]), np.concatenate(docs))
    np.testing.assert_array_equal(val[:], np.concatenate(docs)[90:])
    assert list(train.document_starts) == [0, 30, 80] and list(val.document_starts) == [0]
    assert val[-1] == EOS and train[-1] != EOS


# --- token ids against the vocabulary: recorded at prepare time, checked at open ---------------------------


def _set_token(directory, file: str, position: int, value: int) -> None:
    """Overwrites one token id of a shard in place (same size: opening it still succeeds)."""
    tokens = np.load(directory / file, mmap_mode="r+")
    tokens[position] = value
    tokens.flush()


def _edit_manifest(directory, edit) -> None:
    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def test_the_largest_token_id_of_each_shard_is_recorded(corpus):
    prepared, train, val = corpus
    recorded = [s["max_token_id"] for s in prepared.manifest["splits"]["train"]["shards"]]
    assert recorded == [int(np.concatenate(shard).max()) for shard in train]
    assert prepared.manifest["splits"]["val"]["shards"][0]["max_token_id"] == int(np.concatenate(val[0]).max())


def test_opening_checks_the_recorded_ids_without_reading_a_shard(corpus, monkeypatch):
    prepared, _, _ = corpus
    _set_token(prepared.directory, "train-00001.npy", 0, 299)  # the last id of the vocabulary of 300: allowed
    _set_token(prepared.directory, "train-00002.npy", 0, 310)  # outside it, in the shard only
    reopened = PreparedCorpus.open(prepared.directory)
    monkeypatch.setattr(TokenShards, "shard_tokens", lambda *_: pytest.fail("a shard was read"))
    reopened.check_token_ids()  # what the manifest records is within the vocabulary
    monkeypatch.undo()
    message = _error(reopened.verify)  # --verify reads every shard
    assert "train-00001.npy" in message and "sha256" in message


def test_a_recorded_id_outside_the_vocabulary_is_refused_at_open(corpus):
    prepared, _, _ = corpus
    _edit_manifest(prepared.directory, lambda m: m["splits"]["val"]["shards"][0].update(max_token_id=300))
    message = _error(PreparedCorpus.open(prepared.directory).check_token_ids)
    assert "val-00000.npy" in message and "token id 300" in message and "vocabulary of 300" in message


def test_verify_finds_an_id_the_manifest_does_not_record(corpus):
    """A shard changed together with its sha256: the id scan of --verify still finds the id."""
    prepared, _, _ = corpus
    _set_token(prepared.directory, "train-00000.npy", 1, 310)
    sha = file_sha256(prepared.directory / "train-00000.npy")
    _edit_manifest(prepared.directory, lambda m: m["splits"]["train"]["shards"][0].update(sha256=sha))
    reopened = PreparedCorpus.open(prepared.directory)
    reopened.check_token_ids()  # the recorded largest id is still within the vocabulary
    message = _error(reopened.verify)
    assert "train-00000.npy" in message and "largest token id is 310" in message


def test_a_manifest_without_recorded_ids_still_gets_the_scan(corpus):
    """A corpus prepared before the largest id was recorded: opening reads its shards, as it always did."""
    prepared, _, _ = corpus

    def forget(manifest):
        for split in manifest["splits"].values():
            for shard in split["shards"]:
                del shard["max_token_id"]

    _edit_manifest(prepared.directory, forget)
    PreparedCorpus.open(prepared.directory).check_token_ids()
    _set_token(prepared.directory, "train-00002.npy", 0, 310)
    message = _error(PreparedCorpus.open(prepared.directory).check_token_ids)
    assert "train-00002.npy" in message and "it holds token id 310" in message


@pytest.mark.parametrize("value", [-1, "12", 1.5, True, None])
def test_a_garbled_recorded_id_is_a_damaged_manifest(corpus, value):
    prepared, _, _ = corpus
    _edit_manifest(prepared.directory, lambda m: m["splits"]["train"]["shards"][0].update(max_token_id=value))
    assert "manifest.json" in _error(lambda: PreparedCorpus.open(prepared.directory))


def test_a_shard_joined_from_parts_records_their_largest_id_unless_one_has_none():
    parts = [{"max_token_id": 7}, {"max_token_id": None}, {"max_token_id": 12}]
    assert combined_max_token_id(parts) == {"max_token_id": 12}
    assert combined_max_token_id([{"max_token_id": None}]) == {"max_token_id": None}
    assert combined_max_token_id([*parts, {}]) == {}  # a part of an older fp4lm's unfinished prepare
