"""precision.fp4_param_gather on 8 fake devices (mesh.data=4 mesh.fsdp=2): training is bit-identical with the flag
on and off, and the weights cross the mesh as NVFP4 codes and tile scales instead of float32 (XLA:CPU's widened
bf16)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fp4lm.config import load_config
from fp4lm.linear_layers import linear_layers
from tests.train.conftest import TINY
from tests.train.test_collectives import EIGHT_DEVICES, REPO

pytestmark = pytest.mark.slow

MESH = ["mesh.data=4", "mesh.fsdp=2", "train.batch_size=8", "precision.recipe=nvfp4"]
RUN = [*TINY, *MESH, "train.steps=3", "eval.batches=0", "eval.sample_tokens=0"]
RUN += ["checkpoint.enabled=false", "metrics.quant_stats_every=100"]


def _fp4lm(*args: str, cwd) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COORDINATOR")}
    env.update(EIGHT_DEVICES, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "fp4lm", *args], capture_output=True, text=True, timeout=600, env=env, cwd=cwd
    )


def _records(run_dir) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [
        {k: v for k, v in r.items() if k in ("step", "loss", "val_loss", "grad_norm")} for r in map(json.loads, lines)
    ]


def _train_and_dry_run(where, flag: str) -> dict:
    """The metrics of a 3-step run with the flag, and its dry run's collectives."""
    overrides = [*RUN, f"precision.fp4_param_gather={flag}", f"train.compilation_cache_dir={where / 'cache'}"]
    trained = _fp4lm("train", *overrides, f"train.run_dir={where / 'run'}", cwd=where)
    assert trained.returncode == 0, trained.stderr[-3000:]
    dry = _fp4lm("train", *overrides, f"train.run_dir={where / 'dry'}", "--dry-run", "--json", cwd=where)
    assert dry.returncode == 0, dry.stderr[-3000:]
    report = json.loads(dry.stdout)
    return {
        "metrics": _records(where / "run"),
        "collectives": report["collectives"],
        "gathered": report["precision"]["fp4_param_gather"],
        "stdout": trained.stdout,
    }


def test_training_is_bit_identical_and_the_weights_cross_as_codes_and_tile_scales(tmp_path):
    """One test, so that one xdist worker runs its four 8-device programs.

    Each linear weight's codes cross twice (the forward, and again the backward's dgrad), each device sending
    1/2 of them: 2 x 1/2 x P/2 bytes for P weights. Without the flag XLA gathered each float32 weight; at least
    4 x 1/2 x P of those bytes are gone from the f32 gathers."""
    (tmp_path / "off").mkdir()
    (tmp_path / "on").mkdir()
    runs = {"off": _train_and_dry_run(tmp_path / "off", "false"), "on": _train_and_dry_run(tmp_path / "on", "true")}
    assert runs["on"]["metrics"] == runs["off"]["metrics"]
    assert [r["step"] for r in runs["on"]["metrics"] if "loss" in r] == [1, 2, 3]
    assert runs["on"]["gathered"] == {
        "layers": [layer.path for layer in linear_layers(load_config(None, RUN).model)],
        "note": None,
    }
    assert "fp4_param_gather=true changes nothing" not in runs["on"]["stdout"]

    weights = sum(layer.params for layer in linear_layers(load_config(None, RUN).model))
    off, on = runs["off"]["collectives"]["all-gather"], runs["on"]["collectives"]["all-gather"]
    assert "u8" not in off["by_dtype"]
    assert on["by_dtype"]["u8"] == 2 * 1 / 2 * weights / 2
    # One E4M3 scale per 16x16 tile, also twice; XLA:CPU widens the scale bytes to f16 (2 bytes).
    assert on["by_dtype"]["f16"] == 2 * 1 / 2 * weights / 256 * 2
    assert off["by_dtype"]["f32"] - on["by_dtype"]["f32"] >= 4 * 1 / 2 * weights
    assert on["bytes"] < off["bytes"]
    # The weight gradients' reduction is untouched: it stays in float32.
    assert runs["on"]["collectives"]["all-reduce"] == runs["off"]["collectives"]["all-reduce"]


def test_shards_that_split_a_tile_are_refused_before_anything_is_written(tmp_path):
    """d_model 32 over mesh.fsdp=8 leaves 4 columns per shard: no device holds a whole 16x16 tile."""
    overrides = [*TINY, "mesh.fsdp=8", "train.batch_size=8", "precision.fp4_param_gather=true"]
    done = _fp4lm("train", *overrides, f"train.run_dir={tmp_path / 'run'}", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "not a whole number of 16x16 tiles" in done.stderr
    assert "precision.fp4_param_gather=false" in done.stderr
    assert not (tmp_path / "run").exists()


def test_where_it_changes_nothing_the_run_says_so(tmp_path, capsys):
    """On one device, and with a recipe that quantizes nothing, the flag is a no-op: `fp4lm train` says why in
    one line at its start (and trains); the dry run says so too, in its text and its JSON."""
    from fp4lm import cli

    on = [*TINY, "precision.fp4_param_gather=true", "train.steps=2", "eval.sample_tokens=0"]
    assert cli.run(["train", *on, "precision.recipe=bf16", f"train.run_dir={tmp_path / 'bf16'}"]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if "fp4_param_gather" in line]
    assert notes == [
        "note: precision.fp4_param_gather=true changes nothing here: no linear layer is quantized "
        "(precision.recipe=bf16); it gathers NVFP4 weights sharded over mesh.fsdp in 4 bits (set it to false to "
        "drop this note)"
    ]
    assert cli.run(["train", *on, f"train.run_dir={tmp_path / 'dry'}", "--dry-run"]) == 0
    text = capsys.readouterr().out
    one_device = "no quantized weight is sharded over FSDP (mesh.fsdp=1, mesh.expert=1; 1 device)"
    assert text.count(f"note: precision.fp4_param_gather=true changes nothing here: {one_device};") == 1
    assert cli.run(["train", *on, f"train.run_dir={tmp_path / 'dry'}", "--dry-run", "--json"]) == 0
    gathered = json.loads(capsys.readouterr().out)["precision"]["fp4_param_gather"]
    assert gathered["layers"] == [] and one_device in gathered["note"]
