"""Aggregates the records of one comparison into results.json: curves, final metrics and the gap to bf16.

A comparison holds one or more records per recipe, one per seed (`fp4lm compare --seeds`). Records of one
recipe share a `group` (the recipe's label); a record without one is its own group. Per group:
- `final`: the MEAN over its seeds of the final validation loss (and train loss, tokens/s), `per_seed` the
  values of each seed;
- `gap`: the gap to bf16 over the seeds both have, as a mean with a 95% confidence interval from the
  paired differences (fp4lm.report.stats; one seed: no interval);
- `curves`: the mean over seeds at the steps every seed logged; `curves.gap` also carries the interval
  (`low_pct`, `high_pct`) at each evaluation step when there are several seeds.

The relative gap is (val_loss - val_loss_bf16) / val_loss_bf16, in percent: positive means worse than bf16.
"""

from __future__ import annotations

import math
from typing import Any

from fp4lm.config import parse_override
from fp4lm.report import stats
from fp4lm.report.routing import routing_comparison
from fp4lm.report.stats import relative_gap_pct
from fp4lm.report.sweep import sweep_summary

__all__ = ["TABLE_COLUMNS", "aggregate", "format_cell", "relative_gap_pct"]

TABLE_COLUMNS = (
    ("display", "recipe"),
    ("seeds", "seeds"),
    ("val_loss", "final val loss (mean)"),
    ("val_loss_per_seed", "per seed"),
    ("gap_pct", "gap to bf16 (%)"),
    ("gap_ci", "95% interval (%)"),
    ("verdict", "reading"),
    ("spread_pct", "seed spread (%)"),
    ("perplexity", "perplexity"),
    ("train_loss", "final train loss"),
    ("skipped_steps", "skipped steps"),
    ("tokens_per_sec", "tokens/s"),
    ("status", "status"),
)
TEXT_COLUMNS = ("display", "seeds", "val_loss_per_seed", "gap_ci", "verdict", "status")


def group_of(record: dict[str, Any]) -> str:
    return record.get("group") or record["label"]


def seed_of(record: dict[str, Any]) -> int:
    seed = record.get("seed")
    return int(seed if seed is not None else record["config"]["train"]["seed"])


def mean_curve(curves: list[dict[str, list]], key: str) -> dict[str, list]:
    """The mean of `key` over the curves at the steps all of them logged (None where any seed has None)."""
    common = set(curves[0]["step"]).intersection(*(c["step"] for c in curves[1:]))
    by_step = [dict(zip(c["step"], zip(c["tokens"], c[key], strict=True), strict=True)) for c in curves]
    steps = sorted(common)
    values = []
    for step in steps:
        points = [curve[step][1] for curve in by_step]
        values.append(None if any(v is None for v in points) else sum(points) / len(points))
    return {"step": steps, "tokens": [by_step[0][s][0] for s in steps], key: values}


def gap_curve(runs: dict[int, dict[str, Any]], baseline: dict[int, dict[str, Any]]) -> dict[str, list]:
    """The paired gap at each evaluation step every shared seed evaluated: mean, and the 95% interval if n > 1."""
    seeds = sorted(set(runs) & set(baseline))
    curve: dict[str, list] = {"step": [], "tokens": [], "gap_pct": [], "low_pct": [], "high_pct": []}
    if not seeds:
        return curve
    vals = {
        s: dict(zip(runs[s]["curves"]["val"]["step"], runs[s]["curves"]["val"]["val_loss"], strict=True)) for s in seeds
    }
    base = {
        s: dict(zip(baseline[s]["curves"]["val"]["step"], baseline[s]["curves"]["val"]["val_loss"], strict=True))
        for s in seeds
    }
    steps = sorted(set.intersection(*(set(vals[s]) & set(base[s]) for s in seeds)))
    tokens_per_step = runs[seeds[0]]["tokens_per_step"]
    for step in steps:
        interval = stats.paired_gap({s: vals[s][step] for s in seeds}, {s: base[s][step] for s in seeds})
        curve["step"].append(step)
        curve["tokens"].append(step * tokens_per_step)
        curve["gap_pct"].append(interval.mean_pct if interval else None)
        curve["low_pct"].append(interval.low_pct if interval else None)
        curve["high_pct"].append(interval.high_pct if interval else None)
    return curve


def _sweep_point(record: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((record.get("sweep") or {}).items()))


def find_baselines(records: list[dict[str, Any]]) -> dict[str, str]:
    """Each group's baseline: the group of the plain bf16 records (recipe bf16 with no overrides but the sweep's
    own) at the same sweep point; without a sweep, the one plain bf16 group. Groups with no such run are left out."""
    plain = {}
    for record in records:
        sweep_overrides = {f"{key}={value}" for key, value in (record.get("sweep") or {}).items()}
        if record["recipe"] == "bf16" and set(record["overrides"]) == sweep_overrides:
            plain.setdefault(_sweep_point(record), group_of(record))
    return {group_of(r): plain[_sweep_point(r)] for r in records if _sweep_point(r) in plain}


