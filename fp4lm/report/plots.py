"""PNG plots of a comparison, drawn with matplotlib's object API (Figure + Agg), no pyplot global state.

- loss.png: training and validation loss against tokens, one line per recipe (a dashed vertical line
  marks a late switch to bf16);
- gap.png: relative validation-loss gap to bf16 (%) over training;
- throughput.png: tokens/s per recipe;
- quant_<label>.png per recipe with telemetry: layers x training steps heatmaps of the relative
  quantization error, the underflow fraction and the saturated fraction, one row per operand.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from typing import TYPE_CHECKING, Any

import numpy as np

from fp4lm.extras import require
from fp4lm.linear_layers import BLOCK_LINEAR_NAMES

if TYPE_CHECKING:
    from matplotlib.figure import Figure

HEATMAP_METRICS = (
    ("rel_err", "relative quantization error", "viridis"),
    ("underflow_frac", "underflowed block scales (fraction)", "magma"),
    ("saturated_frac", "saturated values (fraction)", "magma"),
)


@dataclasses.dataclass(frozen=True)
class Plot:
    file: str  # relative to the comparison directory
    title: str


def require_matplotlib(module: str = "matplotlib"):
    """A matplotlib module (the `report` extra), or a UserError naming the extra; compare checks it before training."""
    return require(module, "report", purpose="fp4lm compare's plots")


def _new_figure(width: float, height: float) -> Figure:
    figure = require_matplotlib("matplotlib.figure").Figure(figsize=(width, height), dpi=100, layout="constrained")
    require_matplotlib("matplotlib.backends.backend_agg").FigureCanvasAgg(figure)
    return figure


def _as_array(values: list) -> np.ndarray:
    return np.array([math.nan if v is None else v for v in values], dtype=float)


def _entries(results: dict[str, Any]) -> list[dict[str, Any]]:
    return [results["recipes"][label] for label in results["order"]]


def _mark_precision_switch(ax, entry: dict[str, Any], color) -> None:
    """A dashed vertical line where the run switched its quantized layers to bf16 (precision.bf16_after)."""
    for event in entry.get("events", []):
        if event.get("event") == "precision_switch":
            ax.axvline(event["tokens"], color=color, linestyle="--", linewidth=0.8, alpha=0.7)


def plot_loss(results: dict[str, Any], path: pathlib.Path) -> None:
    figure = _new_figure(12, 4.5)
    train_ax, val_ax = figure.subplots(1, 2)
    for entry in _entries(results):
        train, val = entry["curves"]["train"], entry["curves"]["val"]
        (line,) = train_ax.plot(train["tokens"], _as_array(train["loss"]), label=entry["display"], linewidth=1.2)
        val_ax.plot(val["tokens"], _as_array(val["val_loss"]), marker="o", markersize=3, label=entry["display"])
        for ax in (train_ax, val_ax):
            _mark_precision_switch(ax, entry, line.get_color())
    for ax, title in ((train_ax, "training loss"), (val_ax, "validation loss")):
        ax.set_xlabel("tokens")
        ax.set_ylabel("loss (nats/token)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    figure.savefig(path)


def plot_gap(results: dict[str, Any], path: pathlib.Path) -> None:
    figure = _new_figure(8, 4.5)
    ax = figure.subplots()
    for entry in _entries(results):
        if entry["label"] == results["baseline"]:
            continue
        gap = entry["curves"]["gap"]
        (line,) = ax.plot(gap["tokens"], _as_array(gap["gap_pct"]), marker="o", markersize=3, label=entry["display"])
        _mark_precision_switch(ax, entry, line.get_color())
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xlabel("tokens")
    ax.set_ylabel("validation loss gap to bf16 (%)")
    ax.set_title("relative validation-loss gap to bf16 (positive = worse than bf16)")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    figure.savefig(path)


def plot_throughput(results: dict[str, Any], path: pathlib.Path) -> None:
    entries = _entries(results)
    figure = _new_figure(max(5.0, 1.1 * len(entries) + 2), 4.5)
    ax = figure.subplots()
    values = [entry["final"]["tokens_per_sec"] or 0.0 for entry in entries]
    positions = np.arange(len(entries))
    bars = ax.bar(positions, values, color="tab:blue")
    ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize=8)
    ax.set_xticks(positions, [entry["display"] for entry in entries], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("tokens/s (steady state)")
    ax.set_title("training throughput")
    ax.grid(axis="y", alpha=0.3)
    figure.savefig(path)


# Parts of the projection names in the order data flows through a block, so heatmap rows read like the model:
# ("attn", "q", "k", "v", "o", "mlp", "gate", "up", "down").
_PROJECTION_ORDER = tuple(dict.fromkeys(part for name in BLOCK_LINEAR_NAMES for part in name.split(".")))


def layer_sort_key(path: str) -> tuple:
    """`blocks.10.attn.q` after `blocks.2.mlp.down`: numbers compare as numbers, projections in model order."""
    key = []
    for part in path.split("."):
        if part.isdigit():
            key.append((0, int(part), ""))
        elif part in _PROJECTION_ORDER:
            key.append((1, _PROJECTION_ORDER.index(part), ""))
        else:
            key.append((2, 0, part))
    return tuple(key)


def heatmap_matrix(quant_stats: dict[str, Any], operand: str, metric: str) -> tuple[list[str], np.ndarray]:
    """Rows: layer paths that have this operand, in model order; columns: telemetry steps; NaN where absent."""
    layers = sorted(
        (layer for layer, operands in quant_stats["layers"].items() if operand in operands), key=layer_sort_key
    )
    rows = [_as_array(quant_stats["layers"][layer][operand][metric]) for layer in layers]
    matrix = np.vstack(rows) if rows else np.zeros((0, len(quant_stats["step"])))
    return layers, matrix


def operands_of(quant_stats: dict[str, Any]) -> list[str]:
    seen: dict[str, None] = {}
    for operands in quant_stats["layers"].values():
        for operand in operands:
            seen.setdefault(operand, None)
    return list(seen)


def plot_quant_health(entry: dict[str, Any], path: pathlib.Path) -> None:
    """One row of panels per operand; columns are the metrics in HEATMAP_METRICS, each on one colour scale."""
    quant_stats = entry["quant_stats"]
    operands = operands_of(quant_stats)
    steps = quant_stats["step"]
    num_layers = max(len(heatmap_matrix(quant_stats, op, "rel_err")[0]) for op in operands)
    panel_height = max(1.6, 0.15 * num_layers + 0.8)
    figure = _new_figure(15, panel_height * len(operands) + 1.2)
    axes = figure.subplots(len(operands), len(HEATMAP_METRICS), squeeze=False, sharex=True)
    tick_every = max(1, len(steps) // 8)
    for column, (metric, title, cmap) in enumerate(HEATMAP_METRICS):
        matrices = [heatmap_matrix(quant_stats, operand, metric) for operand in operands]
        finite = np.concatenate([matrix[np.isfinite(matrix)] for _, matrix in matrices])
        upper = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
        colours = require_matplotlib().colormaps[cmap].with_extremes(bad="lightgrey")
        image = None
        for row, (operand, (layers, matrix)) in enumerate(zip(operands, matrices, strict=True)):
            ax = axes[row][column]
            image = ax.imshow(
                np.ma.masked_invalid(matrix), aspect="auto", interpolation="nearest", cmap=colours, vmin=0.0, vmax=upper
            )
            ax.set_title(f"{operand}: {title}" if row == 0 else operand, fontsize=8)
            ax.set_yticks(range(len(layers)), layers if column == 0 else [], fontsize=6)
            ax.set_xticks(range(0, len(steps), tick_every), [str(s) for s in steps[::tick_every]], fontsize=7)
        axes[-1][column].set_xlabel("step", fontsize=7)
        assert image is not None  # operands is not empty (max() over them above)
        figure.colorbar(image, ax=axes[:, column], fraction=0.05)
    figure.suptitle(f"quantization health: {entry['display']} (layers x steps; grey = not quantized then)")
    figure.savefig(path)


def has_telemetry(entry: dict[str, Any]) -> bool:
    stats = entry.get("quant_stats") or {}
    return bool(stats.get("step")) and any(stats.get("layers", {}).values())


def write_plots(results: dict[str, Any], out_dir: pathlib.Path) -> list[Plot]:
    """Draws every plot into out_dir and returns them in report order."""
    plots = [Plot("loss.png", "Training and validation loss against tokens")]
    plot_loss(results, out_dir / "loss.png")
    if results["baseline"] is not None and len(results["order"]) > 1:
        plot_gap(results, out_dir / "gap.png")
        plots.append(Plot("gap.png", "Relative validation-loss gap to bf16 over training"))
    plot_throughput(results, out_dir / "throughput.png")
    plots.append(Plot("throughput.png", "Training throughput per recipe"))
    for entry in _entries(results):
        if has_telemetry(entry):
            file = f"quant_{entry['label']}.png"
            plot_quant_health(entry, out_dir / file)
            plots.append(Plot(file, f"Quantization health: {entry['display']}"))
    return plots
