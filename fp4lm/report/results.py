"""Aggregates the records of one comparison into results.json: curves, final metrics and the gap to bf16.

The relative gap of a recipe is (val_loss - val_loss_bf16) / val_loss_bf16, in percent: positive means
the recipe is worse than bf16. It is measured at every evaluation step both runs share, and at the end.
"""

from __future__ import annotations

from typing import Any

TABLE_COLUMNS = (
    ("display", "recipe"),
    ("val_loss", "final val loss"),
    ("gap_pct", "gap to bf16 (%)"),
    ("perplexity", "perplexity"),
    ("train_loss", "final train loss"),
    ("skipped_steps", "skipped steps"),
    ("tokens_per_sec", "tokens/s"),
    ("status", "status"),
)


def relative_gap_pct(value: float | None, baseline: float | None) -> float | None:
    if value is None or baseline is None or baseline == 0:
        return None
    return 100.0 * (value - baseline) / baseline


def gap_curve(record: dict[str, Any], baseline: dict[str, Any]) -> dict[str, list]:
    """The gap at each evaluation step present in both runs."""
    base_val = baseline["curves"]["val"]
    base_by_step = dict(zip(base_val["step"], base_val["val_loss"], strict=True))
    val = record["curves"]["val"]
    curve: dict[str, list] = {"step": [], "tokens": [], "gap_pct": []}
    for step, tokens, loss in zip(val["step"], val["tokens"], val["val_loss"], strict=True):
        if step in base_by_step:
            curve["step"].append(step)
            curve["tokens"].append(tokens)
            curve["gap_pct"].append(relative_gap_pct(loss, base_by_step[step]))
    return curve


def find_baseline(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The plain bf16 record (recipe bf16 without overrides), if the comparison has one."""
    return next((r for r in records if r["recipe"] == "bf16" and not r["overrides"]), None)


def table_rows(recipes: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for entry in recipes.values():
        final = entry["final"]
        rows.append(
            {
                "label": entry["label"],
                "display": entry["display"],
                "val_loss": final["val_loss"],
                "gap_pct": final["gap_pct"],
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


def aggregate(records: list[dict[str, Any]], *, command: str, preset: str | None) -> dict[str, Any]:
    """results.json content. `records` in the order the user listed the recipes."""
    baseline = find_baseline(records)
    recipes: dict[str, dict[str, Any]] = {}
    for record in records:
        entry = {key: value for key, value in record.items() if key not in ("version",)}
        base_loss = baseline["final"]["val_loss"] if baseline else None
        entry["final"] = {**record["final"], "gap_pct": relative_gap_pct(record["final"]["val_loss"], base_loss)}
        entry["curves"] = {**record["curves"]}
        if baseline is not None:
            entry["curves"]["gap"] = gap_curve(record, baseline)
        recipes[record["label"]] = entry
    return {
        "command": command,
        "preset": preset,
        "baseline": baseline["label"] if baseline else None,
        "order": [record["label"] for record in records],
        "warnings": comparability_warnings(records),
        "table": table_rows(recipes),
        "recipes": recipes,
    }


def format_cell(key: str, value: Any) -> str:
    """One table cell as text; the same strings go into report.md and report.html."""
    if value is None:
        return "n/a"
    if key in ("val_loss", "train_loss"):
        return f"{value:.4f}"
    if key == "gap_pct":
        return f"{value:+.2f}"
    if key == "perplexity":
        return f"{value:.2f}"
    if key == "tokens_per_sec":
        return f"{value:,.0f}"
    return str(value)