def baseline_name(records: list[dict[str, Any]], baselines: dict[str, str]) -> str | None:
    """How the report names the baseline: its group, or in a sweep "bf16 at the same <swept keys>"."""
    groups = sorted(set(baselines.values()))
    if len(groups) <= 1:
        return groups[0] if groups else None
    keys = next(record["sweep"] for record in records if record.get("sweep"))
    return f"bf16 at the same {', '.join(keys)}"


def effective_overrides(record: dict[str, Any], reference: dict[str, Any] | None) -> list[str]:
    """The recipe's overrides that changed something: those whose value differs from the reference run's."""
    if reference is None:
        return list(record["overrides"])
    kept = []
    for text in record["overrides"]:
        section, key, _ = parse_override(text)
        if record["config"].get(section, {}).get(key) != reference["config"].get(section, {}).get(key):
            kept.append(text)
    return kept


def short_display(record: dict[str, Any], reference: dict[str, Any] | None) -> str:
    """The display name without the overrides that changed nothing (e.g. a setting set to its default)."""
    parts = [text.split("=", 1) for text in effective_overrides(record, reference)]
    return " + ".join([record["recipe"], *(f"{key.split('.')[-1]}={value}" for key, value in parts)])


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known and len(known) == len(values) else None


def group_entry(runs: dict[int, dict[str, Any]], reference: dict[str, Any] | None) -> dict[str, Any]:
    """One recipe's entry from its records (seed -> record)."""
    seeds = sorted(runs)
    first = runs[seeds[0]]
    finals = [runs[s]["final"] for s in seeds]
    val_loss = _mean([f["val_loss"] for f in finals])
    statuses = {s: runs[s]["status"] for s in seeds}
    bad = [f"{status} (seed {s})" for s, status in statuses.items() if status != "finished"]
    skipped = [f["skipped_steps"] for f in finals if f["skipped_steps"] is not None]
    entry = {key: value for key, value in first.items() if key not in ("version", "seed", "group", "reused_from")}
    per_seed_losses = [f["val_loss"] for f in finals]
    entry.update(
        label=group_of(first),
        short_display=short_display(first, reference),
        effective_overrides=effective_overrides(first, reference),
        seeds=seeds,
        single_seed=bool(first.get("single_seed")),
        status=first["status"] if len(seeds) == 1 else (", ".join(bad) if bad else "finished"),
        per_seed=[
            {
                "seed": s,
                "label": runs[s]["label"],
                "val_loss": runs[s]["final"]["val_loss"],
                "reused_from": runs[s].get("reused_from"),
            }
            for s in seeds
        ],
        spread_pct=stats.seed_spread_pct(per_seed_losses) if None not in per_seed_losses else None,
        final={
            "val_loss": val_loss,
            "train_loss": _mean([f["train_loss"] for f in finals]),
            "perplexity": math.exp(val_loss) if val_loss is not None and val_loss < 700 else None,
            "skipped_steps": max(skipped) if skipped else None,
            "tokens_per_sec": _mean([f["tokens_per_sec"] for f in finals]),
            "steps": first["final"]["steps"],
        },
        curves={
            "train": mean_curve([runs[s]["curves"]["train"] for s in seeds], "loss"),
            "val": mean_curve([runs[s]["curves"]["val"] for s in seeds], "val_loss"),
        },
    )
    return entry


def verdict(entry: dict[str, Any], baseline: str | None, band: dict[str, Any] | None, *, any_baseline: bool) -> str:
    """How to read a recipe's gap to its `baseline` group: within noise, worse or better than bf16 (or why that
    cannot be said). `any_baseline`: whether the comparison has a plain bf16 run at all (a sweep may lack it at
    some points)."""
    gap = entry.get("gap")
    if entry["label"] == baseline:
        return "baseline"
    if gap is None:
        if baseline is None:
            return "no bf16 run at this sweep point" if any_baseline else "no bf16 run to compare with"
        return "no shared seed with bf16"
    if gap["ci95_pct"] is not None:
        if gap["within_noise"]:
            return "within noise"
        return "worse than bf16" if gap["mean_pct"] > 0 else "better than bf16"
    if band is None:
        return "1 seed: no interval"
    inside = abs(gap["mean_pct"]) <= band["band_pct"]
    return "1 seed: inside noise band" if inside else "1 seed: outside noise band"


