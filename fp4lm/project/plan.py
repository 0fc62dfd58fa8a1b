"""`fp4lm plan`: a projected step turned into what a training run costs: days, GPU-hours, dollars and energy,
per recipe, at one GPU count or several.

The power model (docs/projection.md): a compute-bound training step holds every GPU at its power limit
(`GPUSpec.board_power_w`, from the GPU's datasheet or system spec) whatever the recipe, so energy follows time;
`RECIPE_POWER` scales that per recipe, 1.0 for each until a measurement we can cite says otherwise, and
`--power RECIPE=FRACTION` sets it for a run. Facility overhead enters as the PUE (1.0: the GPUs alone).
"""

from __future__ import annotations

import dataclasses
import pathlib

from fp4lm.errors import UserError
from fp4lm.hardware import GPUSpec
from fp4lm.project.layout import Layout, Network
from fp4lm.project.projection import project
from fp4lm.project.roofline import Workload

RECIPE_POWER: dict[str, float] = {}
"""A recipe's power draw as a fraction of the GPU's power limit; absent: 1.0 (the limit)."""

_SUFFIXES = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_tokens(text: str) -> float:
    """A token budget: "15T", "300B", "2.5e12" or "15000000000000"."""
    value = text.strip().lower().replace(",", "").replace("_", "")
    scale = _SUFFIXES.get(value[-1:], 1.0) if value else 1.0
    try:
        tokens = float(value[:-1] if value[-1:] in _SUFFIXES else value) * scale
    except ValueError:
        raise UserError(f"--tokens {text!r} is not a token count; write e.g. --tokens 15T or --tokens 3e11") from None
    if not tokens > 0 or tokens == float("inf"):
        raise UserError(f"--tokens must be a positive number of tokens, got {text!r}")
    return tokens


def parse_power(text: str | None) -> dict[str, float]:
    """`--power nvfp4=0.85,fp8=0.9`: each recipe's draw as a fraction of the power limit."""
    power = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        name, _, fraction = part.partition("=")
        try:
            value = float(fraction)
        except ValueError:
            value = -1.0
        if not name.strip() or not 0 < value <= 1.5:
            raise UserError(f"--power {part!r}: write RECIPE=FRACTION with a fraction in (0, 1.5], e.g. nvfp4=0.85")
        power[name.strip().lower()] = value
    return power


@dataclasses.dataclass(frozen=True)
class PlanRow:
    """One recipe at one GPU count: the step, and the whole run's time, GPU-hours, cost and energy."""

    recipe: str
    gpus: int
    step_time_s: float
    tokens_per_sec: float  # the whole job
    days: float
    gpu_hours: float
    dollars: float
    mwh: float
    watts_per_gpu: float


def plan_rows(
    work: Workload,
    gpu: GPUSpec,
    layout: Layout,
    network: Network,
    recipes: tuple[str, ...],
    *,
    tokens: float,
    dollars_per_gpu_hour: float,
    pue: float = 1.0,
    power: dict[str, float] | None = None,
) -> list[PlanRow]:
    """Each recipe's run of `tokens` tokens under `layout`."""
    if dollars_per_gpu_hour < 0 or not pue >= 1.0:
        raise UserError("--price must be at least 0 ($ per GPU-hour) and --pue at least 1.0")
    if not gpu.board_power_w:
        raise UserError(f"no power limit is known for {gpu.name}; it cannot be planned")
    power = {**RECIPE_POWER, **(power or {})}
    rows = []
    for r in project(work, gpu, recipes, layout=layout, network=network).rows:
        job_tokens_per_sec = r.tokens_per_sec * layout.gpus
        seconds = tokens / job_tokens_per_sec
        gpu_hours = layout.gpus * seconds / 3600
        watts = gpu.board_power_w * power.get(r.recipe, 1.0)
        rows.append(
            PlanRow(
                recipe=r.recipe,
                gpus=layout.gpus,
                step_time_s=r.step_time_s,
                tokens_per_sec=job_tokens_per_sec,
                days=seconds / 86400,
                gpu_hours=gpu_hours,
                dollars=gpu_hours * dollars_per_gpu_hour,
                mwh=gpu_hours * watts * pue / 1e6,
                watts_per_gpu=watts,
            )
        )
    return rows


def scaled_layout(layout: Layout, gpus: int) -> Layout:
    """The same layout on `gpus` GPUs: the model-parallel shape and the global batch kept, data parallelism
    grown or shrunk (so fewer microbatches per pipeline, and a larger bubble, as GPUs are added)."""
    return dataclasses.replace(layout, gpus=gpus)


@dataclasses.dataclass(frozen=True)
class Plan:
    """Every recipe at every planned GPU count, for `tokens` tokens."""

    label: str
    tokens: float
    rows: tuple[PlanRow, ...]

    def as_json(self) -> dict:
        return {"label": self.label, "tokens": self.tokens, "plan": [dataclasses.asdict(r) for r in self.rows]}

    def table(self) -> str:
        return plan_table(list(self.rows), self.tokens, self.label)


def plan_table(rows: list[PlanRow], tokens: float, label: str) -> str:
    lines = [
        f"plan: {label}, {tokens / 1e12:,.2f}T tokens; energy at each GPU's power limit",
        f"{'GPUs':>7} {'recipe':<7} {'step':>9} {'Mtok/s':>8} {'days':>8} {'GPU-hours':>12} {'cost $M':>9} "
        f"{'MWh':>9} {'vs bf16':>8}",
    ]
    bf16 = {r.gpus: r for r in rows if r.recipe == "bf16"}
    for r in rows:
        base = bf16.get(r.gpus)
        versus = f"{base.days / r.days:>7.2f}x" if base else f"{'':>8}"
        lines.append(
            f"{r.gpus:>7,} {r.recipe:<7} {r.step_time_s:>8.2f}s {r.tokens_per_sec / 1e6:>8.2f} {r.days:>8.1f} "
            f"{r.gpu_hours:>12,.0f} {r.dollars / 1e6:>9.2f} {r.mwh:>9,.0f} {versus}"
        )
    return "\n".join(lines)


def plot_plan(plan: Plan, path: pathlib.Path) -> None:
    """Days, cost and energy against the GPU count, one line per recipe."""
    rows = plan.rows
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    quantities = (("days", "days to train", 1.0), ("dollars", "cost ($M)", 1e6), ("mwh", "energy (MWh)", 1.0))
    for ax, (field, title, scale) in zip(axes, quantities, strict=True):
        for recipe in dict.fromkeys(r.recipe for r in rows):
            points = sorted((r.gpus, getattr(r, field) / scale) for r in rows if r.recipe == recipe)
            ax.plot(*zip(*points, strict=True), marker="o", label=recipe)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(plan.label)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
