"""`fp4lm project`: the projected step time of a model on a GPU, per recipe, as a table or JSON."""

from __future__ import annotations

import json

from fp4lm.hardware import get_gpu
from fp4lm.project.roofline import DEFAULT_RECIPES, parse_recipes, project
from fp4lm.project.workload import resolve_model, workload_from_config


def main_project(
    model: str,
    gpu: str,
    seq: int | None = None,
    batch: int | None = None,
    recipes=DEFAULT_RECIPES,
    as_json: bool = False,
    overrides=(),
) -> str:
    """What `fp4lm project` prints: the table, or with as_json the per-recipe JSON.

    `overrides` are config `section.key=value` strings, e.g. ["precision.bf16_last_layers=4"] to project
    the paper's recipe with its last blocks kept in bf16 (the presets keep none, like MaxText's runs).
    """
    gpu_spec = get_gpu(gpu)
    recipe_names = parse_recipes(recipes or DEFAULT_RECIPES)
    config, label = resolve_model(model, overrides)
    result = project(workload_from_config(config, seq=seq, batch=batch), gpu_spec, recipe_names, label=label)
    return json.dumps(result.as_json(), indent=2) if as_json else result.table()


def run_project(args=None, **kwargs) -> str:
    """Entry for the CLI: an argparse namespace (model, gpu, seq, batch, recipes, json) or keyword arguments."""
    values = {**(vars(args) if args is not None else {}), **kwargs}
    return main_project(
        model=values["model"],
        gpu=values["gpu"],
        seq=values.get("seq"),
        batch=values.get("batch"),
        recipes=values.get("recipes") or DEFAULT_RECIPES,
        as_json=bool(values.get("json", values.get("as_json", False))),
        overrides=values.get("overrides") or (),
    )
