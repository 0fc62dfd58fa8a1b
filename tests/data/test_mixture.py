"""Mixtures (data.sources) and validation sets at the data level, no training: sources drawn in proportion to
their weights (and counted as grain draws them), a checkpointed position that resumes exactly, per-host rows
that add up to the one-process batch, one validation set per source, data.val_path, and the refusals."""

from __future__ import annotations

import grain
import numpy as np
import pytest

import fp4lm.data
from fp4lm.config import load_config
from fp4lm.data.mixture import realised_counts
from fp4lm.errors import UserError
from tests.data.helpers_data import user_error
from tests.data.test_prepared_training import write_byte_corpus

SEQ, BATCH = 16, 8


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """Three prepared byte corpora whose tokens tell them apart: web in [0, 100), code in [100, 200), and
    books in [200, 250) (books is the separate validation source)."""
    root = tmp_path_factory.mktemp("mixture")
    return {
        "web": write_byte_corpus(root / "web", documents=120, low=0, high=100, seed=1),
        "code": write_byte_corpus(root / "code", documents=60, low=100, high=200, seed=2),
        "books": write_byte_corpus(root / "books", documents=30, low=200, high=250, seed=3),
    }


def _data(*overrides: str, shard_index: int = 0, shard_count: int = 1) -> fp4lm.data.Data:
    config = load_config(None, [f"data.seq_len={SEQ}", "data.tokenizer=byte", *overrides])
    return fp4lm.data.build(
        config.data, run_dir=None, seed=3, batch_size=BATCH, shard_index=shard_index, shard_count=shard_count
    )


def _source_of_rows(batch) -> np.ndarray:
    """0 for a web sequence, 1 for code: by its tokens other than end-of-text (256)."""
    tokens = np.where(batch["inputs"] == 256, -1, batch["inputs"])
    return (tokens.max(axis=1) >= 100).astype(int)


@pytest.mark.parametrize("proportions", [(233, 100), (100, 100, 350), (100, 7100)])
def test_realised_counts_are_what_grains_mix_draws(proportions):
    parents = [grain.MapDataset.range(10**6).map(lambda _, i=i: i) for i in range(len(proportions))]
    mixed = grain.MapDataset.mix(parents, list(proportions))
    drawn = [mixed[k] for k in range(700)]
    for n in (0, 1, 99, 700):
        assert realised_counts(proportions, n) == np.bincount(drawn[:n], minlength=len(proportions)).tolist()


@pytest.mark.parametrize("weights", [(3.0, 1.0), (0.2, 0.8)])
def test_sources_are_drawn_in_proportion_to_their_weights(corpora, weights):
    sources = f"data.sources={corpora['web']}:{weights[0]},{corpora['code']}:{weights[1]}"
    data = _data(sources)
    assert data.mixture is not None and list(data.mixture.names) == ["web", "code"]
    rows = np.concatenate([_source_of_rows(next(data.train_iterator)) for _ in range(60)])
    share = weights[1] / sum(weights)
    tolerance = 4 * np.sqrt(share * (1 - share) / rows.size)  # four standard deviations of a random draw
    assert abs(rows.mean() - share) < tolerance
    assert data.mixture.realised(rows.size) == {"web": int((rows == 0).sum()), "code": int((rows == 1).sum())}
    assert data.mixture.planned()["code"] == pytest.approx(share, abs=0.01)


def test_a_mixture_resumes_exactly_from_its_checkpointed_position(corpora):
    sources = f"data.sources={corpora['web']}:3,{corpora['code']}:1"
    data = _data(sources)
    for _ in range(7):
        next(data.train_iterator)
    state = data.train_iterator.get_state()
    expected = [next(data.train_iterator) for _ in range(4)]
    resumed = _data(sources)
    resumed.train_iterator.set_state(state)
    for want in expected:
        got = next(resumed.train_iterator)
        assert set(got) == set(want)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])


def test_two_processes_share_each_global_batch_of_a_mixture(corpora):
    sources = f"data.sources={corpora['web']}:1,{corpora['code']}:1"
    whole = _data(sources)
    halves = [_data(sources, shard_index=i, shard_count=2) for i in range(2)]
    for _ in range(5):
        want = next(whole.train_iterator)
        parts = [next(half.train_iterator) for half in halves]
        for key in want:
            np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), want[key])
    assert halves[0].train_iterator.get_state() == whole.train_iterator.get_state()


def test_prepared_batches_carry_document_layout_and_stay_inside_one_source(corpora):
    data = _data(f"data.sources={corpora['web']}:1,{corpora['code']}:1")
    batch = next(data.train_iterator)
    assert {"segment_ids", "positions"} <= set(batch)  # document masking is on for prepared data
    tokens = np.where(batch["inputs"] == 256, -1, batch["inputs"])
    low_rows = tokens.max(axis=1) < 100
    assert np.all(tokens[~low_rows] >= 100) or np.all(tokens[~low_rows] == -1)  # no row mixes two sources


