"""PNG plots of a comparison, drawn with matplotlib's object API (Figure + Agg), no pyplot global state.

- loss.png: training loss, validation loss, and the validation loss of the last part of training zoomed in
  (where the recipes differ by a fraction of a percent), one line per recipe (the mean over its seeds), the
  legend below the panels; a dashed vertical line, labelled, marks a late switch to bf16;
- gap.png: relative validation-loss gap to bf16 (%) over training, with the 95% interval of the paired seeds
  as a band, and the single-seed noise band around 0 when the comparison has one;
- throughput.png: tokens/s per recipe on the machine that ran the comparison (an appendix of the report:
  FP4 emulated on a CPU or a GPU without FP4 tensor cores is slower than bf16; `fp4lm project` models FP4
  hardware);
- quant_<label>.png per recipe with telemetry: layers x training steps heatmaps, one row of panels per
  operand (weights, activations, gradients), one column per metric that is not constant, each panel with its
  own colour bar; a mixture-of-experts projection has one row per expert (`blocks.1.mlp.experts.gate.3`);
- sweep.png for a `--sweep`: final validation loss against the swept value per recipe, diverged seeds marked.
- routing_<label>.png per recipe of a mixture-of-experts model: each MoE block's routing over the training
  steps (the busiest expert's load, dropped pairs, the balancing loss, z-loss, the router's entropy), one
  line per block, one panel per metric that is not constant.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from typing import TYPE_CHECKING, Any

import numpy as np

from fp4lm.extras import require
from fp4lm.host_load import IDLE_LOAD
from fp4lm.linear_layers import BLOCK_LINEAR_NAMES
from fp4lm.report.sweep import plot_sweep

if TYPE_CHECKING:
    from matplotlib.figure import Figure

HEATMAP_METRICS = (
    ("rel_err", "relative quantization error", "viridis"),
    ("underflow_frac", "underflowed block scales (fraction)", "magma"),
    ("saturated_frac", "saturated values (fraction)", "magma"),
)

# Telemetry operand names end in the kind of tensor: "w", "fprop_w" (weights), "x" (activations), "g" (gradients).
OPERAND_KINDS = {"w": "weights", "x": "activations", "g": "gradients"}

HEALTH_GUIDE = (
    "What is normal: every panel flat over training and alike across layers. The relative error of a 4-bit "
    "format is about 0.1 (an 8-bit one about 0.03); a few percent of saturated values is the block-scale "
    "rounding of NVFP4, not an overflow. A layer or a period that stands out from its neighbours is the one "
    "to look at. Grey: not quantized at that step."
)

ROUTING_PANELS = (
    ("max_over_mean_tokens", "busiest expert's tokens / mean (1 = balanced)"),
    ("dropped_fraction", "dropped (token, expert) pairs (fraction)"),
    ("load_balance", "load-balancing loss (1 = balanced)"),
    ("aux_loss", "auxiliary loss added to the training loss"),
    ("z_loss", "router z-loss (mean squared logsumexp)"),
    ("entropy", "router entropy (nats)"),
)

ROUTING_GUIDE = (
    "What is normal: the busiest expert's load falls towards 1 (even) early in training and stays low, no pairs "
    "dropped (always 0 when routing is dropless), the balancing loss near 1, and the router's entropy falling "
    "slowly from ln(experts) as the experts specialise. A block whose load climbs or whose entropy collapses "
    "towards 0 sends most tokens to few experts."
)

THROUGHPUT_CAVEAT = (
    "Measured on the machine that ran this comparison. Where it has no FP4 tensor cores (any CPU; Hopper "
    "GPUs) the FP4 recipes are emulated, so they run SLOWER than bf16 here: this is not FP4 hardware speed. "
    "`fp4lm project` models a Blackwell GPU's FP4 speed."
)


@dataclasses.dataclass(frozen=True)
class Plot:
    file: str  # relative to the comparison directory
    title: str
    section: str = "main"  # "main", "health" (quantization heatmaps), "routing" (MoE routers) or "appendix"
    note: str = ""  # a line the report prints under the plot


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


def _name(entry: dict[str, Any]) -> str:
    """The legend name: the display name without overrides that changed nothing."""
    return entry.get("short_display") or entry["display"]


def _seeded_name(entry: dict[str, Any]) -> str:
    """The legend name with what the curve averages: "nvfp4 (5 seeds)", or the one seed a curve shows."""
    seeds = entry.get("seeds") or []
    if len(seeds) > 1:
        return f"{_name(entry)} ({len(seeds)} seeds)"
    return f"{_name(entry)} (seed {seeds[0]})" if seeds else _name(entry)


def _mark_precision_switch(ax, entry: dict[str, Any], color, *, label: bool) -> None:
    """A dashed vertical line where the run switched its quantized layers to bf16 (precision.bf16_after)."""
    for event in entry.get("events", []):
        if event.get("event") == "precision_switch":
            ax.axvline(event["tokens"], color=color, linestyle="--", linewidth=1.0, alpha=0.8)
            if label:
                ax.annotate(
                    f"{_name(entry)}: bf16 from here",
                    xy=(event["tokens"], 1.0),
                    xycoords=("data", "axes fraction"),
                    xytext=(-3, -4),
                    textcoords="offset points",
                    rotation=90,
                    ha="right",
                    va="top",
                    fontsize=7,
                    color=color,
                )


def _final_phase(tokens: list, fraction: float = 0.5) -> float:
    return float(max(tokens)) * (1.0 - fraction) if tokens else 0.0


def plot_loss(results: dict[str, Any], path: pathlib.Path) -> None:
    entries = _entries(results)
    figure = _new_figure(15, 5.0 + 0.25 * math.ceil(len(entries) / 4))
    train_ax, val_ax, zoom_ax = figure.subplots(1, 3)
    zoom_values: list[float] = []
    all_tokens = [t for entry in entries for t in entry["curves"]["val"]["tokens"]]
    start = _final_phase(all_tokens)
    for entry in entries:
        train, val = entry["curves"]["train"], entry["curves"]["val"]
        (line,) = train_ax.plot(train["tokens"], _as_array(train["loss"]), label=_seeded_name(entry), linewidth=1.2)
        color = line.get_color()
        val_ax.plot(val["tokens"], _as_array(val["val_loss"]), marker="o", markersize=3, color=color)
        late = [(t, v) for t, v in zip(val["tokens"], val["val_loss"], strict=True) if t >= start and v is not None]
        if late:
            zoom_ax.plot(*zip(*late, strict=True), marker="o", markersize=3, color=color)
            zoom_values += [v for _, v in late]
        for ax in (train_ax, val_ax, zoom_ax):
            _mark_precision_switch(ax, entry, color, label=ax is zoom_ax)
    titles = ("training loss", "validation loss", "validation loss, second half of training (zoomed)")
    for ax, title in zip((train_ax, val_ax, zoom_ax), titles, strict=True):
        ax.set_xlabel("tokens")
        ax.set_ylabel("loss (nats/token)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    if zoom_values:
        low, high = min(zoom_values), max(zoom_values)
        margin = max(0.05 * (high - low), 1e-3)
        zoom_ax.set_ylim(low - margin, high + margin)
    handles, labels = train_ax.get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=min(4, len(labels)), fontsize=9, frameon=False)
    figure.savefig(path)


def plot_gap(results: dict[str, Any], path: pathlib.Path) -> None:
    figure = _new_figure(11, 5.0)
    ax = figure.subplots()
    band = (results.get("noise") or {}).get("band")
    if band is not None:
        ax.axhspan(-band["band_pct"], band["band_pct"], color="grey", alpha=0.15, label="noise band of one seed's gap")
    for entry in _entries(results):
        if entry["label"] in results["baseline_groups"]:
            continue
        gap = entry["curves"]["gap"]
        tokens = gap["tokens"]
        (line,) = ax.plot(tokens, _as_array(gap["gap_pct"]), marker="o", markersize=3, label=_seeded_name(entry))
        if any(v is not None for v in gap.get("low_pct", [])):
            ax.fill_between(
                tokens, _as_array(gap["low_pct"]), _as_array(gap["high_pct"]), color=line.get_color(), alpha=0.15
            )
        _mark_precision_switch(ax, entry, line.get_color(), label=True)
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xlabel("tokens")
    ax.set_ylabel("validation loss gap to bf16 (%)")
    ax.set_title("gap to bf16 (positive = worse than bf16; shaded: 95% interval over the paired seeds)", fontsize=10)
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        figure.legend(handles, labels, fontsize=8, loc="outside right upper", frameon=False)
    figure.savefig(path)


def plot_throughput(results: dict[str, Any], path: pathlib.Path) -> None:
    entries = _entries(results)
    figure = _new_figure(max(6.0, 1.1 * len(entries) + 2), 4.8)
    ax = figure.subplots()
    values = [entry["final"]["tokens_per_sec"] or 0.0 for entry in entries]
    positions = np.arange(len(entries))
    bars = ax.bar(positions, values, color="tab:blue")
    ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize=8)
    ax.set_xticks(positions, [_name(entry) for entry in entries], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("tokens/s (steady state)")
    ax.set_title("throughput on this machine (FP4 emulated: not FP4 hardware speed)", fontsize=10)
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
    return sorted(seen, key=lambda op: ("w", "x", "g").index(op[-1]) if op[-1] in "wxg" else 3)


def operand_title(operand: str) -> str:
    """ "weights", "activations" or "gradients" (with the slot name when it is longer than one letter)."""
    kind = OPERAND_KINDS.get(operand[-1], operand)
    return kind if operand in OPERAND_KINDS else f"{kind} ({operand})"


def constant_metrics(quant_stats: dict[str, Any]) -> dict[str, float]:
    """Metrics with one value in every layer, operand and step (e.g. no underflow at all): metric -> value."""
    constant = {}
    for metric, _, _ in HEATMAP_METRICS:
        values = {
            v
            for operands in quant_stats["layers"].values()
            for op in operands.values()
            for v in op[metric]
            if v is not None
        }
        if len(values) == 1:
            constant[metric] = values.pop()
    return constant


def plot_quant_health(entry: dict[str, Any], path: pathlib.Path) -> str:
    """One row of panels per operand, one column per metric that varies; returns a note on the metrics left out."""
    quant_stats = entry["quant_stats"]
    operands = operands_of(quant_stats)
    steps = quant_stats["step"]
    constant = constant_metrics(quant_stats)
    metrics = [m for m in HEATMAP_METRICS if m[0] not in constant] or [HEATMAP_METRICS[0]]
    num_layers = max(len(heatmap_matrix(quant_stats, op, "rel_err")[0]) for op in operands)
    panel_height = max(2.0, 0.2 * num_layers + 1.0)
    figure = _new_figure(6.0 * len(metrics) + 1.5, panel_height * len(operands) + 1.0)
    axes = figure.subplots(len(operands), len(metrics), squeeze=False)
    tick_every = max(1, len(steps) // 8)
    for column, (metric, title, cmap) in enumerate(metrics):
        matrices = [heatmap_matrix(quant_stats, operand, metric) for operand in operands]
        finite = np.concatenate([matrix[np.isfinite(matrix)] for _, matrix in matrices])
        upper = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
        colours = require_matplotlib().colormaps[cmap].with_extremes(bad="lightgrey")
        for row, (operand, (layers, matrix)) in enumerate(zip(operands, matrices, strict=True)):
            ax = axes[row][column]
            image = ax.imshow(
                np.ma.masked_invalid(matrix), aspect="auto", interpolation="nearest", cmap=colours, vmin=0.0, vmax=upper
            )
            ax.set_title(f"{operand_title(operand)}: {title}", fontsize=10)
            labels = [layer.removeprefix("blocks.") for layer in layers]
            ax.set_yticks(range(len(layers)), labels, fontsize=8 if len(layers) <= 40 else 5)
            ax.set_xticks(range(0, len(steps), tick_every), [str(s) for s in steps[::tick_every]], fontsize=8)
            ax.set_xlabel("training step", fontsize=8)
            figure.colorbar(image, ax=ax, fraction=0.046, pad=0.02)
    figure.suptitle(f"quantization health: {_name(entry)} (rows: block.layer[.expert]; grey = not quantized then)")
    figure.savefig(path)
    left_out = [
        f"{title} ({value:g} everywhere)"
        for metric, title, _ in HEATMAP_METRICS
        if (value := constant.get(metric)) is not None
    ]
    return f"Not drawn, constant in every layer and step: {'; '.join(left_out)}." if left_out else ""


def has_routing(entry: dict[str, Any]) -> bool:
    routing = entry.get("routing") or {}  # records from before routing was recorded have none
    return bool(routing.get("step")) and bool(routing.get("blocks"))


def plot_routing(entry: dict[str, Any], path: pathlib.Path) -> str:
    """One panel per routing metric that varies, one line per MoE block; returns a note on the panels left out."""
    routing = entry["routing"]
    steps, blocks = routing["step"], sorted(routing["blocks"], key=layer_sort_key)
    constant = {}
    for metric, _ in ROUTING_PANELS:
        values = {v for block in blocks for v in routing["blocks"][block][metric] if v is not None}
        if len(values) <= 1:
            constant[metric] = values.pop() if values else None
    panels = [panel for panel in ROUTING_PANELS if panel[0] not in constant] or [ROUTING_PANELS[0]]
    columns = min(3, len(panels))
    rows = math.ceil(len(panels) / columns)
    figure = _new_figure(5.0 * columns, 3.6 * rows + 0.8)
    axes = figure.subplots(rows, columns, squeeze=False).reshape(-1)
    for ax, (metric, title) in zip(axes, panels, strict=False):
        for block in blocks:
            ax.plot(
                steps,
                _as_array(routing["blocks"][block][metric]),
                label=block.removeprefix("blocks.").replace(".mlp", "", 1),
            )
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("training step", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=min(6, len(labels)), fontsize=8, frameon=False)
    figure.suptitle(f"expert routing: {_name(entry)} (one line per MoE block, by its index)")
    figure.savefig(path)
    left_out = [
        f"{title} ({'no value' if constant[metric] is None else f'{constant[metric]:g}'} throughout)"
        for metric, title in ROUTING_PANELS
        if metric in constant
    ]
    return f"Not drawn, constant in every block and step: {'; '.join(left_out)}." if left_out else ""


def has_telemetry(entry: dict[str, Any]) -> bool:
    stats = entry.get("quant_stats") or {}
    return bool(stats.get("step")) and any(stats.get("layers", {}).values())


def load_note(load: dict[str, Any] | None) -> str:
    """What the host's load says about the tokens/s: figures taken beside other work are slowed unevenly."""
    if not load or load["max"] is None:
        return "The host's load was not recorded for these runs."
    described = f"The host's load average while the runs trained: {load['min']:.2f} to {load['max']:.2f}"
    if load["unknown"]:
        runs = "1 run" if load["unknown"] == 1 else f"{load['unknown']} runs"
        described += f" ({runs} trained before the load was recorded)"
    if load["max"] > IDLE_LOAD:
        return described + f"; above {IDLE_LOAD}, other work ran beside some runs and slowed them unevenly."
    return described + " (an idle host)."


