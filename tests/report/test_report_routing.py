"""Does a recipe change routing? Settled routing per run and its paired difference to bf16, seed by seed."""

from __future__ import annotations

import math

import pytest

from fp4lm.report import stats
from fp4lm.report.markdown import render_markdown
from fp4lm.report.results import aggregate
from fp4lm.report.routing import routing_comparison, settled_routing
from tests.report.test_report_records import make_record


def _record(load: list[float], entropy: list[float]) -> dict:
    """A run whose two MoE blocks logged `load` (block 0; block 1 adds 1) and `entropy` at 8 steps."""
    steps = list(range(5, 45, 5))
    blocks = {
        f"blocks.{b}.mlp": {"max_over_mean_tokens": [v + b for v in load], "entropy": [v - b for v in entropy]}
        for b in (0, 1)
    }
    return {"routing": {"step": steps, "blocks": blocks}}


def test_settled_routing_is_the_last_quarter_averaged_over_blocks():
    record = _record([9, 9, 9, 9, 9, 9, 1.0, 3.0], [0, 0, 0, 0, 0, 0, 2.0, 2.5])
    settled = settled_routing(record)
    assert settled == {"max_over_mean_tokens": pytest.approx((1 + 3 + 2 + 4) / 4), "entropy": pytest.approx(1.75)}
    assert settled_routing({"routing": {"step": [], "blocks": {}}}) is None  # a dense run


def test_the_paired_difference_to_bf16_has_a_t_interval():
    flat = [1.0] * 8
    groups = {
        "bf16": {seed: _record([1.2 + 0.1 * seed] * 8, flat) for seed in range(3)},
        "nvfp4": {seed: _record([1.2 + 0.1 * seed + d] * 8, flat) for seed, d in enumerate((0.1, 0.3, 0.2))},
    }
    comparison = routing_comparison(groups, "bf16")
    load = comparison["difference"]["nvfp4"]["max_over_mean_tokens"]
    assert load["seeds"] == [0, 1, 2] and load["per_seed"] == pytest.approx([0.1, 0.3, 0.2])
    half = stats.t_quantile_975(2) * 0.1 / math.sqrt(3)  # sd of 0.1, 0.3, 0.2 is 0.1
    assert load["mean"] == pytest.approx(0.2) and load["ci95"] == pytest.approx([0.2 - half, 0.2 + half])
    assert comparison["difference"]["nvfp4"]["entropy"]["mean"] == pytest.approx(0.0)
    assert "bf16" not in comparison["difference"]


def test_a_moe_comparison_reports_routing_by_seed(tmp_path):
    records = []
    for recipe, offset in (("bf16", 0.0), ("nvfp4", 0.02)):
        for seed in (0, 1):
            record = make_record(tmp_path / f"s{seed}", recipe, recipe, offset=offset + 0.01 * seed, moe=True)
            records.append({**record, "group": recipe, "seed": seed})
    results = aggregate(records, command="fp4lm compare", preset=None)
    assert results["routing"]["per_seed"]["nvfp4"][1]["entropy"] == pytest.approx(2.0 - 37.5 / 100 - 0.05)
    text = render_markdown(results, [])
    assert "## Routing by seed" in text and "| seed | bf16 max/mean tokens | nvfp4 max/mean tokens" in text
    assert "nvfp4 minus bf16, paired over 2 seeds: max_over_mean_tokens +0.0000" in text
    dense = [{**make_record(tmp_path / "d", "bf16", "bf16", offset=0.0), "group": "bf16", "seed": 0}]
    assert aggregate(dense, command="x", preset=None)["routing"] is None