def test_each_source_has_its_own_validation_set(corpora):
    data = _data(f"data.sources={corpora['web']}:2,{corpora['code']}:1")
    assert list(data.validation) == ["web", "code"]
    assert [v.weight for v in data.validation.values()] == [2.0, 1.0]
    sets = data.eval_sets(2)
    for name, batches in sets.items():
        tokens = np.where(batches[0]["inputs"] == 256, -1, batches[0]["inputs"])
        assert (tokens.max() < 100) == (name == "web")
    assert data.val_loss({"web": 1.0, "code": 4.0}) == pytest.approx(2.0)


def test_val_path_replaces_the_held_out_documents(corpora):
    data = _data(f"data.path={corpora['web']}", f"data.val_path={corpora['books']}")
    assert list(data.validation) == [""]
    books = fp4lm.data.PreparedCorpus.open(corpora["books"])
    held = data.validation[""]
    assert held.tokens.size == books.split("train").num_tokens + books.split("val").num_tokens
    batch = data.eval_batches(1)[0]
    tokens = batch["inputs"][batch["inputs"] != 256]
    assert tokens.min() >= 200 and tokens.max() < 250


def test_zero_weight_sources_are_left_out(corpora):
    data = _data(f"data.sources={corpora['web']}:1,{corpora['code']}:0")
    assert data.mixture is not None and list(data.mixture.names) == ["web"]


@pytest.mark.parametrize(
    ("sources", "fragments"),
    [("{web}:-1,{code}:1", ["weight -1", ">= 0"]), ("{web}:0,{code}:0", ["every weight is 0", "positive"])],
)
def test_bad_weights_are_refused_in_one_line(corpora, sources, fragments):
    user_error(lambda: _data("data.sources=" + sources.format(**corpora)), *fragments)


def test_a_source_too_small_for_one_sequence_is_named(corpora, tmp_path):
    tiny = write_byte_corpus(tmp_path / "tiny", documents=1, low=0, high=100, seed=4, length=5)
    message = user_error(lambda: _data(f"data.sources={corpora['web']}:1,{tiny}:1"), "tiny", "seq_len=16")
    assert "too small" in message


def test_val_path_too_small_or_missing_is_named(corpora, tmp_path):
    tiny = write_byte_corpus(tmp_path / "tiny", documents=1, low=0, high=100, seed=4, length=5)
    user_error(lambda: _data(f"data.path={corpora['web']}", f"data.val_path={tiny}"), "data.val_path", "too small")
    with pytest.raises(UserError, match="does not exist"):
        _data(f"data.path={corpora['web']}", f"data.val_path={tmp_path / 'nothing'}")


def test_a_raw_source_mixes_with_a_prepared_one_in_the_prepared_tokenizer(corpora, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("plain words for a raw source\n" * 200)
    data = _data(f"data.sources={corpora['web']}:1,{text}:1", "data.tokenizer=bpe")
    assert data.tokenizer.name == "byte" and data.tokenizer.eos_id == 256  # the prepared corpus's, not a new BPE
    raw = data.sources["notes"]
    assert raw.format == "text" and raw.tokenizer is data.tokenizer
    rows = np.concatenate([next(data.train_iterator)["inputs"] for _ in range(6)])
    assert any(set(row.tolist()) <= set(b"plain words for a raw source\n") for row in rows)


def test_validation_batches_carry_document_layout_exactly_when_training_batches_do(corpora, tmp_path):
    text = tmp_path / "held_out.txt"
    text.write_text("words kept apart for validation only\n" * 60)
    prepared_training = _data(f"data.path={corpora['web']}", f"data.val_path={text}")
    assert {"segment_ids", "positions"} <= set(prepared_training.eval_batches(1)[0])
    raw_training = _data(f"data.path={text}", f"data.val_path={corpora['books']}")  # the same default as prepared
    assert {"segment_ids", "positions"} <= set(next(raw_training.train_iterator))
    assert {"segment_ids", "positions"} <= set(raw_training.eval_batches(1)[0])
    unmasked = _data(f"data.path={text}", f"data.val_path={corpora['books']}", "data.document_masking=false")
    assert "segment_ids" not in next(unmasked.train_iterator)
    assert "segment_ids" not in unmasked.eval_batches(1)[0]


def test_a_mixture_of_raw_sources_keeps_a_token_cache_for_each(tmp_path):
    sources = []
    for name, words in (("plays", "to be or not to be "), ("poems", "shall I compare thee ")):
        path = tmp_path / f"{name}.txt"
        path.write_text((words * 8 + "\n") * 80)
        sources.append(f"{path}:1")
    first = _data("data.sources=" + ",".join(sources))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    first.save(run_dir)
    caches = sorted(p.name for p in (run_dir / "data_cache").iterdir())
    assert caches == sorted(str(c.cache_key) for c in first.sources.values()) and len(caches) == 2
    again = fp4lm.data.build(
        load_config(None, [f"data.seq_len={SEQ}", "data.tokenizer=byte", "data.sources=" + ",".join(sources)]).data,
        run_dir=run_dir,
        seed=3,
        batch_size=BATCH,
    )
    assert all(c.shards.directory.parent == run_dir / "data_cache" for c in again.sources.values())
    for _ in range(3):
        want, got = next(first.train_iterator), next(again.train_iterator)
        np.testing.assert_array_equal(got["inputs"], want["inputs"])
