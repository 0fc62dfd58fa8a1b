"""Comparison presets: config overrides that size every run of a comparison.

Precedence, lowest first: config defaults <- the user's CONFIG.yaml <- the preset <- the user's
`section.key=value` overrides <- the recipe entry's own `@section.key=value` overrides.

- `quick`: a tiny model with the byte tokenizer for a few dozen steps; two recipes train in a couple of
  minutes on 2 CPU cores (CI runs it end to end). It checks the tool, not the numerics.
- `standard`: CPU-sized, long enough that the recipes separate, sized so that nine recipes fit in about
  two hours on 2 cores (~12 minutes each, compilation included).
"""

from __future__ import annotations

from fp4lm.errors import UserError

PRESETS: dict[str, dict[str, dict[str, object]]] = {
    "quick": {
        "model": {"num_layers": 2, "d_model": 64, "num_heads": 2, "num_kv_heads": 1, "mlp_dim": 128},
        "data": {"tokenizer": "byte", "vocab_size": 256, "seq_len": 64},
        "train": {"batch_size": 8, "steps": 40},
        "optimizer": {"lr": 3e-3, "warmup_steps": 5},
        "metrics": {"log_every": 5, "quant_stats_every": 10, "progress": "plain"},
        "eval": {"every": 10, "batches": 2},
        "checkpoint": {"every": 20, "keep": 1},
    },
    "standard": {
        "model": {"num_layers": 4, "d_model": 256, "num_heads": 4, "num_kv_heads": 2, "mlp_dim": 768},
        "data": {"tokenizer": "bpe", "vocab_size": 2048, "seq_len": 256},
        "train": {"batch_size": 16, "steps": 600},
        "optimizer": {"warmup_steps": 50},
        "metrics": {"log_every": 10, "quant_stats_every": 50, "progress": "plain"},
        "eval": {"every": 50, "batches": 8},
        "checkpoint": {"every": 100, "keep": 1},
    },
}


def _format(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def preset_overrides(name: str | None) -> list[str]:
    """The preset as `section.key=value` strings (empty for no preset)."""
    if name is None:
        return []
    if name not in PRESETS:
        raise UserError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
    return [
        f"{section}.{key}={_format(value)}"
        for section, values in PRESETS[name].items()
        for key, value in values.items()
    ]
