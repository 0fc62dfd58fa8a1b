"""Does a recipe change routing? Each MoE run's settled routing, compared with bf16's on the same seed.

A run's settled value of a routing metric is its mean over the MoE blocks and over the last quarter of the
steps that logged routing (the router still moves early on). `max_over_mean_tokens` is the busiest expert's
tokens over the mean (1 when balanced); `entropy` the mean entropy of the router's distribution (nats).
Per recipe, the paired difference to bf16 on each shared seed, with a 95% interval from those differences
(Student's t), as the loss gap is formed (fp4lm.report.stats); absolute, not relative, differences.
"""

from __future__ import annotations

import math
from typing import Any

from fp4lm.report import stats

SETTLED_METRICS = ("max_over_mean_tokens", "entropy")
SETTLED_FRACTION = 0.25  # the last quarter of the logged steps


def settled_routing(record: dict[str, Any]) -> dict[str, float] | None:
    """{metric: settled value} of one run; None for a dense run (no routing logged)."""
    routing = record.get("routing") or {}
    blocks, steps = routing.get("blocks") or {}, routing.get("step") or []
    if not blocks or not steps:
        return None
    first = len(steps) - max(1, math.ceil(len(steps) * SETTLED_FRACTION))
    settled = {}
    for metric in SETTLED_METRICS:
        values = [v for series in blocks.values() for v in (series.get(metric) or [])[first:] if v is not None]
        if values:
            settled[metric] = sum(values) / len(values)
    return settled or None


def _difference(values: dict[int, float], baseline: dict[int, float]) -> dict[str, Any] | None:
    seeds = sorted(s for s in values if s in baseline)
    if not seeds:
        return None
    differences = [values[s] - baseline[s] for s in seeds]
    mean, sd = stats.mean_and_sd(differences)
    interval = None
    if sd is not None:
        half = stats.t_quantile_975(len(differences) - 1) * sd / math.sqrt(len(differences))
        interval = [mean - half, mean + half]
    return {"seeds": seeds, "per_seed": differences, "mean": mean, "ci95": interval}


def routing_comparison(groups: dict[str, dict[int, dict[str, Any]]], baseline: str | None) -> dict[str, Any] | None:
    """{"per_seed": {group: {seed: {metric: value}}}, "difference": {group: {metric: paired difference to the
    baseline}}}, or None when no run routed tokens."""
    per_seed = {
        group: {seed: settled for seed, record in runs.items() if (settled := settled_routing(record))}
        for group, runs in groups.items()
    }
    per_seed = {group: seeds for group, seeds in per_seed.items() if seeds}
    if not per_seed:
        return None
    difference = {}
    if baseline in per_seed:
        base = per_seed[baseline]
        for group, seeds in per_seed.items():
            if group == baseline:
                continue
            difference[group] = {
                metric: _difference(
                    {s: v[metric] for s, v in seeds.items() if metric in v},
                    {s: v[metric] for s, v in base.items() if metric in v},
                )
                for metric in SETTLED_METRICS
            }
    return {"metrics": list(SETTLED_METRICS), "per_seed": per_seed, "difference": difference}


ROUTING_BY_SEED_NOTE = (
    "Settled routing (the mean over the MoE blocks and the last quarter of the logged steps): the busiest "
    "expert's tokens over the mean (1 is balanced) and the router's entropy (nats)."
)


def routing_table(comparison: dict[str, Any]) -> tuple[list[str], list[list[str]], list[str]]:
    """(header, rows, sentences): the seed-by-seed table and, per recipe, its paired differences to the
    baseline in words; report.md and report.html render the same cells."""
    groups = list(comparison["per_seed"])
    seeds = sorted({seed for runs in comparison["per_seed"].values() for seed in runs})
    header = ["seed"] + [f"{group} {label}" for label in ("max/mean tokens", "entropy") for group in groups]
    rows = []
    for seed in seeds:
        cells = [str(seed)]
        for metric in SETTLED_METRICS:
            for group in groups:
                value = comparison["per_seed"][group].get(seed, {}).get(metric)
                cells.append("" if value is None else f"{value:.4f}")
        rows.append(cells)
    sentences = []
    for group, metrics in comparison["difference"].items():
        said, seeds_used = [], 0
        for metric, diff in metrics.items():
            if diff is None:
                continue
            seeds_used = len(diff["seeds"])
            interval = diff["ci95"]
            span = "" if interval is None else f" (95% interval {interval[0]:+.4f} to {interval[1]:+.4f})"
            said.append(f"{metric} {diff['mean']:+.4f}{span}")
        if said:
            sentences.append(f"{group} minus bf16, paired over {seeds_used} seeds: " + "; ".join(said) + ".")
    return header, rows, sentences


def routing_markdown(comparison: dict[str, Any] | None) -> list[str]:
    """report.md's "Routing by seed" section (no lines for a dense comparison)."""
    if comparison is None:
        return []
    header, rows, sentences = routing_table(comparison)
    lines = ["## Routing by seed", "", ROUTING_BY_SEED_NOTE, "", "| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join(["---:"] * len(header)) + "|")
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, "", *[line for sentence in sentences for line in (sentence, "")]]
