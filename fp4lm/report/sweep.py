"""Where each recipe diverges: a `fp4lm compare --sweep` drawn as final validation loss against the swept value.

A run *diverged* when training stopped on non-finite values or the skip limit (status "diverged"), when its
final validation loss is missing or not finite, or when that loss is above the first training loss it logged
(it ended worse than it started). Per recipe and sweep point: the mean final validation loss over the seeds
that did not diverge, and how many diverged. A recipe's *stable range* is the swept values at which no seed
diverged. With two swept keys the first is the x axis and the second draws one line per value.
"""

from __future__ import annotations

import math
from typing import Any

SWEEP_NOTE = (
    "Final validation loss at each swept value, the mean over the seeds that did not diverge; a run diverged "
    "when it stopped on non-finite values or the skip limit, or ended above the first training loss it logged. "
    "The stable range is the values at which no seed diverged."
)


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def diverged(record: dict[str, Any]) -> bool:
    """Whether the run diverged (module docstring)."""
    if record.get("status") == "diverged":
        return True
    final = (record.get("final") or {}).get("val_loss")
    if final is None or not math.isfinite(final):
        return True
    start = next((loss for loss in record["curves"]["train"]["loss"] if loss is not None), None)
    return start is not None and final > start


def _sort_key(value: str) -> tuple[int, float, str]:
    number = _number(value)
    return (0, number, value) if number is not None else (1, 0.0, value)


def sweep_summary(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """results.json's "sweep": keys, values per key, and per recipe per point the seeds' outcome; None when the
    comparison swept nothing."""
    swept = [record for record in records if record.get("sweep")]
    if not swept:
        return None
    keys = list(swept[0]["sweep"])
    values = {key: sorted({record["sweep"][key] for record in swept}, key=_sort_key) for key in keys}
    recipes: dict[str, dict[str, Any]] = {}
    for record in swept:
        entry = recipes.setdefault(record["sweep_group"], {"display": record["sweep_display"], "points": {}})
        point = entry["points"].setdefault(_point_id(record["sweep"], keys), {"sweep": record["sweep"], "runs": {}})
        final = record["final"]["val_loss"]
        point["runs"][str(record["seed"])] = {"val_loss": final, "diverged": diverged(record)}
    for entry in recipes.values():
        for point in entry["points"].values():
            kept = [run["val_loss"] for run in point["runs"].values() if not run["diverged"]]
            point["mean_val_loss"] = sum(kept) / len(kept) if kept else None
            point["diverged"] = sum(run["diverged"] for run in point["runs"].values())
            point["seeds"] = len(point["runs"])
        entry["stable"] = _stable_values(entry, keys, values)
    return {"keys": keys, "values": values, "recipes": recipes}


def _point_id(point: dict[str, str], keys: list[str]) -> str:
    return ",".join(f"{key}={point[key]}" for key in keys)


def _point_at(entry: dict[str, Any], keys: list[str], value: str, other: str | None) -> dict[str, Any] | None:
    """The recipe's point at the first key's ``value`` (and the second key's ``other``), if it ran."""
    point = {keys[0]: value} if other is None else {keys[0]: value, keys[1]: other}
    return entry["points"].get(_point_id(point, keys))


def _stable_values(entry: dict[str, Any], keys: list[str], values: dict[str, list[str]]) -> list[str]:
    """The first key's values at which no seed diverged, at any value of the second key."""
    stable = []
    for value in values[keys[0]]:
        points = [p for p in entry["points"].values() if p["sweep"][keys[0]] == value]
        if points and all(p["diverged"] == 0 for p in points):
            stable.append(value)
    return stable


def sweep_table(summary: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """(header, rows): one row per recipe (and second-key value), one column per value of the first key, each
    cell the mean final validation loss and, where any seed diverged, how many of how many."""
    keys, values = summary["keys"], summary["values"]
    first, second = keys[0], keys[1] if len(keys) > 1 else None
    header = ["recipe"] + ([second] if second else []) + [f"{first}={v}" for v in values[first]] + ["stable range"]
    rows = []
    for entry in summary["recipes"].values():
        for other in values[second] if second else [None]:
            cells = [entry["display"]] + ([other] if second else [])
            for value in values[first]:
                cells.append(_cell(_point_at(entry, keys, value, other)))
            stable = entry["stable"]
            cells.append(f"{stable[0]} to {stable[-1]}" if stable else "none")
            rows.append(cells)
    return header, rows


def _cell(point: dict[str, Any] | None) -> str:
    if point is None:
        return ""
    loss = "diverged" if point["mean_val_loss"] is None else f"{point['mean_val_loss']:.4f}"
    if point["diverged"] and point["mean_val_loss"] is not None:
        loss += f" ({point['diverged']}/{point['seeds']} diverged)"
    return loss


def sweep_markdown(summary: dict[str, Any] | None) -> list[str]:
    """report.md's "Where each recipe diverges" section (no lines without a sweep)."""
    if summary is None:
        return []
    header, rows = sweep_table(summary)
    lines = ["## Where each recipe diverges", "", SWEEP_NOTE, "", "| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(header) - 2) + ["---"]) + "|")
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, ""]


def plot_sweep(summary: dict[str, Any], path, new_figure) -> None:
    """Final validation loss against the first swept value, a line per recipe (and second-key value); each
    diverged seed is an x at the top of the axes."""
    keys, values = summary["keys"], summary["values"]
    first, second = keys[0], keys[1] if len(keys) > 1 else None
    numbers = [_number(v) for v in values[first]]
    numeric = all(n is not None for n in numbers)
    xs = numbers if numeric else list(range(len(values[first])))
    figure = new_figure(8.0, 4.5)
    axes = figure.add_subplot()
    finite = [
        p["mean_val_loss"]
        for e in summary["recipes"].values()
        for p in e["points"].values()
        if p["mean_val_loss"] is not None
    ]
    top = max(finite) if finite else 1.0
    for entry in summary["recipes"].values():
        for other in values[second] if second else [None]:
            ys, marks = [], []
            for x, value in zip(xs, values[first], strict=True):
                point = _point_at(entry, keys, value, other)
                ys.append(math.nan if point is None or point["mean_val_loss"] is None else point["mean_val_loss"])
                if point is not None and point["diverged"]:
                    marks.append(x)
            label = entry["display"] + (f", {second}={other}" if second else "")
            (line,) = axes.plot(xs, ys, marker="o", label=label)
            if marks:
                axes.plot(marks, [top * 1.02] * len(marks), linestyle="none", marker="x", color=line.get_color())
    if numeric and min(numbers) > 0 and max(numbers) / min(numbers) >= 10:  # pyright: ignore[reportArgumentType]
        axes.set_xscale("log")
    if not numeric:
        axes.set_xticks(xs, values[first])
    axes.set_xlabel(first)
    axes.set_ylabel("final validation loss")
    axes.set_title("final validation loss against the swept value (x: a seed diverged)")
    axes.legend(fontsize="small")
    figure.savefig(path)
