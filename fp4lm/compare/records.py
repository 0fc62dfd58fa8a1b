"""A record: everything the report needs from one finished run, in one JSON file (DIR/records/<label>.json).

Built from the trainer's RUN_DIR/metrics.jsonl (train, eval and quant-telemetry lines) and
RUN_DIR/summary.json. Records are small and self-contained, so a comparison can be committed recipe by
recipe and resumed elsewhere without the run directories (which hold checkpoints).

Record layout:
    {"label", "recipe", "entry", "display", "overrides", "status": "finished" | "diverged",
     "config": resolved config dict, "tokens_per_step",
     "curves": {"train": {"step", "tokens", "loss"}, "val": {"step", "tokens", "val_loss"}},
     "final": {"val_loss", "train_loss", "perplexity", "skipped_steps", "tokens_per_sec", "steps"},
     "quant_stats": {"step": [...], "layers": {path: {operand: {metric: [value | null per step]}}}},
     "routing": {"step": [...], "blocks": {MoE block path: {metric: [value | null per step]}}} (a MoE model's
       routers, from the train records; empty lists for a dense model),
     "events": [{"step", "tokens", "event", ...}] (e.g. the late precision switch to bf16),
     "tokenizer_sha256": hash of the run's tokenizer.json (runs are comparable only with the same tokenizer),
     "summary": the trainer's summary.json (or null), "train_wall_s",
     "train_load": the host's one-minute load average [when training started, when it ended], or null}
"""

from __future__ import annotations

import hashlib
import json
import math
import pathlib
import statistics
from typing import Any

from fp4lm.jsonio import json_value, read_jsonl

QUANT_METRICS = ("rel_err", "saturated_frac", "underflow_frac", "amax")
ROUTING_METRICS = ("max_over_mean_tokens", "dropped_fraction", "load_balance", "z_loss", "aux_loss", "entropy")

RECORD_VERSION = 1


def _last_per_step(lines: list[dict[str, Any]], key: str) -> dict[int, dict[str, Any]]:
    """Lines carrying `key`, keyed by step; a resumed run may log a step twice, the later line wins."""
    by_step: dict[int, dict[str, Any]] = {}
    for line in lines:
        if key in line and "step" in line:
            by_step[int(line["step"])] = line
    return dict(sorted(by_step.items()))


