"""The one home of what a `fp4lm plan` / `fp4lm project` flag (or a `--dry-run --plan` key) may hold: each value is
read here, from a number or from text, and refused in one line (a `UserError`) when it means nothing: not a
number, not finite, not whole where a count is meant, or outside the range a training run can have."""

from __future__ import annotations

import math

from fp4lm.errors import UserError

MAX_GPUS = 1 << 20
"""1,048,576 GPUs: about ten times the largest training cluster built; beyond it a plan is arithmetic."""

# Per real-valued flag: (least, most, both inclusive; what it means, as the fix says it).
NUMBER_RANGES: dict[str, tuple[float, float, str]] = {
    "price": (0.0, 1000.0, "$ per GPU-hour, e.g. --price 3 (0: cost not priced)"),
    "pue": (1.0, 3.0, "the facility's power overhead, e.g. --pue 1.2 (1.0: the GPUs alone)"),
    "scaleout_gbps": (1.0, 10_000.0, "GB/s per GPU, e.g. --scaleout-gbps 50 (400 Gb/s InfiniBand)"),
}

COUNT_FLAGS = ("gpus", "tp", "pp", "vp", "cp", "ep", "gbs", "mbs", "nvlink_domain", "seq", "batch")


def flag_name(key: str) -> str:
    """`nvlink_domain` -> `--nvlink-domain`, as the command line spells it."""
    return "--" + key.replace("_", "-")


def count(key: str, value) -> int:
    """A positive whole number (a GPU count, a parallel size, a batch), from an int or its decimal text; GPU
    counts at most `MAX_GPUS` (the others are bounded where they meet the model: the layout's checks, the
    tokens per GPU, the memory estimate)."""
    text = str(value).strip()
    is_whole = isinstance(value, int) and not isinstance(value, bool)
    if not is_whole and not text.isdigit():
        raise UserError(f"{flag_name(key)} {text!r} is not a whole number; give a positive integer, e.g. 8")
    number = int(text)
    if number < 1:
        raise UserError(f"{flag_name(key)} must be a positive integer, got {number}")
    if key in ("gpus", "sweep", "nvlink_domain") and number > MAX_GPUS:
        raise UserError(f"{flag_name(key)} {number:,} is more than {MAX_GPUS:,}, beyond any cluster; give fewer")
    return number


def number(key: str, value) -> float:
    """A finite number in the flag's range (`NUMBER_RANGES`), from a float or its text."""
    least, most, meaning = NUMBER_RANGES[key]
    try:
        result = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{flag_name(key)} {value!r} is not a number; give {meaning}") from None
    if not math.isfinite(result) or not least <= result <= most:
        raise UserError(f"{flag_name(key)} {value} is outside [{least:g}, {most:g}]; give {meaning}")
    return result


def boolean(key: str, value) -> bool:
    """true/false (also 1/0, yes/no) as a `--dry-run --plan` key writes them; a bool as argparse gives it."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in ("true", "false", "1", "0", "yes", "no"):
        raise UserError(f"{key}={value!r} is not true or false; write {key}=true or {key}=false")
    return text in ("true", "1", "yes")


def checked_values(values: dict) -> dict:
    """`values` with every count and number flag read and checked (None: not given, left for its default)."""
    out = dict(values)
    for key in COUNT_FLAGS:
        if out.get(key) is not None:
            out[key] = count(key, out[key])
    for key in NUMBER_RANGES:
        if out.get(key) is not None:
            out[key] = number(key, out[key])
    if out.get("fsdp") is not None:
        out["fsdp"] = boolean("fsdp", out["fsdp"])
    for key in ("recipes", "sweep", "power", "plot"):
        if out.get(key) is not None and not str(out[key]).strip():
            raise UserError(f"{flag_name(key)} is empty; give a value or leave the flag out")
    return out
