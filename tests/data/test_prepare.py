"""`fp4lm prepare` end to end on sources generated here: every document lands once, ends with EOS, goes to the
split its hash says; the output is byte-identical with 1 or 2 workers and on a rerun; uint16 and uint32 shards."""

from __future__ import annotations

import gzip
import json
import pathlib

import numpy as np
import pytest

from fp4lm.data.prepare import Options, prepare
from fp4lm.data.prepared import PreparedCorpus, is_validation

BYTE_EOS = 256
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "wizards",
    "quietly",
    "hex",
    "jolly",
    "kings",
]
# Small pieces and shards, so that JSONL files are cut into byte ranges, Parquet files into row groups, several
# units run, and the train split has many shards.
OPTIONS = Options(val_fraction=0.2, shard_tokens=3000, piece_bytes=6000)


def _text(rng, name: str, i: int) -> str:
    return f"{name} #{i}: " + " ".join(rng.choice(WORDS, rng.integers(2, 30)))


def write_sources(root: pathlib.Path) -> list[str]:
    """Several JSONL files, a .jsonl.gz, a .jsonl.zst, two Parquet files of several row groups and two text
    files under `root`; returns every document's text."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    texts = []

    def jsonl_lines(name, count):
        docs = [_text(rng, name, i) for i in range(count)]
        texts.extend(docs)
        return "".join(json.dumps({"id": i, "text": d}) + "\n" for i, d in enumerate(docs))

    for k in range(3):
        (root / f"part{k}.jsonl").write_text(jsonl_lines(f"jsonl{k}", 120))
    with gzip.open(root / "more.jsonl.gz", "wt") as f:
        f.write(jsonl_lines("gz", 60))
    (root / "most.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(jsonl_lines("zst", 60).encode()))
    for k in range(2):
        docs = [_text(rng, f"parquet{k}", i) for i in range(150)]
        texts.extend(docs)
        pq.write_table(pa.table({"text": docs, "n": list(range(150))}), root / f"table{k}.parquet", row_group_size=40)
    for k in range(2):
        doc = "\n".join(_text(rng, f"book{k}", i) for i in range(40)) + "\n"
        texts.append(doc)
        (root / f"book{k}.txt").write_text(doc)
    return texts


def stored_documents(corpus: PreparedCorpus, split: str) -> list[np.ndarray]:
    """Every document of `split` as its tokens, read through the reader's document index and gather."""
    shards = corpus.split(split)
    ends = np.append(shards.document_starts[1:], shards.num_tokens)
    return [shards.gather(np.arange(a, b)) for a, b in zip(shards.document_starts, ends, strict=True)]