def table_rows(recipes: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for entry in recipes.values():
        final, gap = entry["final"], entry.get("gap")
        seeds = ",".join(str(s) for s in entry["seeds"])
        rows.append(
            {
                "label": entry["label"],
                "display": entry["display"],
                "seeds": f"{seeds} (single seed)" if entry["single_seed"] else seeds,
                "val_loss": final["val_loss"],
                "val_loss_per_seed": [p["val_loss"] for p in entry["per_seed"]],
                "gap_pct": final["gap_pct"],
                "gap_ci": (gap["ci95_pct"] or "none (1 seed)") if gap and entry["verdict"] != "baseline" else None,
                "verdict": entry["verdict"],
                "spread_pct": entry["spread_pct"],
                "perplexity": final["perplexity"],
                "train_loss": final["train_loss"],
                "skipped_steps": final["skipped_steps"],
                "tokens_per_sec": final["tokens_per_sec"],
                "status": entry["status"],
            }
        )
    return rows


def comparability_warnings(records: list[dict[str, Any]]) -> list[str]:
    """Reasons the runs may not be comparable: different tokenizers, settings that differ beyond the recipe."""
    warnings = []
    tokenizers = {r["label"]: sha for r in records if (sha := r.get("tokenizer_sha256"))}
    if len(set(tokenizers.values())) > 1:
        warnings.append(
            "the runs used different tokenizers ("
            + ", ".join(f"{k}: {v[:8]}" for k, v in tokenizers.items())
            + "), so their losses are not directly comparable"
        )
    return warnings


def host_load(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The host's one-minute load average while the runs trained (the records' `train_load`): its range, and
    how many records predate load recording or were trained elsewhere without one."""
    loads = [load for r in records for load in (r.get("train_load") or []) if load is not None]
    unknown = sum(1 for r in records if not r.get("train_load"))
    return {"min": min(loads) if loads else None, "max": max(loads) if loads else None, "unknown": unknown}


def aggregate(records: list[dict[str, Any]], *, command: str, preset: str | None) -> dict[str, Any]:
    """results.json content. `records` in the order the user listed the recipes (a recipe's seeds together)."""
    groups: dict[str, dict[int, dict[str, Any]]] = {}
    for record in records:
        groups.setdefault(group_of(record), {})[seed_of(record)] = record
    baselines = find_baselines(records)
    baseline_groups = sorted(set(baselines.values()))
    single_baseline = baseline_groups[0] if len(baseline_groups) == 1 else None
    reference = next(iter(groups[baseline_groups[0]].values()), None) if baseline_groups else None
    recipes = {group: group_entry(runs, reference) for group, runs in groups.items()}
    intervals = {}
    for group, runs in groups.items():
        entry = recipes[group]
        interval = None
        if group in baselines:
            base_runs = groups[baselines[group]]
            base_losses = {s: r["final"]["val_loss"] for s, r in base_runs.items()}
            interval = stats.paired_gap({s: r["final"]["val_loss"] for s, r in runs.items()}, base_losses)
            entry["curves"]["gap"] = gap_curve(runs, base_runs)
        if interval is not None:
            intervals[group] = interval
        entry["gap"] = interval.to_dict() if interval else None
        entry["final"]["gap_pct"] = interval.mean_pct if interval else None
    band = stats.noise_band([i for g, i in intervals.items() if g not in baseline_groups])
    if band is not None:
        band["from"] = [g for g, i in intervals.items() if g not in baseline_groups and i.n >= 2]
    for group, entry in recipes.items():
        entry["verdict"] = verdict(entry, baselines.get(group), band, any_baseline=bool(baselines))
    base_spread = recipes[single_baseline]["spread_pct"] if single_baseline else None
    return {
        "command": command,
        "preset": preset,
        "baseline": baseline_name(records, baselines),
        "baseline_groups": baseline_groups,
        "order": list(groups),
        "noise": {"band": band, "bf16_spread_pct": base_spread},
        "warnings": comparability_warnings(records),
        "host_load": host_load(records),
        "table": table_rows(recipes),
        "recipes": recipes,
        "routing": routing_comparison(groups, single_baseline),
        "sweep": sweep_summary(records),
    }


def format_cell(key: str, value: Any) -> str:
    """One table cell as text; the same strings go into report.md and report.html."""
    if value is None:
        return "n/a"
    if key in ("val_loss", "train_loss"):
        return f"{value:.4f}"
    if key == "val_loss_per_seed":
        return ", ".join("n/a" if v is None else f"{v:.4f}" for v in value)
    if key == "gap_pct":
        return f"{value:+.2f}"
    if key == "gap_ci" and isinstance(value, list):
        return f"[{value[0]:+.2f}, {value[1]:+.2f}]"
    if key == "spread_pct":
        return f"{value:.2f}"
    if key == "perplexity":
        return f"{value:.2f}"
    if key == "tokens_per_sec":
        return f"{value:,.0f}"
    return str(value)
