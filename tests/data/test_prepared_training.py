"""Training on prepared data (data.path=DIR from `fp4lm prepare`): a mixture of two prepared corpora trains with
per-source validation loss, the mixing plan and the realised counts, and data_wait_s, and two jax.distributed
processes train on it exactly like one; a prepared directory made with another tokenizer is refused in one line;
prepare -> train -> kill -9 mid-train -> resume is bit-exact."""

from __future__ import annotations

import io
import json
import pathlib
import socket
import subprocess
import time

import numpy as np
import pytest

from fp4lm.config import load_config
from fp4lm.data import TrainIterator
from fp4lm.data.prepare import Options, prepare
from fp4lm.tokenizer import ByteTokenizer
from fp4lm.train import train
from tests.compile_flags import xla_flags
from tests.data.helpers_data import write_prepared_corpus
from tests.reliability.helpers_reliability import (
    TINY_MODEL,
    TrainProcess,
    assert_one_line_user_error,
    fp4lm_command,
    last_metrics_step,
    run_cli_in_process,
    snapshot,
    subprocess_env,
    train_records,
)

pytestmark = pytest.mark.slow

# Byte tokens with end-of-text (the byte tokenizer's default vocabulary of 257 ids, not TINY_DATA's 256).
DATA = ["data.seq_len=32", "train.batch_size=4"]
QUIET = [
    "metrics.log_every=1",
    "metrics.quant_stats_every=1000",
    "metrics.tensorboard=false",
    "metrics.progress=plain",
    "eval.sample_tokens=0",
    "optimizer.warmup_steps=2",
    "precision.recipe=bf16",
]


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory) -> str:
    """A JAX persistent compilation cache shared by this module's runs (and their subprocesses)."""
    return str(tmp_path_factory.mktemp("jax_cache"))


def write_byte_corpus(
    directory: pathlib.Path, *, documents: int, low: int, high: int, seed: int, length: int = 0
) -> pathlib.Path:
    """A prepared corpus of byte-tokenizer documents with token ids in [low, high) (each ending with the
    end-of-text id), every fifth document in the validation split; `length` fixes each document's length."""
    tokenizer = ByteTokenizer()
    rng = np.random.default_rng(seed)
    docs = [
        np.append(rng.integers(low, high, length or int(rng.integers(8, 60))), tokenizer.eos_id)
        for _ in range(documents)
    ]
    train_docs = [d for i, d in enumerate(docs) if i % 5 != 4]
    val_docs = [d for i, d in enumerate(docs) if i % 5 == 4]
    half = (len(train_docs) + 1) // 2
    entry = {
        "fingerprint": tokenizer.fingerprint,
        "name": tokenizer.name,
        "vocab_size": tokenizer.vocab_size,
        "eos_id": tokenizer.eos_id,
        "bos_id": tokenizer.bos_id,
    }
    shards = {"train": [train_docs[:half], train_docs[half:]], "val": [val_docs] if val_docs else []}
    write_prepared_corpus(directory, shards, tokenizer=entry)
    return directory


