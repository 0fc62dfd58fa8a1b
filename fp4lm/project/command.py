"""`fp4lm project`: the projected step time of a model on a GPU, per recipe, as a table or JSON; with --gpus,
of a whole job under a parallel layout. `fp4lm plan`: that job's days, GPU-hours, $ and MWh."""

from __future__ import annotations

import argparse
import json

from fp4lm.errors import UserError
from fp4lm.hardware import get_gpu
from fp4lm.project.checks import checked_values, count, flag_name
from fp4lm.project.fit import layout_fit
from fp4lm.project.layout import Layout, Network
from fp4lm.project.plan import (
    Plan,
    check_some_row_fits,
    parse_power,
    parse_tokens,
    plan_rows,
    plot_path,
    plot_plan,
    scaled_layout,
)
from fp4lm.project.projection import parse_recipes, project
from fp4lm.project.roofline import DEFAULT_RECIPES, Workload
from fp4lm.project.workload import resolve_model, unmodelled_settings, workload_from_config

LAYOUT_FLAGS = ("tp", "pp", "vp", "cp", "ep", "fsdp", "gbs", "mbs", "nvlink_domain", "scaleout_gbps")


def add_layout_arguments(parser: argparse.ArgumentParser) -> None:
    """The parallel-layout flags, named as NVIDIA's performance tables name their columns."""
    group = parser.add_argument_group("parallel layout (with --gpus: the whole job, communication included)")
    group.add_argument("--gpus", type=int, default=None, help="GPUs in the job; without it, one GPU's step")
    for flag, meaning in (
        ("tp", "tensor parallel (with sequence parallelism)"),
        ("pp", "pipeline parallel stages"),
        ("vp", "virtual stages per pipeline GPU (interleaved 1F1B)"),
        ("cp", "context parallel (ring attention)"),
        ("ep", "expert parallel (mixtures of experts)"),
        ("mbs", "sequences per microbatch"),
    ):
        group.add_argument(f"--{flag}", type=int, default=None, help=f"{meaning}; default 1")
    group.add_argument("--gbs", type=int, default=None, help="sequences per step; default: one microbatch per DP rank")
    group.add_argument("--fsdp", action="store_true", default=None, help="shard parameters over the DP GPUs")
    group.add_argument("--nvlink-domain", type=int, default=None, help="GPUs per NVLink domain (default: the GPU's)")
    group.add_argument("--scaleout-gbps", type=float, default=None, help="scale-out GB/s per GPU (default: the GPU's)")