def directory_bytes(directory: pathlib.Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> tuple[pathlib.Path, list[str]]:
    root = tmp_path_factory.mktemp("sources") / "corpus"
    return root, write_sources(root)


@pytest.fixture(scope="module")
def prepared(sources, tmp_path_factory) -> PreparedCorpus:
    out = tmp_path_factory.mktemp("prepared") / "out"
    return prepare([str(sources[0])], tokenizer="byte", out=out, options=OPTIONS, progress="off")


def test_every_document_is_stored_once_with_eos_in_the_split_its_hash_names(sources, prepared):
    _, texts = sources
    found = {}
    for split in ("train", "val"):
        for doc in stored_documents(prepared, split):
            assert doc[-1] == BYTE_EOS and BYTE_EOS not in doc[:-1]
            text = doc[:-1].astype(np.uint8).tobytes().decode()
            assert text not in found
            found[text] = split
    assert sorted(found) == sorted(texts)
    assert all(split == ("val" if is_validation(text, 0.2) else "train") for text, split in found.items())
    assert 0 < sum(split == "val" for split in found.values()) < len(texts) / 2


def test_manifest_counts_shards_and_sources(sources, prepared):
    manifest = prepared.manifest
    assert manifest["dtype"] == "uint16" and prepared.dtype == np.uint16
    assert manifest["tokenizer"]["eos_id"] == BYTE_EOS and manifest["tokenizer"]["bos_id"] is None
    train = manifest["splits"]["train"]
    assert len(train["shards"]) > 3  # a document longer than shard_tokens (a book) has a shard of its own
    assert all(s["tokens"] <= OPTIONS.shard_tokens or s["documents"] == 1 for s in train["shards"])
    assert any(s["tokens"] > OPTIONS.shard_tokens for s in train["shards"])
    assert [s["file"] for s in train["shards"]] == [f"train-{i:05d}.npy" for i in range(len(train["shards"]))]
    assert prepared.split("train").num_tokens == train["tokens"] == sum(s["tokens"] for s in train["shards"])
    names = sorted(pathlib.Path(s["path"]).name for s in manifest["sources"])
    assert names == sorted(p.name for p in sources[0].iterdir())
    assert all(len(s["sha256"]) == 64 and s["bytes"] > 0 for s in manifest["sources"])
    assert not (prepared.directory / ".prepare").exists()
    assert all("max_token_id" in s for split in manifest["splits"].values() for s in split["shards"])
    prepared.verify()  # every recorded largest id (val shards: joined from parts) is the shard's own


def test_output_is_byte_identical_with_two_workers_and_a_rerun_changes_nothing(sources, prepared, tmp_path):
    other = prepare(
        [str(sources[0])], tokenizer="byte", out=tmp_path / "two", options=OPTIONS, workers=2, progress="off"
    )
    assert directory_bytes(other.directory) == directory_bytes(prepared.directory)
    before = {p.name: p.stat().st_mtime_ns for p in prepared.directory.iterdir()}
    prepare([str(sources[0])], tokenizer="byte", out=prepared.directory, options=OPTIONS, progress="off")
    assert {p.name: p.stat().st_mtime_ns for p in prepared.directory.iterdir()} == before


def test_globs_and_files_select_sources_in_order(sources, tmp_path):
    root, _ = sources
    corpus = prepare(
        [str(root / "table*.parquet"), str(root / "book1.txt")],
        tokenizer="byte",
        out=tmp_path / "out",
        options=Options(val_fraction=0.0),
        progress="off",
    )
    assert [pathlib.Path(s["path"]).name for s in corpus.manifest["sources"]] == [
        "table0.parquet",
        "table1.parquet",
        "book1.txt",
    ]
    assert corpus.split("train").num_documents == 301 and corpus.split("val").num_tokens == 0


def test_text_delimiter_splits_a_file_into_documents(tmp_path):
    (tmp_path / "stories.txt").write_text("once upon a time<|end|>there was a fox<|end|><|end|>the end")
    corpus = prepare(
        [str(tmp_path / "stories.txt")],
        tokenizer="byte",
        out=tmp_path / "out",
        options=Options(val_fraction=0.0, text_delimiter="<|end|>"),
        progress="off",
    )
    texts = [d[:-1].astype(np.uint8).tobytes().decode() for d in stored_documents(corpus, "train")]
    assert texts == ["once upon a time", "there was a fox", "the end"]  # the empty document is left out


def test_tail_split_keeps_every_document_for_training_and_reads_the_last_tokens_as_validation(tmp_path):
    """`fp4lm prepare --tail-split` (single long documents): nothing is held out by hash; the validation split
    is the last --val-fraction of the tokens, cut inside the document it falls in."""
    from tests.reliability.helpers_reliability import run_cli_in_process

    (tmp_path / "book.txt").write_text("".join(f"line {i} of one long book\n" for i in range(300)))
    out = tmp_path / "out"
    args = ["prepare", str(tmp_path / "book.txt"), "--tokenizer", "byte", "--out", str(out), "--val-fraction", "0.1"]
    assert run_cli_in_process(*args, "--tail-split").code == 0
    corpus = PreparedCorpus.open(out)
    assert corpus.manifest["options"]["tail_split"] is True and corpus.split("val").num_tokens == 0
    (document,) = stored_documents(corpus, "train")
    train, val = corpus.view("train"), corpus.view("val")
    assert val.size == round(document.size * 0.1) and train.size + val.size == document.size
    np.testing.assert_array_equal(np.concatenate([train[:], val[:]]), document)
    assert list(val.document_starts) == [0]


def _word_level_tokenizer(path: pathlib.Path, size: int) -> pathlib.Path:
    """A Hugging Face tokenizer.json with `size` words (more than uint16 holds), <s> and </s>."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(size - 3)}}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(path))
    return path


def test_a_vocabulary_beyond_uint16_gives_uint32_shards_with_bos_and_eos(tmp_path):
    tokenizer = _word_level_tokenizer(tmp_path / "tokenizer.json", 70_000)
    docs = ["w69996 w5 w65536", "w3 w4", "w65533"]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    corpus = prepare(
        [str(tmp_path / "docs.jsonl")],
        tokenizer=str(tokenizer),
        out=tmp_path / "out",
        options=Options(val_fraction=0.0),
        progress="off",
    )
    assert corpus.dtype == np.uint32 and corpus.manifest["tokenizer"]["vocab_size"] == 70_000
    stored = [d.tolist() for d in stored_documents(corpus, "train")]
    assert stored == [[1, 69999, 8, 65539, 2], [1, 6, 7, 2], [1, 65536, 2]]
    corpus.verify()


def test_skip_bad_lines_counts_what_it_skips(tmp_path, capsys):
    lines = ['{"text": "good one"}', "not json", '{"body": "no text"}', '{"text": 5}', '{"text": "good two"}']
    (tmp_path / "mixed.jsonl").write_text("\n".join(lines) + "\n")
    corpus = prepare(
        [str(tmp_path / "mixed.jsonl")],
        tokenizer="byte",
        out=tmp_path / "out",
        options=Options(val_fraction=0.0, skip_bad_lines=True),
        progress="off",
    )
    assert corpus.split("train").num_documents == 2
    assert corpus.manifest["options"]["skipped_lines"] == 3
    out = capsys.readouterr().out
    assert "skipped 3 bad lines or rows" in out and "mixed.jsonl: line 2" in out


def test_plain_progress_lines_show_units_tokens_and_rate():
    import io

    from fp4lm.data.prepare_progress import Progress

    stream = io.StringIO()
    progress = Progress("plain", stream, total_units=3, every_s=0.0)
    progress.done({"parts": {"train": [{"tokens": 40}], "val": []}}, resumed=True)
    progress.tokens(60)
    lines = stream.getvalue().splitlines()
    assert lines[-1].startswith("prepare: 1/3 units, 100 tokens, ") and lines[-1].endswith(" tok/s")
    quiet = io.StringIO()
    Progress("off", quiet, total_units=3, every_s=0.0).tokens(5)
    assert quiet.getvalue() == ""


def test_a_dictionary_encoded_parquet_text_column_is_read(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    column = pa.array(["alpha beta", "gamma", "alpha beta"]).dictionary_encode()
    pq.write_table(pa.table({"body": column}), tmp_path / "t.parquet")
    corpus = prepare(
        [str(tmp_path / "t.parquet")],
        tokenizer="byte",
        out=tmp_path / "out",
        options=Options(val_fraction=0.0, text_field="body"),
        progress="off",
    )
    texts = [d[:-1].astype(np.uint8).tobytes().decode() for d in stored_documents(corpus, "train")]
    assert texts == ["alpha beta", "gamma", "alpha beta"]


def test_the_tokenizer_used_is_kept_in_the_directory_and_training_opens_it(tmp_path):
    """A bare Hugging Face tokenizer.json given to prepare: the directory keeps it in the standard files (a
    rerun into a new directory writes the same bytes), and data.path=DIR with the default data.tokenizer=bpe
    trains with it, no data.tokenizer=PATH needed."""
    import tokenizers

    from fp4lm.data.corpus import load_corpus
    from fp4lm.tokenizer import BPETokenizer
    from tests.data.helpers_data import DataCfg

    trained = tmp_path / "trained"
    BPETokenizer.train(" ".join(WORDS * 40) + "\n", 300).save(trained)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "tokenizer.json").write_bytes((trained / "tokenizer.json").read_bytes())  # no tokenizer_config.json
    source = tmp_path / "docs.jsonl"
    rng = np.random.default_rng(1)
    source.write_text("".join(json.dumps({"text": _text(rng, "doc", i)}) + "\n" for i in range(60)))
    options = Options(val_fraction=0.2)
    first = prepare(
        [str(source)], tokenizer=str(bare / "tokenizer.json"), out=tmp_path / "a", options=options, progress="off"
    )
    again = prepare(
        [str(source)], tokenizer=str(bare / "tokenizer.json"), out=tmp_path / "b", options=options, progress="off"
    )
    assert directory_bytes(first.directory) == directory_bytes(again.directory)
    kept = first.directory / "tokenizer.json"
    assert tokenizers.Tokenizer.from_file(str(kept)).get_vocab_size() == 300
    loaded = load_corpus(DataCfg(path=str(first.directory), tokenizer="bpe", seq_len=16), run_dir=None)
    assert loaded.format == "prepared" and loaded.tokenizer.fingerprint == first.manifest["tokenizer"]["fingerprint"]
    assert loaded.tokenizer.eos_id == first.manifest["tokenizer"]["eos_id"] is not None


def test_malformed_text_is_skipped_and_counted_through_the_cli(tmp_path):
    """A lone surrogate escape in JSONL and a Parquet value that is not UTF-8 are bad lines or rows
    (counted with --skip-bad-lines); a null Parquet text is skipped and counted, never silently."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.reliability.helpers_reliability import run_cli_in_process

    (tmp_path / "a.jsonl").write_text('{"text": "good one"}\n{"text": "bad \\ud800 half"}\n{"text": "good two"}\n')
    texts = pa.array([b"fine", b"caf\xe9", None, b"also fine"], type=pa.binary()).cast(pa.string(), safe=False)
    pq.write_table(pa.table({"text": texts}), tmp_path / "b.parquet")
    result = run_cli_in_process(
        "prepare", str(tmp_path / "a.jsonl"), str(tmp_path / "b.parquet"), "--tokenizer", "byte",
        "--out", str(tmp_path / "out"), "--skip-bad-lines", "--val-fraction", "0", "--progress", "off",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    assert "skipped 2 bad lines or rows (the first: " in result.stdout and "a.jsonl: line 2" in result.stdout
    assert "skipped 1 Parquet rows whose text is null" in result.stdout
    manifest = PreparedCorpus.open(tmp_path / "out").manifest
    assert manifest["splits"]["train"]["documents"] == 4
    assert (manifest["options"]["skipped_lines"], manifest["options"]["null_texts"]) == (2, 1)


def test_more_workers_than_units_or_cores_are_clamped_with_a_note(tmp_path):
    """--workers beyond the units of work (or the CPU cores) starts no idle processes, and says so."""
    from tests.reliability.helpers_reliability import run_cli_in_process

    (tmp_path / "a.txt").write_text("To be, or not to be.\n" * 50)
    args = ["prepare", str(tmp_path / "a.txt"), "--tokenizer", "byte", "--progress", "off"]
    result = run_cli_in_process(*args, "--out", str(tmp_path / "out"), "--workers", "1000")
    assert result.code == 0, result.stderr
    assert "note: --workers 1000: using 1 (1 unit of work (about 64 MiB of source each)" in result.stdout
    plain = run_cli_in_process(*args, "--out", str(tmp_path / "plain"))
    assert "note:" not in plain.stdout
    assert (tmp_path / "out" / "train-00000.npy").read_bytes() == (tmp_path / "plain" / "train-00000.npy").read_bytes()


def test_the_data_guide_prepare_example_works_from_any_directory(tmp_path):
    """The data guide's example names the bundled corpus, not a path inside a checkout."""
    import shlex

    from tests.reliability.helpers_reliability import REPO, run_cli

    guide = (REPO / "docs" / "data.md").read_text()
    line = next(x for x in guide.splitlines() if x.startswith("fp4lm prepare bundled:"))
    argv = shlex.split(line.replace("$'\\n\\n'", "NEWLINES"))[1:]
    argv = ["\n\n" if a == "NEWLINES" else a for a in argv]
    result = run_cli(*argv, "--progress", "off", cwd=tmp_path)
    assert result.code == 0, result.stderr
    corpus = PreparedCorpus.open(tmp_path / "prepared" / "shakespeare")
    assert corpus.split("train").num_documents > 1000  # one per paragraph
    assert run_cli("prepare", "--verify", "prepared/shakespeare", cwd=tmp_path).code == 0
