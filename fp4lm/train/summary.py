"""A run's end: what summary.json says beyond the loop's figures (the recipes, from metrics.jsonl's switch
events; the sample), the figures of a run resumed after its last step, and the summary's console lines."""

from __future__ import annotations

import pathlib

from flax import nnx

import fp4lm.data
from fp4lm.config import Config
from fp4lm.data.mixture import Mixture
from fp4lm.jsonio import read_jsonl
from fp4lm.model.generate import generate
from fp4lm.train.hosts import replicated
from fp4lm.train.metrics import METRICS_FILE

RECIPE_SETTING = "precision.recipe"  # the "setting" of a precision_switch event that changed the run's recipe


def is_precision_switch(record: dict) -> bool:
    """A precision_switch event: the late switch to bf16, or a recipe switched on resume (`is_recipe_switch`)."""
    return record.get("event") == "precision_switch"


def is_recipe_switch(record: dict) -> bool:
    return is_precision_switch(record) and record.get("setting") == RECIPE_SETTING


def has_records_after(run_dir: pathlib.Path, step: int) -> bool:
    return any(isinstance(r.get("step"), int) and r["step"] > step for r in read_jsonl(run_dir / METRICS_FILE))


def last_records(run_dir: pathlib.Path, step: int) -> dict:
    """From metrics.jsonl: loss and skipped_steps of the newest training record, and val_loss of an
    evaluation at `step` (for a run resumed after its last step, whose records are all on disk)."""
    found: dict = {}
    for record in read_jsonl(run_dir / METRICS_FILE):
        if "loss" in record:
            found.update(loss=record["loss"], skipped_steps=record.get("skipped_steps", 0))
        if "val_loss" in record and record.get("step") == step:
            found["val_loss"] = record["val_loss"]
    return found


def recipe_summary(run_dir: pathlib.Path, recipe: str) -> dict:
    """summary.json's "recipe" (the one recipe; for a run whose recipe was switched on resume, each recipe
    with its steps) and "recipe_history" ([{"recipe", "from_step"}]), from metrics.jsonl's switch events."""
    history = []
    for record in read_jsonl(run_dir / METRICS_FILE):
        if is_recipe_switch(record):
            if not history:
                history.append({"recipe": record["from"], "from_step": 0})
            if history[-1] != {"recipe": record["to"], "from_step": record["step"]}:  # a restart logs it again
                history.append({"recipe": record["to"], "from_step": record["step"]})
    if len(history) < 2:
        return {"recipe": recipe, "recipe_history": [{"recipe": recipe, "from_step": 0}]}
    ends = [entry["from_step"] for entry in history[1:]] + [None]
    parts = [
        f"{e['recipe']} (steps {e['from_step'] + 1}-{end if end is not None else 'end'})"
        for e, end in zip(history, ends, strict=True)
    ]
    return {"recipe": ", then ".join(parts), "recipe_history": history}


def sample_text(config: Config, data: fp4lm.data.Data, graphdef: nnx.GraphDef, params, mesh) -> str | None:
    """eval.sample_tokens tokens generated after eval.sample_prompt (None when either is empty), by the model
    `graphdef` (under the run's final precision policy) that `params` fill."""
    e = config.eval
    if e.sample_tokens == 0:
        return None
    prompt = data.tokenizer.encode(e.sample_prompt)
    if len(prompt) == 0:
        return None
    new = generate(
        graphdef,
        params,
        prompt,
        max_tokens=e.sample_tokens,
        seq_len=config.data.seq_len,
        temperature=e.sample_temperature,
        top_k=e.sample_top_k,
        top_p=e.sample_top_p,
        vocab_limit=data.tokenizer.vocab_size,
        seed=config.train.seed,
        to_device=lambda value: replicated(mesh, value),
    )
    return e.sample_prompt + data.tokenizer.decode(new)


def mixture_summary(mixture: Mixture, sequences: int) -> dict:
    """summary.json's "mixture": the planned shares, and the shares and sequences each source gave over the
    run's `sequences` training sequences."""
    trained = mixture.realised(sequences)
    return {
        "planned": mixture.planned(),
        "realised": {name: n / max(1, sum(trained.values())) for name, n in trained.items()},
        "sequences": trained,
    }


def summary_lines(summary: dict, precision: str) -> list[str]:
    """The console's lines of `summary`; `precision` is the policy's summary (its table is in the banner)."""
    fmt = lambda v, spec: "n/a" if v is None else format(v, spec)  # noqa: E731
    lines = [
        f"done: final train loss {fmt(summary['final_train_loss'], '.4f')}, val loss "
        f"{fmt(summary['final_val_loss'], '.4f')}, {fmt(summary['tokens_per_sec'], ',.0f')} tokens/s, "
        f"{summary['skipped_steps']} skipped steps",
        f"precision: {precision}",
    ]
    if summary.get("final_precision") and summary["final_precision"] != summary.get("precision"):
        lines.append(f"after the late switch: {summary['final_precision']}")
    if summary.get("sample"):
        lines.append(f"sample:\n{summary['sample']}")
    return lines