def build_layout(values: dict, work: Workload, gpu_name: str) -> tuple[Layout | None, Network | None]:
    """The layout and network the flags in `values` (read by `checked_values`) describe; (None, None) without
    --gpus."""
    values = checked_values(values)
    given = [flag for flag in LAYOUT_FLAGS if values.get(flag) is not None]
    if values.get("gpus") is None:
        if given:
            raise UserError(f"{flag_name(given[0])} needs --gpus: give the job's GPU count")
        return None, None
    if values.get("batch") is not None:
        raise UserError("--batch is one GPU's batch; with --gpus give the job's --gbs (and --mbs) instead")
    tp, pp, cp, mbs = (values.get(flag) or 1 for flag in ("tp", "pp", "cp", "mbs"))
    gpus = values["gpus"]
    if values.get("gbs") is None and pp > 1:
        raise UserError("--pp needs --gbs: the pipeline's bubble depends on the microbatches per step")
    dp = max(1, gpus // (tp * pp * cp))
    layout = Layout(
        gpus=gpus,
        gbs=values.get("gbs") or dp * mbs,
        seq=work.seq_len,
        mbs=mbs,
        tp=tp,
        pp=pp,
        vp=values.get("vp") or 1,
        cp=cp,
        ep=values.get("ep") or 1,
        fsdp=bool(values.get("fsdp")),
    )
    network = Network.of(get_gpu(gpu_name), values.get("nvlink_domain"), values.get("scaleout_gbps"))
    return layout, network


def main_project(
    model: str,
    gpu: str,
    seq: int | None = None,
    batch: int | None = None,
    recipes=DEFAULT_RECIPES,
    as_json: bool = False,
    overrides=(),
    layout: dict | None = None,
) -> str:
    """What `fp4lm project` prints: the table, or with as_json the per-recipe JSON.

    `overrides` are config `section.key=value` strings, e.g. ["precision.bf16_last_layers=4"] to project
    the paper's recipe with its last blocks kept in bf16 (the presets keep none, like MaxText's runs).
    `layout` holds the layout flags by name (gpus, tp, pp, vp, cp, ep, fsdp, gbs, mbs, nvlink_domain,
    scaleout_gbps); without gpus the projection is one GPU's step. With a layout, a recipe whose step cannot
    fit on the GPU by the trainer's memory estimate (fp4lm.project.fit) is named in a note, with its bytes.
    """
    values = checked_values({"seq": seq, "batch": batch, "recipes": recipes, **(layout or {})})
    gpu_spec = get_gpu(gpu)
    recipe_names = parse_recipes(values["recipes"] or DEFAULT_RECIPES)
    config, label = resolve_model(model, overrides)
    work = workload_from_config(config, seq=values["seq"], batch=values["batch"])
    job, network = build_layout(values, work, gpu)
    result = project(work, gpu_spec, recipe_names, label=label, layout=job, network=network)
    fits = {r: layout_fit(config, job, r, gpu_spec) for r in recipe_names} if job is not None else {}
    notes = [f"{r}: {fit.describe()}" for r, fit in fits.items() if not fit.fits] + unmodelled_settings(config)
    if as_json:
        data = result.as_json()
        for recipe, fit in fits.items():
            data[recipe] |= {"memory_per_gpu_bytes": fit.bytes_per_gpu, "fits": fit.fits}
        return dump_json({**data, **({"notes": notes} if notes else {})})
    return "\n".join([result.table(), *(f"  note: {note}" for note in notes)])


def run_project(args=None, **kwargs) -> str:
    """Entry for the CLI: an argparse namespace (model, gpu, seq, batch, recipes, json, the layout flags) or
    keyword arguments."""
    values = {**(vars(args) if args is not None else {}), **kwargs}
    return main_project(
        model=values["model"],
        gpu=values["gpu"],
        seq=values.get("seq"),
        batch=values.get("batch"),
        recipes=values.get("recipes"),
        as_json=bool(values.get("json", values.get("as_json", False))),
        overrides=values.get("overrides") or (),
        layout={flag: values.get(flag) for flag in ("gpus", *LAYOUT_FLAGS)},
    )


def dump_json(data: dict) -> str:
    """JSON as the standard defines it: a NaN or an infinity (which every flag's check keeps out) is a bug,
    raised here rather than printed as the non-JSON `NaN`."""
    return json.dumps(data, indent=2, allow_nan=False)


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """What a plan needs beyond the layout: the token budget, the price, and the GPU counts to draw."""
    parser.add_argument("--tokens", required=True, help="the training run's tokens, e.g. 15T, 300B or 2.5e12")
    parser.add_argument("--price", type=float, default=0.0, help="$ per GPU-hour (default 0: cost not priced)")
    parser.add_argument("--pue", type=float, default=1.0, help="facility power overhead (default 1.0: GPUs only)")
    parser.add_argument("--power", default=None, help="a recipe's draw as a fraction of the power limit, nvfp4=0.85")
    parser.add_argument("--sweep", default=None, help="more GPU counts to plan at, e.g. 1024,2048,8192")
    parser.add_argument("--plot", default=None, help="write days, cost and energy against GPU count to this PNG")


def main_plan(values: dict) -> str:
    """What `fp4lm plan` prints: per recipe and GPU count, days, GPU-hours, $ and MWh (or JSON with `json`)."""
    values = checked_values(values)
    config, label = resolve_model(values["model"], values.get("overrides") or ())
    plan = plan_config(config, label, values)
    return dump_json(plan.as_json()) if values.get("json") else plan.table()


PLAN_KEYS = ("gpu", "gpus", "tokens", "price", "pue", "power", "recipes", "sweep", "plot", *LAYOUT_FLAGS)
_LIST_KEYS = ("recipes", "sweep", "power")  # their values hold commas: recipes=fp8,nvfp4


def plan_for_dry_run(config, spec: str, num_devices: int | None = None) -> Plan:
    """`fp4lm train CONFIG --dry-run --plan gpu=gb200,gpus=4096,tokens=15T[,price=3,tp=4,...]`: the plan of the
    compiled config, which is the config on its mesh resolved over the dry run's `num_devices` (default: the
    devices JAX sees). The layout keys default to that mesh (tensor -> tp, expert -> ep, fsdp > 1 -> fsdp; a
    -1 resolved, not read as "shard") and the batch to the config's: each data-parallel GPU runs
    train.batch_size / (data x fsdp x expert) sequences a step in train.grad_accum_steps microbatches."""
    values = parse_plan_spec(spec)
    for key in ("gpu", "gpus", "tokens"):
        if key not in values:
            raise UserError(f"--plan needs {key}=...: e.g. --plan gpu=gb200,gpus=4096,tokens=15T")
    values = checked_values(values)
    from fp4lm.sharding import all_devices, mesh_shape  # here: it imports jax, which `fp4lm plan` does not need

    if num_devices is None:
        num_devices = len(all_devices())
    data, fsdp, expert, tensor = mesh_shape(config.mesh, num_devices)
    accum = config.train.grad_accum_steps
    values.setdefault("tp", tensor)
    values.setdefault("ep", expert)
    values.setdefault("fsdp", fsdp > 1)
    values.setdefault("mbs", max(1, config.train.batch_size // accum // (data * fsdp * expert)))
    if "gbs" not in values:
        dp = values["gpus"] // (values["tp"] * values.get("pp", 1) * values.get("cp", 1))
        values["gbs"] = max(1, dp) * values["mbs"] * accum
    return plan_config(config, "the compiled config", values)


def parse_plan_spec(spec: str) -> dict[str, str]:
    """`key=value,key=value` -> {key: value}; a list value goes on over commas (recipes=fp8,nvfp4,
    power=fp8=0.9,nvfp4=0.8)."""
    values: dict[str, str] = {}
    key = None
    for part in spec.split(","):
        name = part.partition("=")[0].strip().replace("-", "_")
        goes_on = "=" not in part or (key == "power" and name not in PLAN_KEYS)  # power=fp8=0.9,nvfp4=0.8
        if key in _LIST_KEYS and part.strip() and goes_on:
            values[key] += "," + part.strip()
            continue
        key, _, value = part.strip().partition("=")
        key = key.strip().replace("-", "_")
        if key not in PLAN_KEYS or not value.strip():
            raise UserError(f"--plan {part!r}: write key=value with a key of {', '.join(PLAN_KEYS)}")
        if key in values:
            raise UserError(f"--plan gives {key} twice ({values[key]!r} and {value!r}); give it once")
        values[key] = value.strip()
    return values


def plan_config(config, label: str, values: dict) -> Plan:
    """The plan of `config` under the plan and layout flags in `values`; a plot (--plot) is written last, once
    everything else has been checked, so a refused plan writes nothing."""
    values = checked_values(values)
    gpu = get_gpu(values["gpu"])
    recipes = parse_recipes(values.get("recipes") or DEFAULT_RECIPES)
    plot = plot_path(values.get("plot"))
    work = workload_from_config(config, seq=values.get("seq"))
    if values.get("gpus") is None:
        raise UserError("fp4lm plan needs --gpus: the job's GPU count (and its layout: --tp, --pp, --gbs, ...)")
    layout, network = build_layout(values, work, values["gpu"])
    assert layout is not None and network is not None
    tokens = parse_tokens(str(values["tokens"]), step_tokens=layout.gbs * layout.seq)
    power = parse_power(values.get("power"), recipes)
    counts = [layout.gpus, *_gpu_counts(values.get("sweep"))]
    rows = []
    for gpus in sorted(dict.fromkeys(counts)):
        try:
            rows += plan_rows(
                work, gpu, scaled_layout(layout, gpus), network, recipes, tokens=tokens,
                dollars_per_gpu_hour=values.get("price") or 0.0,
                pue=values["pue"] if values.get("pue") is not None else 1.0, power=power, config=config,
            )  # fmt: skip
        except UserError as error:
            raise UserError(f"at {gpus:,} GPUs: {error}") from None
    plan = Plan(
        f"{label} on {gpu.name.upper()}, {layout.describe()}", tokens, tuple(rows), tuple(unmodelled_settings(config))
    )
    check_some_row_fits(plan)
    if plot is not None:
        plot_plan(plan, plot)
    return plan


def _gpu_counts(text: str | None) -> list[int]:
    parts = [p.strip() for p in (text or "").split(",")]
    if text is not None and not all(p.isdigit() and int(p) > 0 for p in parts):
        raise UserError(f"--sweep {text!r} is not a list of GPU counts; write e.g. --sweep 1024,2048,8192")
    return [count("sweep", p) for p in parts] if text is not None else []
