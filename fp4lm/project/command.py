"""`fp4lm project`: the projected step time of a model on a GPU, per recipe, as a table or JSON; with --gpus,
of a whole job under a parallel layout."""

from __future__ import annotations

import argparse
import json

from fp4lm.errors import UserError
from fp4lm.hardware import get_gpu
from fp4lm.project.layout import Layout, Network
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