def _records(run_dir: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


DELAY_S = 0.05  # every batch of the mixture run is made this much slower, which data_wait_s must show


def _mixture_overrides(tmp_path: pathlib.Path, compile_cache: str) -> list[str]:
    web = write_byte_corpus(tmp_path / "web", documents=80, low=97, high=123, seed=1)
    code = write_byte_corpus(tmp_path / "code", documents=60, low=33, high=64, seed=2)
    return [
        *TINY_MODEL,
        *DATA,
        *QUIET,
        f"data.sources={web}:3,{code}:1",
        f"train.compilation_cache_dir={compile_cache}",
        "train.steps=4",
        "eval.every=2",
        "eval.batches=1",
        "checkpoint.every=100",
    ]


@pytest.fixture(scope="module")
def mixture_run(tmp_path_factory, compile_cache) -> tuple[pathlib.Path, list[str], dict]:
    """4 steps on web:code = 3:1 (two prepared byte corpora), each batch fetched DELAY_S late."""
    root = tmp_path_factory.mktemp("mixture_run")
    overrides = _mixture_overrides(root, compile_cache)
    fetch = TrainIterator.__next__

    def slow_fetch(self):
        time.sleep(DELAY_S)
        return fetch(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TrainIterator, "__next__", slow_fetch)
        summary = train(load_config(None, [*overrides, f"train.run_dir={root / 'run'}"]))
    return root / "run", overrides, summary


def test_a_mixture_of_prepared_corpora_trains_with_per_source_validation(mixture_run):
    run_dir, _, summary = mixture_run
    records = _records(run_dir)
    assert records[0] == {"step": 0, "event": "mixture", "planned": {"web": 0.75, "code": 0.25}}
    evaluations = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in evaluations] == [2, 4]
    for record in evaluations:
        weighted = 0.75 * record["val_loss/web"] + 0.25 * record["val_loss/code"]
        assert record["val_loss"] == pytest.approx(weighted, rel=1e-12)
    steps = [r for r in records if "loss" in r]
    assert len(steps) == 4 and all(DELAY_S <= r["data_wait_s"] < DELAY_S + 2.0 for r in steps)
    assert summary["mixture"]["sequences"] == {"web": 12, "code": 4}  # 4 steps x 4 sequences, 3:1
    assert summary["mixture"]["realised"] == {"web": 0.75, "code": 0.25}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_two_processes_on_a_prepared_mixture_train_like_one(mixture_run, tmp_path):
    """Per-host sharding: each process maps the same shards and takes its own rows of every global batch."""
    reference_dir, overrides, _ = mixture_run
    run_dir = tmp_path / "two"
    env = subprocess_env() | {"XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=1")}
    env = {k: v for k, v in env.items() if not k.startswith("JAX_COORDINATOR")}
    command = fp4lm_command(
        "train",
        *overrides,
        f"train.run_dir={run_dir}",
        f"distributed.coordinator_address=127.0.0.1:{_free_port()}",
        "distributed.num_processes=2",
        "distributed.timeout_s=120",
    )
    processes = [
        subprocess.Popen(
            [*command, f"distributed.process_id={i}"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in processes]
    for process, output in zip(processes, outputs, strict=True):
        assert process.returncode == 0, output[-3000:]
    assert "(2 cpu devices, 2 processes)" in outputs[0]
    losses = [r["loss"] for r in _records(run_dir) if "loss" in r]
    reference = [r["loss"] for r in _records(reference_dir) if "loss" in r]
    assert len(losses) == len(reference) == 4
    for step, (got, want) in enumerate(zip(losses, reference, strict=True), start=1):
        assert abs(got - want) <= 1e-4 * abs(want), f"step {step}: {got} vs {want}"
    assert [r for r in _records(run_dir) if "val_loss/web" in r]  # per-source evaluation on two processes too


def test_a_prepared_corpus_of_another_tokenizer_is_refused(tmp_path):
    prepared = write_byte_corpus(tmp_path / "prepared", documents=40, low=97, high=123, seed=1)
    run_dir = tmp_path / "run"
    # data.vocab_size=256 asks for the byte tokenizer without end-of-text: another fingerprint.
    result = run_cli_in_process(
        "train",
        *TINY_MODEL,
        *DATA,
        "data.tokenizer=byte",
        "data.vocab_size=256",
        f"data.path={prepared}",
        f"train.run_dir={run_dir}",
    )
    line = assert_one_line_user_error(result, expect_in=("another tokenizer", str(prepared), "data.tokenizer"))
    assert "prepare" in line
    assert not run_dir.exists()


def _write_jsonl(path: pathlib.Path, documents: int) -> pathlib.Path:
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "river", "stone", "light", "cloud", "seven", "north"]
    lines = [json.dumps({"text": " ".join(rng.choice(words, size=int(rng.integers(5, 30))))}) for _ in range(documents)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_prepare_then_train_resumes_bit_exact_after_kill9(tmp_path, compile_cache):
    source = _write_jsonl(tmp_path / "docs.jsonl", 300)
    prepared = tmp_path / "prepared"
    prepare([str(source)], tokenizer="byte", out=prepared, options=Options(val_fraction=0.1), stream=io.StringIO())
    before = snapshot(prepared)

    def overrides(run_dir: pathlib.Path) -> list[str]:
        return [
            *TINY_MODEL,
            *DATA,
            *QUIET,
            f"data.path={prepared}",
            f"train.run_dir={run_dir}",
            f"train.compilation_cache_dir={compile_cache}",
            "train.steps=8",
            "checkpoint.every=2",
            "checkpoint.async_save=false",
            "eval.every=4",
            "eval.batches=1",
        ]

    reference = tmp_path / "reference"
    train(load_config(None, overrides(reference)))
    run_dir = tmp_path / "killed"
    first = TrainProcess(overrides(run_dir), tmp_path, 1)
    assert first.wait_for(lambda: last_metrics_step(run_dir) >= 3, poll_s=0.01), first.stderr_path.read_text()
    assert first.kill(), "the run finished before it could be killed"
    second = TrainProcess(overrides(run_dir), tmp_path, 2)
    assert second.popen.wait(timeout=240) == 0, second.stderr_path.read_text()[-3000:]
    assert 0 < (second.resumed_from() or 0) < 8
    assert train_records(run_dir) == train_records(reference)
    assert snapshot(prepared) == before  # training only reads the prepared directory


def test_eval_of_a_mixture_run_reports_the_weighted_mean_and_each_source(mixture_run):
    """`fp4lm eval` on a mixture run: each source's loss, and val_loss their mean weighted 3:1 as in training
    (the last evaluation of training used the same parameters and batches)."""
    from fp4lm.inference.saved_run import evaluate_sources, load_run

    run_dir, _, _ = mixture_run
    val_loss, per_source = evaluate_sources(load_run(run_dir))
    last = [r for r in _records(run_dir) if "val_loss" in r][-1]
    assert last["step"] == 4 and set(per_source) == {"web", "code"}
    for name in ("web", "code"):
        assert per_source[name] == pytest.approx(last[f"val_loss/{name}"], rel=1e-4)
    unweighted = (per_source["web"] + per_source["code"]) / 2
    assert val_loss != pytest.approx(unweighted, rel=1e-5)  # the sources differ, so the weighting shows
    assert val_loss == pytest.approx(0.75 * per_source["web"] + 0.25 * per_source["code"], rel=1e-12)
    assert val_loss == pytest.approx(last["val_loss"], rel=1e-4)
