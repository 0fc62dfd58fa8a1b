"""`fp4lm plan`: a projected step turned into what a training run costs: days, GPU-hours, dollars and energy,
per recipe, at one GPU count or several.

The power model (docs/projection.md): a compute-bound training step holds every GPU at its power limit
(`GPUSpec.board_power_w`, from the GPU's datasheet or system spec) whatever the recipe, so energy follows time;
`RECIPE_POWER` scales that per recipe, 1.0 for each until a measurement we can cite says otherwise, and
`--power RECIPE=FRACTION` sets it for a run. Facility overhead enters as the PUE (1.0: the GPUs alone).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib

from fp4lm.errors import UserError
from fp4lm.hardware import GPUSpec
from fp4lm.project import units
from fp4lm.project.fit import layout_fit
from fp4lm.project.layout import Layout, Network
from fp4lm.project.projection import project
from fp4lm.project.roofline import Workload

RECIPE_POWER: dict[str, float] = {}
"""A recipe's power draw as a fraction of the GPU's power limit; absent: 1.0 (the limit)."""

_SUFFIXES = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
MAX_TOKENS = 1e16
"""10 quadrillion tokens, over 600 times Llama 3's 15T: beyond it a plan is arithmetic."""


def parse_tokens(text: str, step_tokens: int = 1) -> float:
    """A token budget: "15T", "300B", "2.5e12" or "15000000000000"; at least one step's `step_tokens` and at
    most `MAX_TOKENS`."""
    value = text.strip().lower().replace(",", "").replace("_", "")
    scale = _SUFFIXES.get(value[-1:], 1.0) if value else 1.0
    try:
        tokens = float(value[:-1] if value[-1:] in _SUFFIXES else value) * scale
    except ValueError:
        raise UserError(f"--tokens {text!r} is not a token count; write e.g. --tokens 15T or --tokens 3e11") from None
    if not math.isfinite(tokens) or not tokens > 0:
        raise UserError(f"--tokens must be a positive number of tokens, got {text!r}")
    if tokens > MAX_TOKENS:
        raise UserError(f"--tokens {text} is more than {units.count(MAX_TOKENS)} tokens; give e.g. --tokens 15T")
    if tokens < step_tokens:
        raise UserError(
            f"--tokens {text} is less than one step, --gbs x --seq = {step_tokens:,} tokens; give more tokens"
        )
    return tokens


def parse_power(text: str | None, recipes: tuple[str, ...] | None = None) -> dict[str, float]:
    """`--power nvfp4=0.85,fp8=0.9`: each recipe's draw as a fraction of the power limit; each named once and,
    given `recipes`, among them (a fraction for a recipe not planned would change nothing, silently)."""
    power = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        name, _, fraction = part.partition("=")
        name = name.strip().lower()
        try:
            value = float(fraction)
        except ValueError:
            value = -1.0
        if not name or not 0 < value <= 1.5:
            raise UserError(f"--power {part!r}: write RECIPE=FRACTION with a fraction in (0, 1.5], e.g. nvfp4=0.85")
        if name in power:
            raise UserError(f"--power names {name} twice; give each recipe's fraction once")
        if recipes is not None and name not in recipes:
            raise UserError(
                f"--power names {name}, which is not planned ({', '.join(recipes)}); plan it with --recipes"
            )
        power[name] = value
    return power


