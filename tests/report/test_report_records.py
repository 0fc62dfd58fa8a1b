import json
import math

import pytest

from fp4lm.compare import records
from fp4lm.jsonio import json_value, write_json_atomically
from fp4lm.report.plots import load_note
from fp4lm.report.results import aggregate, format_cell, host_load, relative_gap_pct
from tests.report.synthetic_runs import LAYERS, OPERANDS, config_dict, loss_at, write_run

TOKENS_PER_STEP = 4 * 32  # SMALL_MODEL: batch 4 x seq_len 32


def make_record(tmp_path, label, recipe, *, offset, overrides=(), tokenizer=None, **run_kwargs):
    run_dir = tmp_path / "runs" / label
    write_run(run_dir, offset=offset, quantized=recipe != "bf16", **run_kwargs)
    if tokenizer is not None:
        (run_dir / "tokenizer.json").write_text(tokenizer)
    fields = {"label": label, "recipe": recipe, "entry": label, "display": label, "overrides": list(overrides)}
    return records.build_record(
        spec_fields=fields, config=config_dict(recipe, run_dir), run_dir=run_dir, status="finished", train_wall_s=1.0
    )


def test_curves_tokens_and_final_metrics(tmp_path):
    record = make_record(tmp_path, "nvfp4", "nvfp4", offset=0.05)
    train, val = record["curves"]["train"], record["curves"]["val"]
    assert train["step"] == list(range(5, 41, 5))
    assert train["tokens"] == [s * TOKENS_PER_STEP for s in train["step"]]
    assert train["loss"] == pytest.approx([loss_at(s, 0.05) for s in train["step"]])
    assert val["step"] == [10, 20, 30, 40]
    assert val["val_loss"] == pytest.approx([loss_at(s, 0.05) + 0.1 for s in val["step"]])
    final = record["final"]
    assert final["val_loss"] == pytest.approx(loss_at(40, 0.05) + 0.1)
    assert final["perplexity"] == pytest.approx(math.exp(final["val_loss"]))
    assert final["skipped_steps"] == 1
    assert final["tokens_per_sec"] == 1000.0  # the first (compiling) step's 10 tok/s is left out
    assert final["steps"] == 40
    assert record["tokens_per_step"] == TOKENS_PER_STEP


def test_resumed_run_keeps_the_last_line_per_step(tmp_path):
    record = make_record(tmp_path, "nvfp4", "nvfp4", offset=0.0, resumed_at=20)
    train = record["curves"]["train"]
    assert train["step"] == list(range(5, 41, 5))
    assert train["loss"] == pytest.approx([loss_at(s, 0.0) for s in train["step"]])


def test_quant_series_aligned_with_gaps(tmp_path):
    record = make_record(tmp_path, "nvfp4", "nvfp4", offset=0.0)
    stats = record["quant_stats"]
    assert stats["step"] == [10, 20, 30, 40]
    assert set(stats["layers"]) == set(LAYERS)
    assert set(stats["layers"]["blocks.0.attn.q"]) == set(OPERANDS)
    assert stats["layers"]["blocks.1.mlp.down"]["fprop_w"]["rel_err"] == [None, 0.11, 0.11, 0.11]
    assert stats["layers"]["blocks.0.attn.q"]["wgrad_g"]["underflow_frac"] == [0.002] * 4


def test_precision_switch_event(tmp_path):
    record = make_record(tmp_path, "late", "nvfp4", offset=0.0, switch_at=32)
    assert record["events"] == [{"step": 32, "event": "precision_switch", "to": "bf16", "tokens": 32 * TOKENS_PER_STEP}]
    assert make_record(tmp_path, "nvfp4", "nvfp4", offset=0.0)["events"] == []


def test_unfinished_run_falls_back_to_metrics(tmp_path):
    record = make_record(tmp_path, "nvfp4", "nvfp4", offset=0.0, finished=False)
    assert record["summary"] is None
    assert record["final"]["val_loss"] == pytest.approx(loss_at(40, 0.0) + 0.1)
    assert record["final"]["train_loss"] == pytest.approx(loss_at(40, 0.0))
    assert record["final"]["skipped_steps"] == 1


def test_record_round_trip_is_strict_json(tmp_path):
    record = make_record(tmp_path, "bf16", "bf16", offset=0.0)
    record["final"]["val_loss"] = None
    path = records.record_path(tmp_path, "bf16")
    write_json_atomically(path, record)
    assert records.read_record(path) == json.loads(path.read_text())
    path.write_text("{not json")
    assert records.read_record(path) is None
    assert records.read_record(tmp_path / "missing.json") is None
    assert json_value({"a": [float("nan"), 1.0, float("inf")]}) == {"a": [None, 1.0, None]}


def test_results_gap_to_bf16(tmp_path):
    bf16 = make_record(tmp_path, "bf16", "bf16", offset=0.0)
    nvfp4 = make_record(tmp_path, "nvfp4", "nvfp4", offset=0.05)
    late = make_record(tmp_path, "late", "nvfp4", offset=0.01, overrides=["precision.bf16_after=0.8"])
    results = aggregate([bf16, nvfp4, late], command="fp4lm compare --recipes x", preset="quick")
    assert results["baseline"] == "bf16"
    assert results["order"] == ["bf16", "nvfp4", "late"]
    base = loss_at(40, 0.0) + 0.1
    expected = 100 * 0.05 / base
    assert results["recipes"]["nvfp4"]["final"]["gap_pct"] == pytest.approx(expected)
    assert results["recipes"]["bf16"]["final"]["gap_pct"] == 0.0
    gap = results["recipes"]["nvfp4"]["curves"]["gap"]
    assert gap["step"] == [10, 20, 30, 40]
    assert gap["gap_pct"][0] == pytest.approx(100 * 0.05 / (loss_at(10, 0.0) + 0.1))
    assert [row["label"] for row in results["table"]] == ["bf16", "nvfp4", "late"]
    assert results["table"][2]["gap_pct"] == pytest.approx(100 * 0.01 / base)
    json.dumps(results, allow_nan=False)


