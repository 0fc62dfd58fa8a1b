"""A mixture-of-experts run end to end: its routing and per-expert telemetry reach metrics.jsonl and the report."""

import json

import pytest

from fp4lm.config import load_config
from fp4lm.train import train

pytestmark = pytest.mark.slow

MOE = ["model.num_experts=4", "model.experts_per_token=2", "model.moe_mlp_dim=32"]


def test_routing_and_each_experts_telemetry_are_logged_and_reported(tmp_path, tiny):
    run_dir = tmp_path / "run"
    overrides = [*tiny, *MOE, f"train.run_dir={run_dir}", "train.steps=2", "metrics.quant_stats_every=2"]
    config = load_config(None, overrides)
    summary = train(config)
    assert summary["steps"] == 2
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_records = [r for r in records if "loss" in r]
    assert [r["step"] for r in train_records] == [1, 2]
    for record in train_records:
        routing = record["routing"]["blocks.0.mlp"]
        assert set(routing) == {
            "max_over_mean_tokens",
            "dropped_fraction",
            "load_balance",
            "z_loss",
            "aux_loss",
            "entropy",
        }
        assert 1 <= routing["max_over_mean_tokens"] <= 4 and routing["dropped_fraction"] == 0  # dropless
        assert 0 < routing["entropy"] <= 1.3863  # ln 4
    stats = next(r["quant_stats"] for r in records if "quant_stats" in r)
    experts = sorted(name for name in stats if ".experts." in name)
    assert experts == sorted(f"blocks.0.mlp.experts.{p}.{e}" for p in ("gate", "up", "down") for e in range(4))
    assert all(stats[name]["w"]["rel_err"] > 0 for name in experts)

    from fp4lm.compare.records import build_record
    from fp4lm.report.plots import write_plots
    from fp4lm.report.results import aggregate

    fields = {"label": "nvfp4", "recipe": "nvfp4", "entry": "nvfp4", "display": "nvfp4", "overrides": []}
    record = build_record(
        spec_fields=fields, config=config.to_dict(), run_dir=run_dir, status="finished", train_wall_s=1.0
    )
    assert record["routing"]["step"] == [1, 2] and list(record["routing"]["blocks"]) == ["blocks.0.mlp"]
    out = tmp_path / "report"
    out.mkdir()
    plots = write_plots(aggregate([record], command="c", preset=None), out)
    assert [p.file for p in plots] == ["loss.png", "quant_nvfp4.png", "routing_nvfp4.png", "throughput.png"]


def test_a_run_with_loss_free_balancing_saves_resumes_and_samples_with_its_biases(tmp_path, tiny):
    """The routers' selection biases live in the train state: saved, restored on resume, read by the end-of-run
    sample and by `fp4lm eval`/`sample` (the saved run's variables)."""
    from fp4lm.inference.saved_run import load_run

    run_dir = tmp_path / "run"
    overrides = [*tiny, *MOE, f"train.run_dir={run_dir}", "model.router_bias_update=0.01", "checkpoint.every=1"]
    assert train(load_config(None, [*overrides, "train.steps=1"]))["steps"] == 1
    assert train(load_config(None, [*overrides, "train.steps=2"]))["steps"] == 2  # resumed from step 1
    run = load_run(str(run_dir))
    bias = run.params["blocks"][0]["mlp"]["router_bias"]
    assert run.step == 2 and float(abs(bias).max()) == pytest.approx(0.02)  # the busiest expert: down twice
