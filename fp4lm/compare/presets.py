"""Comparison presets: config overrides that size every run of a comparison.

Precedence, lowest first: config defaults <- the user's CONFIG.yaml <- the preset <- the user's
`section.key=value` overrides <- the recipe entry's own `@section.key=value` overrides.

- `quick`: a tiny model (2 layers, d_model 64) with the byte tokenizer for 40 steps. It checks the tool,
  not the numerics; CI runs it end to end with two recipes. Most of its time is XLA compiling the
  quantized train step.
- `standard`: CPU-sized (4 layers, d_model 128, ~1M parameters, BPE 1024, 2,048 tokens per step,
  300 steps = 614k tokens). The committed records (results/standard/records/*.json) keep each
  run's `train_wall_s`.
- `gpu`: for one H200-class GPU: 12 layers, d_model 768, mlp 2048, 12 heads / 4 kv (88M parameters with
  untied embeddings at vocab 8192), seq_len 1024, batch 32 = 32,768 tokens per step, 1,500 steps = 49M
  tokens, past the loss knee of a model this size. An H200 has no FP4 tensor cores, so the FP4 recipes run
  emulated (quantize, dequantize, bf16 GEMM) and take longer than bf16 (`precision.backend=auto` picks the
  emulation). Give it a corpus of 50M+ tokens (data.path=...): the bundled Shakespeare (~1.4M tokens at this
  vocabulary) would be repeated ~35 times and memorised. bench/device_check.sh runs it, shortened, as its
  `compare` stage. Its layers are scanned and rematerialised (model.remat=full): unscanned and without remat
  it did not compile within an H200's memory.

Each preset's projected and measured times are in BENCHMARKS.md ("First GPU run", and the standard
comparison's records). `EXPECTED_DURATION` says in a few words how long a preset runs, for `fp4lm compare --help`.
"""

from __future__ import annotations

from fp4lm.errors import UserError

EXPECTED_DURATION = {
    "quick": "the shortest: a tiny model for 40 steps, mostly compiling",
    "standard": "several times quick's time per recipe on a CPU",
    "gpu": "sized for one H200-class GPU; FP4 emulated there, slower than bf16",
}

PRESETS: dict[str, dict[str, dict[str, object]]] = {
    "quick": {
        "model": {"num_layers": 2, "d_model": 64, "num_heads": 2, "num_kv_heads": 1, "mlp_dim": 128},
        "data": {"tokenizer": "byte", "vocab_size": 256, "seq_len": 64},
        "train": {"batch_size": 8, "steps": 40},
        "optimizer": {"lr": 3e-3, "warmup_steps": 5},
        "metrics": {"log_every": 5, "quant_stats_every": 10, "progress": "plain"},
        "eval": {"every": 10, "batches": 2, "sample_tokens": 0},
        "checkpoint": {"every": 20, "keep": 1},
    },
    "standard": {
        "model": {"num_layers": 4, "d_model": 128, "num_heads": 4, "num_kv_heads": 2, "mlp_dim": 384},
        "data": {"tokenizer": "bpe", "vocab_size": 1024, "seq_len": 128},
        "train": {"batch_size": 16, "steps": 300},
        "optimizer": {"lr": 3e-3, "warmup_steps": 30},
        "metrics": {"log_every": 10, "quant_stats_every": 25, "progress": "plain"},
        "eval": {"every": 25, "batches": 4},
        "checkpoint": {"every": 50, "keep": 1},
    },
    "gpu": {
        "model": {
            "num_layers": 12,
            "d_model": 768,
            "num_heads": 12,
            "num_kv_heads": 4,
            "mlp_dim": 2048,
            "scan_layers": True,  # these two: see the module doc (unscanned and without remat, it did not fit)
            "remat": "full",
        },
        "data": {"tokenizer": "bpe", "vocab_size": 8192, "seq_len": 1024},
        "train": {"batch_size": 32, "steps": 1500},
        "optimizer": {"lr": 1e-3, "warmup_steps": 100},
        "metrics": {"log_every": 50, "quant_stats_every": 250, "progress": "plain"},
        "eval": {"every": 100, "batches": 8},
        "checkpoint": {"every": 500, "keep": 1},
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
