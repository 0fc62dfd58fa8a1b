"""`fp4lm project`: the projected step time of a model on a GPU, per recipe, as a table or JSON; with --gpus,
of a whole job under a parallel layout. `fp4lm plan`: that job's days, GPU-hours, $ and MWh."""

from __future__ import annotations

import argparse
import json
import pathlib

from fp4lm.errors import UserError
from fp4lm.hardware import get_gpu
from fp4lm.project.layout import Layout, Network
from fp4lm.project.plan import Plan, parse_power, parse_tokens, plan_rows, plot_plan, scaled_layout
from fp4lm.project.projection import parse_recipes, project
from fp4lm.project.roofline import DEFAULT_RECIPES, Workload
from fp4lm.project.workload import resolve_model, workload_from_config

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
    """The layout and network the flags in `values` describe; (None, None) without --gpus."""
    given = [flag for flag in LAYOUT_FLAGS if values.get(flag) is not None]
    if values.get("gpus") is None:
        if given:
            raise UserError(f"--{given[0].replace('_', '-')} needs --gpus: give the job's GPU count")
        return None, None
    if values.get("batch") is not None:
        raise UserError("--batch is one GPU's batch; with --gpus give the job's --gbs (and --mbs) instead")
    tp, pp, cp, mbs = (values.get(flag) or 1 for flag in ("tp", "pp", "cp", "mbs"))
    gpus = values["gpus"]
    if gpus < 1:
        raise UserError(f"--gpus must be a positive integer, got {gpus}")
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
    scaleout_gbps); without gpus the projection is one GPU's step.
    """
    gpu_spec = get_gpu(gpu)
    recipe_names = parse_recipes(recipes or DEFAULT_RECIPES)
    config, label = resolve_model(model, overrides)
    work = workload_from_config(config, seq=seq, batch=batch)
    job, network = build_layout({**(layout or {}), "batch": batch}, work, gpu)
    result = project(work, gpu_spec, recipe_names, label=label, layout=job, network=network)
    return json.dumps(result.as_json(), indent=2) if as_json else result.table()


def run_project(args=None, **kwargs) -> str:
    """Entry for the CLI: an argparse namespace (model, gpu, seq, batch, recipes, json, the layout flags) or
    keyword arguments."""
    values = {**(vars(args) if args is not None else {}), **kwargs}
    return main_project(
        model=values["model"],
        gpu=values["gpu"],
        seq=values.get("seq"),
        batch=values.get("batch"),
        recipes=values.get("recipes") or DEFAULT_RECIPES,
        as_json=bool(values.get("json", values.get("as_json", False))),
        overrides=values.get("overrides") or (),
        layout={flag: values.get(flag) for flag in ("gpus", *LAYOUT_FLAGS)},
    )


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
    config, label = resolve_model(values["model"], values.get("overrides") or ())
    plan = plan_config(config, label, values)
    return json.dumps(plan.as_json(), indent=2) if values.get("json") else plan.table()


PLAN_KEYS = ("gpu", "gpus", "tokens", "price", "pue", "power", "recipes", "sweep", "plot", *LAYOUT_FLAGS)


def plan_for_dry_run(config, spec: str) -> Plan:
    """`fp4lm train CONFIG --dry-run --plan gpu=gb200,gpus=4096,tokens=15T[,price=3,tp=4,...]`: the plan of the
    compiled config. The layout keys default to the config's mesh (tensor -> tp, expert -> ep, fsdp > 1 ->
    fsdp) and the global batch to project.batch_per_device sequences per data-parallel rank."""
    values: dict = {}
    key = None
    for part in spec.split(","):
        if "=" not in part and key in ("recipes", "sweep", "power"):  # a list value goes on: recipes=fp8,nvfp4
            values[key] += "," + part.strip()
            continue
        key, _, value = part.strip().partition("=")
        key = key.strip().replace("-", "_")
        if key not in PLAN_KEYS or not value:
            raise UserError(f"--plan {part!r}: write key=value with a key of {', '.join(PLAN_KEYS)}")
        values[key] = value
    for key in ("gpus", "tp", "pp", "vp", "cp", "ep", "gbs", "mbs", "nvlink_domain"):
        if key in values:
            values[key] = _positive_int(key, values[key])
    for key in ("price", "pue", "scaleout_gbps"):
        if key in values:
            values[key] = _number(key, values[key])
    for key in ("gpu", "gpus", "tokens"):
        if key not in values:
            raise UserError(f"--plan needs {key}=...: e.g. --plan gpu=gb200,gpus=4096,tokens=15T")
    mesh = config.mesh
    values.setdefault("tp", mesh.tensor)
    values.setdefault("ep", mesh.expert)
    values["fsdp"] = values.get("fsdp", "false" if mesh.fsdp == 1 else "true") in ("true", "1", "yes")
    if "gbs" not in values:
        dp = values["gpus"] // (values["tp"] * values.get("pp", 1) * values.get("cp", 1))
        values["gbs"] = max(1, dp) * config.project.batch_per_device
        values.setdefault("mbs", config.project.batch_per_device)
    return plan_config(config, "the compiled config", values)


def _positive_int(key: str, text) -> int:
    if not str(text).isdigit() or int(text) < 1:
        raise UserError(f"--plan {key}={text}: {key} must be a positive integer")
    return int(text)


def _number(key: str, text) -> float:
    try:
        return float(text)
    except ValueError:
        raise UserError(f"--plan {key}={text}: {key} must be a number") from None


def plan_config(config, label: str, values: dict) -> Plan:
    """The plan of `config` under the plan and layout flags in `values`."""
    gpu = get_gpu(values["gpu"])
    recipes = parse_recipes(values.get("recipes") or DEFAULT_RECIPES)
    work = workload_from_config(config, seq=values.get("seq"))
    if values.get("gpus") is None:
        raise UserError("fp4lm plan needs --gpus: the job's GPU count (and its layout: --tp, --pp, --gbs, ...)")
    layout, network = build_layout(values, work, values["gpu"])
    assert layout is not None and network is not None
    tokens = parse_tokens(values["tokens"])
    counts = [layout.gpus, *_gpu_counts(values.get("sweep"))]
    rows = []
    for gpus in sorted(dict.fromkeys(counts)):
        try:
            rows += plan_rows(
                work, gpu, scaled_layout(layout, gpus), network, recipes, tokens=tokens,
                dollars_per_gpu_hour=values.get("price") or 0.0, pue=values.get("pue") or 1.0,
                power=parse_power(values.get("power")),
            )  # fmt: skip
        except UserError as error:
            raise UserError(f"at {gpus:,} GPUs: {error}") from None
    plan = Plan(f"{label} on {gpu.name.upper()}, {layout.describe()}", tokens, tuple(rows))
    if values.get("plot"):
        plot_plan(plan, pathlib.Path(values["plot"]))
    return plan


def _gpu_counts(text: str | None) -> list[int]:
    parts = [p.strip() for p in (text or "").split(",") if p.strip()]
    if not all(p.isdigit() and int(p) > 0 for p in parts):
        raise UserError(f"--sweep {text!r} is not a list of GPU counts; write e.g. --sweep 1024,2048,8192")
    return [int(p) for p in parts]