def _finite_or_none(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def train_curve(lines: list[dict[str, Any]], tokens_per_step: int) -> dict[str, list]:
    by_step = _last_per_step(lines, "loss")
    steps = list(by_step)
    return {
        "step": steps,
        "tokens": [step * tokens_per_step for step in steps],
        "loss": [_finite_or_none(by_step[s]["loss"]) for s in steps],
    }


def val_curve(lines: list[dict[str, Any]], tokens_per_step: int) -> dict[str, list]:
    by_step = _last_per_step(lines, "val_loss")
    steps = list(by_step)
    return {
        "step": steps,
        "tokens": [step * tokens_per_step for step in steps],
        "val_loss": [_finite_or_none(by_step[s]["val_loss"]) for s in steps],
    }


def quant_series(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """Telemetry as per-layer, per-operand, per-metric series aligned on one list of steps (null = absent)."""
    by_step = _last_per_step(lines, "quant_stats")
    steps = list(by_step)
    layers: dict[str, dict[str, dict[str, list]]] = {}
    for index, step in enumerate(steps):
        for layer, operands in (by_step[step]["quant_stats"] or {}).items():
            for operand, stats in (operands or {}).items():
                series = layers.setdefault(layer, {}).setdefault(operand, {})
                for metric in QUANT_METRICS:
                    values = series.setdefault(metric, [None] * len(steps))
                    values[index] = _finite_or_none(stats.get(metric))
    return {"step": steps, "layers": layers}


def routing_series(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """A MoE model's routing (the train records' "routing") as per-block, per-metric series aligned on the
    steps that logged it (null = absent)."""
    by_step = {step: line for step, line in _last_per_step(lines, "loss").items() if line.get("routing")}
    steps = list(by_step)
    blocks: dict[str, dict[str, list]] = {}
    for index, step in enumerate(steps):
        for block, metrics in by_step[step]["routing"].items():
            series = blocks.setdefault(block, {})
            for metric in ROUTING_METRICS:
                series.setdefault(metric, [None] * len(steps))[index] = _finite_or_none((metrics or {}).get(metric))
    return {"step": steps, "blocks": blocks}


def events(lines: list[dict[str, Any]], tokens_per_step: int) -> list[dict[str, Any]]:
    """Trainer events such as {"step", "event": "precision_switch", "to": "bf16"}, with their token count."""
    return [
        {**line, "tokens": int(line["step"]) * tokens_per_step} for line in lines if "event" in line and "step" in line
    ]


def steady_tokens_per_sec(lines: list[dict[str, Any]]) -> float | None:
    """Median tokens/s over logged steps, leaving out the first (it carries compilation).

    Only a fallback: the trainer's summary.json holds the steady-state tokens/s (windows with a
    compilation excluded), which is what the report shows when present.
    """
    values = [
        float(line["tokens_per_sec"])
        for line in _last_per_step(lines, "loss").values()
        if line.get("tokens_per_sec") is not None and math.isfinite(float(line["tokens_per_sec"]))
    ]
    if len(values) > 1:
        values = values[1:]
    return statistics.median(values) if values else None


def _last_value(values: list) -> float | None:
    finite = [v for v in values if v is not None]
    return finite[-1] if finite else None


def _first_known(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


def file_sha256(path: pathlib.Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def build_record(
    *,
    spec_fields: dict[str, Any],
    config: dict[str, Any],
    run_dir: pathlib.Path,
    status: str,
    train_wall_s: float | None,
    train_load: tuple[float | None, float | None] | None = None,
) -> dict[str, Any]:
    """Turns a run directory into a record. `spec_fields`: label, recipe, entry, display, overrides."""
    lines = read_jsonl(run_dir / "metrics.jsonl")  # a torn last line (a run killed mid-write) is skipped
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    tokens_per_step = int(config["train"]["batch_size"]) * int(config["data"]["seq_len"])
    train = train_curve(lines, tokens_per_step)
    val = val_curve(lines, tokens_per_step)
    summary = summary or {}
    val_loss = _first_known(_finite_or_none(summary.get("final_val_loss")), _last_value(val["val_loss"]))
    train_loss = _first_known(_finite_or_none(summary.get("final_train_loss")), _last_value(train["loss"]))
    skipped = summary.get("skipped_steps")
    if skipped is None:
        skipped_values = [line["skipped_steps"] for line in lines if line.get("skipped_steps") is not None]
        skipped = skipped_values[-1] if skipped_values else None
    final = {
        "val_loss": val_loss,
        "train_loss": train_loss,
        "perplexity": math.exp(val_loss) if val_loss is not None and val_loss < 700 else None,
        "skipped_steps": int(skipped) if skipped is not None else None,
        "tokens_per_sec": _first_known(_finite_or_none(summary.get("tokens_per_sec")), steady_tokens_per_sec(lines)),
        "steps": summary.get("steps", train["step"][-1] if train["step"] else None),
    }
    return {
        "version": RECORD_VERSION,
        **spec_fields,
        "status": status,
        "config": config,
        "tokens_per_step": tokens_per_step,
        "curves": {"train": train, "val": val},
        "final": final,
        "quant_stats": quant_series(lines),
        "routing": routing_series(lines),
        "events": events(lines, tokens_per_step),
        "tokenizer_sha256": file_sha256(run_dir / "tokenizer.json"),
        "summary": json_value(summary) or None,
        "train_wall_s": train_wall_s,
        "train_load": list(train_load) if train_load is not None else None,
    }


RECORDS_DIR = "records"  # DIR/records/ of a comparison; made first, so it also marks the directory as one


def record_path(out_dir: pathlib.Path, label: str) -> pathlib.Path:
    return out_dir / RECORDS_DIR / f"{label}.json"


def read_record(path: pathlib.Path) -> dict[str, Any] | None:
    """The record at `path`, or None when there is none (or it is unreadable: then the run is redone)."""
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict) or record.get("version") != RECORD_VERSION:
        return None
    return record