def write_plots(results: dict[str, Any], out_dir: pathlib.Path) -> list[Plot]:
    """Draws every plot into out_dir and returns them in report order."""
    plots = [Plot("loss.png", "Training and validation loss against tokens")]
    plot_loss(results, out_dir / "loss.png")
    if results.get("sweep"):
        plot_sweep(results["sweep"], out_dir / "sweep.png", _new_figure)
        plots.append(Plot("sweep.png", "Final validation loss against the swept value"))
    if results["baseline"] is not None and len(results["order"]) > 1 and not results.get("sweep"):  # sweep.png has it
        plot_gap(results, out_dir / "gap.png")
        plots.append(Plot("gap.png", "Relative validation-loss gap to bf16 over training"))
    for entry in _entries(results):
        if has_telemetry(entry):
            file = f"quant_{entry['label']}.png"
            note = plot_quant_health(entry, out_dir / file)
            plots.append(Plot(file, f"Quantization health: {_name(entry)}", section="health", note=note))
    for entry in _entries(results):
        if has_routing(entry):
            file = f"routing_{entry['label']}.png"
            note = plot_routing(entry, out_dir / file)
            plots.append(Plot(file, f"Expert routing: {_name(entry)}", section="routing", note=note))
    plot_throughput(results, out_dir / "throughput.png")
    note = f"{THROUGHPUT_CAVEAT} {load_note(results.get('host_load'))}"
    plots.append(Plot("throughput.png", "Training throughput per recipe", section="appendix", note=note))
    return plots