@dataclasses.dataclass(frozen=True)
class PlanRow:
    """One recipe at one GPU count: the step, and the whole run's time, GPU-hours, cost and energy; or, where
    the layout cannot fit on the GPU (`fits` false), only its memory: a run that cannot run is not priced."""

    recipe: str
    gpus: int
    memory_per_gpu_bytes: float  # the trainer's estimate under the layout (fp4lm.project.fit)
    fits: bool
    does_not_fit: str  # "does not fit (6.80 TiB per GPU, the GPU has 80.0 GiB)", or ""
    step_time_s: float | None = None
    tokens_per_sec: float | None = None  # the whole job
    days: float | None = None
    gpu_hours: float | None = None
    dollars: float | None = None
    mwh: float | None = None
    watts_per_gpu: float | None = None


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
    config=None,
) -> list[PlanRow]:
    """Each recipe's run of `tokens` tokens under `layout`; with `config`, a layout that cannot fit on the GPU
    by the trainer's memory estimate is marked, not priced (without one, every layout is taken to fit)."""
    if dollars_per_gpu_hour < 0 or not pue >= 1.0:
        raise UserError("--price must be at least 0 ($ per GPU-hour) and --pue at least 1.0")
    if not gpu.board_power_w:
        raise UserError(f"no power limit is known for {gpu.name}; it cannot be planned")
    power = {**RECIPE_POWER, **(power or {})}
    rows = []
    for r in project(work, gpu, recipes, layout=layout, network=network).rows:
        fit = layout_fit(config, layout, r.recipe, gpu) if config is not None else None
        memory = {"memory_per_gpu_bytes": fit.bytes_per_gpu if fit else 0.0, "fits": fit is None or fit.fits}
        if fit is not None and not fit.fits:
            rows.append(PlanRow(recipe=r.recipe, gpus=layout.gpus, does_not_fit=fit.describe(), **memory))
            continue
        job_tokens_per_sec = r.tokens_per_sec * layout.gpus
        seconds = tokens / job_tokens_per_sec
        gpu_hours = layout.gpus * seconds / 3600
        watts = gpu.board_power_w * power.get(r.recipe, 1.0)
        rows.append(
            PlanRow(
                recipe=r.recipe,
                gpus=layout.gpus,
                does_not_fit="",
                **memory,
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
    """Every recipe at every planned GPU count, for `tokens` tokens; `notes` name the config's settings the
    projection does not model."""

    label: str
    tokens: float
    rows: tuple[PlanRow, ...]
    notes: tuple[str, ...] = ()

    def as_json(self) -> dict:
        plan = {"label": self.label, "tokens": self.tokens, "plan": [dataclasses.asdict(r) for r in self.rows]}
        return {**plan, "notes": list(self.notes)} if self.notes else plan

    def table(self) -> str:
        return "\n".join([plan_table(list(self.rows), self.tokens, self.label), *(f"  note: {n}" for n in self.notes)])


def check_some_row_fits(plan: Plan) -> None:
    """Refuses a plan none of whose rows fits on its GPUs (a sweep where some fit keeps the others, marked)."""
    if plan.rows and not any(r.fits for r in plan.rows):
        smallest = min(plan.rows, key=lambda r: r.memory_per_gpu_bytes)
        raise UserError(
            f"no planned layout fits ({plan.label}): at best it {smallest.does_not_fit}; split the model over more "
            "GPUs with --tp, --pp or --fsdp, or plan more --gpus"
        )


def plan_table(rows: list[PlanRow], tokens: float, label: str) -> str:
    lines = [
        f"plan: {label}, {units.count(tokens)} tokens; energy at each GPU's power limit",
        f"{'GPUs':>7} {'recipe':<7} {'step':>9} {'tokens/s':>9} {'time':>11} {'GPU-hours':>10} {'cost':>9} "
        f"{'energy':>11} {'vs bf16':>8}",
    ]
    bf16 = {r.gpus: r for r in rows if r.recipe == "bf16" and r.fits}
    for r in rows:
        if not r.fits:
            lines.append(f"{r.gpus:>7,} {r.recipe:<7} {r.does_not_fit}")
            continue
        assert r.step_time_s is not None and r.tokens_per_sec is not None and r.days is not None
        assert r.gpu_hours is not None and r.dollars is not None and r.mwh is not None
        base = bf16.get(r.gpus)
        versus = f"{base.days / r.days:>7.2f}x" if base and base.days else f"{'':>8}"
        lines.append(
            f"{r.gpus:>7,} {r.recipe:<7} {units.seconds(r.step_time_s):>9} {units.count(r.tokens_per_sec):>9} "
            f"{units.duration(r.days * 86400):>11} {units.count(r.gpu_hours):>10} {units.dollars(r.dollars):>9} "
            f"{units.energy(r.mwh * 1e6):>11} {versus}"
        )
    return "\n".join(lines)


PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def plot_path(text: str | None) -> pathlib.Path | None:
    """--plot's file: one of `PLOT_SUFFIXES`, checked before anything is planned."""
    if text is None:
        return None
    path = pathlib.Path(text)
    if path.suffix.lower() not in PLOT_SUFFIXES or not path.stem:
        raise UserError(f"--plot {text!r} is not a {', '.join(PLOT_SUFFIXES)} file; write e.g. --plot plan.png")
    if path.is_dir():
        raise UserError(f"--plot {text!r} is a directory; give a file name, e.g. --plot plan.png")
    return path


def plot_plan(plan: Plan, path: pathlib.Path) -> None:
    """Days, cost and energy against the GPU count, one line per recipe (the rows that fit); a file that cannot
    be written is a UserError."""
    rows = [r for r in plan.rows if r.fits]
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
    try:
        fig.savefig(path, dpi=110)
    except OSError as error:
        raise UserError(
            f"--plot {str(path)!r} cannot be written ({error.strerror or error}); give a writable path"
        ) from None
    finally:
        plt.close(fig)