def test_results_without_bf16_have_no_gap(tmp_path):
    nvfp4 = make_record(tmp_path, "nvfp4", "nvfp4", offset=0.05)
    results = aggregate([nvfp4], command="c", preset=None)
    assert results["baseline"] is None
    assert results["recipes"]["nvfp4"]["final"]["gap_pct"] is None
    assert "gap" not in results["recipes"]["nvfp4"]["curves"]


def _swept(tmp_path, recipe, lr, offset):
    group = f"{recipe}_lr-{lr}"
    record = make_record(tmp_path, f"{group}_seed-0", recipe, offset=offset, overrides=[f"optimizer.lr={lr}"])
    sweep = {"sweep": {"optimizer.lr": lr}, "sweep_group": recipe, "sweep_display": recipe}
    return {**record, "group": group, "seed": 0, **sweep}


def test_a_sweep_pairs_each_recipe_with_bf16_at_the_same_value(tmp_path):
    """Every swept value has its own bf16 run: the gap is to that one; a value without bf16 has no gap."""
    records = [
        _swept(tmp_path, "bf16", "1e-3", 0.0),
        _swept(tmp_path, "bf16", "1e-2", 0.2),
        _swept(tmp_path, "nvfp4", "1e-3", 0.05),
        _swept(tmp_path, "nvfp4", "1e-2", 0.25),
        _swept(tmp_path, "nvfp4", "1e-1", 0.5),
    ]
    results = aggregate(records, command="c", preset=None)
    assert results["baseline"] == "bf16 at the same optimizer.lr"
    assert results["baseline_groups"] == ["bf16_lr-1e-2", "bf16_lr-1e-3"]
    recipes = results["recipes"]
    assert recipes["nvfp4_lr-1e-3"]["final"]["gap_pct"] == pytest.approx(100 * 0.05 / (loss_at(40, 0.0) + 0.1))
    assert recipes["nvfp4_lr-1e-2"]["final"]["gap_pct"] == pytest.approx(100 * 0.05 / (loss_at(40, 0.2) + 0.1))
    assert recipes["bf16_lr-1e-2"]["verdict"] == "baseline"
    assert recipes["nvfp4_lr-1e-1"]["verdict"] == "no bf16 run at this sweep point"
    assert recipes["nvfp4_lr-1e-1"]["final"]["gap_pct"] is None


def test_relative_gap_and_cells():
    assert relative_gap_pct(3.03, 3.0) == pytest.approx(1.0)
    assert relative_gap_pct(None, 3.0) is None and relative_gap_pct(3.0, None) is None
    assert format_cell("gap_pct", 1.23456) == "+1.23"
    assert format_cell("val_loss", 2.5) == "2.5000"
    assert format_cell("tokens_per_sec", 12345.6) == "12,346"
    assert format_cell("perplexity", None) == "n/a"


def test_different_tokenizers_are_flagged(tmp_path):
    same = [make_record(tmp_path, name, name, offset=0.0, tokenizer='{"v": 1}') for name in ("bf16", "nvfp4")]
    assert same[0]["tokenizer_sha256"] == same[1]["tokenizer_sha256"] is not None
    assert aggregate(same, command="c", preset=None)["warnings"] == []
    other = make_record(tmp_path, "fp8", "fp8", offset=0.0, tokenizer='{"v": 2}')
    (warning,) = aggregate([*same, other], command="c", preset=None)["warnings"]
    assert "different tokenizers" in warning and "fp8" in warning


def test_the_report_states_the_host_load_its_throughput_was_measured_under(tmp_path):
    idle = make_record(tmp_path, "bf16", "bf16", offset=0.0)
    busy = make_record(tmp_path, "nvfp4", "nvfp4", offset=0.05)
    idle["train_load"], busy["train_load"] = [0.4, 0.9], [1.2, 3.1]
    assert host_load([idle, busy]) == {"min": 0.4, "max": 3.1, "unknown": 0}
    note = load_note(aggregate([idle, busy], command="x", preset=None)["host_load"])
    assert "0.40 to 3.10" in note and "slowed them unevenly" in note
    old = make_record(tmp_path, "mxfp4", "mxfp4", offset=0.05)  # a record from before the load was kept
    assert old["train_load"] is None
    note = load_note(host_load([idle, old]))
    assert "0.40 to 0.90" in note and "1 run trained before the load was recorded" in note and "idle" in note
    assert load_note(host_load([old])) == "The host's load was not recorded for these runs."


def test_a_moe_run_records_its_routing_per_block(tmp_path):
    record = make_record(tmp_path, "nvfp4", "nvfp4", offset=0.0, moe=True)
    routing = record["routing"]
    assert routing["step"] == list(range(5, 41, 5))
    assert sorted(routing["blocks"]) == ["blocks.0.mlp", "blocks.1.mlp"]
    assert routing["blocks"]["blocks.1.mlp"]["max_over_mean_tokens"] == pytest.approx(
        [1 + 10 / s for s in routing["step"]]
    )
    assert set(routing["blocks"]["blocks.0.mlp"]) == set(records.ROUTING_METRICS)
    assert "blocks.1.mlp.experts.down.2" in record["quant_stats"]["layers"]
    dense = make_record(tmp_path / "dense", "bf16", "bf16", offset=0.0)
    assert dense["routing"] == {"step": [], "blocks": {}}
