"""Comparison presets: config overrides that size every run of a comparison.

Precedence, lowest first: config defaults <- the user's CONFIG.yaml <- the preset <- the user's
`section.key=value` overrides <- the recipe entry's own `@section.key=value` overrides.

- `quick`: a tiny model (2 layers, d_model 64) with the byte tokenizer for 40 steps. It checks the tool,
  not the numerics; CI runs it end to end with two recipes. Most of its time is XLA compiling the
  quantized train step.
- `standard`: CPU-sized (4 layers, d_model 128, ~1M parameters, BPE 1024, 2,048 tokens per step,
  300 steps = 614k tokens). The committed records (results/standard/records/*.json, `train_wall_s`)
  took 5 min (bf16) to 10 min (nvfp4) and up to 18 min per recipe on the 2-core development machine
  while it was shared, with the slower quantizer of the time; `make run`, a model of the same size, now
  trains in ~1m45s on the idle machine (compilation included).
- `gpu`: for one H200-class GPU: 12 layers, d_model 768, mlp 2048, 12 heads / 4 kv (88M parameters with
  untied embeddings at vocab 8192), seq_len 1024, batch 32 = 32,768 tokens per step, 1,500 steps = 49M
  tokens, past the loss knee of a model this size. Estimate: `fp4lm project` (fp4lm.project's calibrated
  roofline, FLOPs from fp4lm.flops: 17.9 TFLOP per step) gives 48 ms per bf16 step on an H200, 1.2 min for
  the steps; fp4lm is not MaxText, so allow about twice that plus compilation: ~3 min per recipe in bf16.
  An H200 has no FP4 tensor cores, so the FP4 recipes run emulated (quantize, dequantize, bf16 GEMM):
  projected 74 ms per step, slower than bf16 (`precision.backend=auto` picks the emulation). Give it a
  corpus of 50M+ tokens (data.path=...): the bundled Shakespeare (~1.4M tokens at this vocabulary) would be
  repeated ~35 times and memorised. bench/device_check.sh runs it, shortened, as its `compare` stage.
  Its layers are scanned and rematerialised (model.remat=full, ~1.3x the step's FLOPs): the first run on an
  H200 (2026-12-04, unscanned, no remat) stopped compiling with XLA:GPU asking for 241 GiB; XLA:CPU compiles
  that program to 31.6 GiB of temporaries and this one to 4.7 GiB (BENCHMARKS.md, "First GPU run").

`EXPECTED_DURATION` says this in a few words for `fp4lm compare --help`.
"""

from __future__ import annotations

from fp4lm.errors import UserError

# Per recipe, on a 2-core CPU (quick: its end-to-end test, two recipes plus the report, took 2 min on the shared
# development machine; standard: the records above and `make run`'s time).
EXPECTED_DURATION = {
    "quick": "~1 min per recipe on 2 CPU cores, mostly compiling",
    "standard": "~2 min per recipe on 2 idle CPU cores, several times that on a busy machine",
    "gpu": "~3 min per recipe in bf16 on one H200 (estimated, not yet measured); FP4 emulated, slower",
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
