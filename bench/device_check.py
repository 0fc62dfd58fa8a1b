"""The Python half of bench/device_check.sh: run on a machine with a GPU (JAX_PLATFORMS=cuda,cpu).

2. GPU vs CPU: quantize the same inputs on both and compare codes, scale bytes and amax (bit for bit).
3. Quantizer bandwidth: NVFP4 1x16 quantize of a bf16 tensor against a device-to-device copy.
4. Train step: tokens/s and MFU for bf16 and emulated nvfp4 at a ~350M-parameter config.

Imports fp4lm.numerics, fp4lm.quant, fp4lm.model and fp4lm.flops only (no grain, no tensorboardX).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from fp4lm import numerics
from fp4lm.config import load_config
from fp4lm.flops import training_flops_per_step
from fp4lm.model import Llama
from fp4lm.quant import Policy

ROOT = pathlib.Path(__file__).resolve().parents[1]
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "B200": 2250.0, "GB200": 2500.0}

CASES = (  # (format, block, hadamard)
    ("nvfp4", (1, 16), False),
    ("nvfp4", (16, 16), False),
    ("nvfp4", (1, 16), True),
    ("mxfp4", (1, 16), False),
    ("mxfp8", (1, 16), False),
    ("fp8_e4m3", (1, 16), False),
    ("fp8_e5m2", (1, 16), False),
)


def timed(fn, *args, repeats: int = 10) -> float:
    """Median seconds of fn(*args) after a warm-up call (fn is jitted)."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def as_bytes(q) -> dict[str, np.ndarray]:
    """Every array leaf of a quantized pytree as raw bytes (scales and data compared bit for bit)."""
    leaves = jax.tree_util.tree_leaves_with_path(q)
    return {jax.tree_util.keystr(path): np.atleast_1d(np.asarray(leaf)).view(np.uint8).copy() for path, leaf in leaves}


def check_gpu_matches_cpu(gpu, cpu) -> list[dict]:
    rng = np.random.default_rng(0)
    inputs = {
        "normal": rng.standard_normal((256, 1024)),
        "outliers": rng.standard_normal((256, 1024)) * np.where(rng.random((256, 1024)) < 0.001, 300.0, 1.0),
        "tiny": rng.standard_normal((256, 1024)) * 1e-20,
    }
    rows = []
    for fmt, block, hadamard in CASES:
        quantize = jax.jit(lambda v, f=fmt, b=block, h=hadamard: numerics.quantize(v, f, block=b, hadamard=h))
        for data_name, data in inputs.items():
            for dtype in (jnp.float32, jnp.bfloat16):
                x = np.asarray(jnp.asarray(data, dtype))
                on_gpu = as_bytes(quantize(jax.device_put(x, gpu)))
                on_cpu = as_bytes(quantize(jax.device_put(x, cpu)))
                mismatched = sum(int(np.sum(on_gpu[k] != on_cpu[k])) for k in on_cpu)
                rows.append({"data": data_name, "dtype": jnp.dtype(dtype).name, "format": fmt,
                             "block": list(block), "hadamard": hadamard, "mismatched_bytes": mismatched})
    return rows


def quantizer_bandwidth(gpu) -> dict:
    x = jax.device_put(jax.random.normal(jax.random.key(0), (8192, 8192), jnp.bfloat16), gpu)
    copy = jax.jit(lambda v: v * jnp.bfloat16(1))  # reads and writes every byte once
    quantize = jax.jit(lambda v: numerics.quantize(v, "nvfp4"))
    t_copy, t_quant = timed(copy, x), timed(quantize, x)
    copy_bytes = 2 * x.size * 2
    quant_bytes = x.size * 2 + x.size // 2 + x.size // 16  # read bf16, write codes + scales
    copy_gbs, quant_gbs = copy_bytes / t_copy / 1e9, quant_bytes / t_quant / 1e9
    return {"shape": list(x.shape), "copy_s": t_copy, "quantize_s": t_quant, "copy_GBps": copy_gbs,
            "quantize_GBps": quant_gbs, "fraction_of_copy": quant_gbs / copy_gbs}


def train_step_throughput(recipe: str, config_path: str, batch_size: int, peak_tflops: float) -> dict:
    config = load_config(config_path, [f"train.batch_size={batch_size}"])
    vocab, seq = config.data.vocab_size, config.data.seq_len
    policy = Policy(recipe, num_layers=config.model.num_layers, backend="emulated")
    model = Llama(config.model, vocab, policy, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)
    optimizer = optax.adamw(1e-4)
    opt_state = optimizer.init(params)

    @jax.jit
    def step(params, opt_state, tokens, key):
        def loss_fn(p):
            logits = nnx.merge(graphdef, p)(tokens[:, :-1], quant_key=key)
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    tokens = jax.random.randint(jax.random.key(1), (batch_size, seq + 1), 0, vocab)
    state = step(params, opt_state, tokens, jax.random.key(2))
    jax.block_until_ready(state)
    times = []
    for i in range(5):
        start = time.perf_counter()
        state = step(state[0], state[1], tokens, jax.random.key(3 + i))
        jax.block_until_ready(state)
        times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    flops = training_flops_per_step(config.model, vocab, seq, batch_size).total
    return {"recipe": recipe, "batch": batch_size, "seq": seq, "step_s": step_s,
            "tokens_per_sec": batch_size * seq / step_s, "tflops_per_sec": flops / step_s / 1e12,
            "mfu": flops / step_s / 1e12 / peak_tflops, "loss": float(state[2])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="device_check.json")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--config", default=str(ROOT / "configs" / "350m.yaml"), help="model shape to time")
    args = parser.parse_args()
    gpu, cpu = jax.devices()[0], jax.devices("cpu")[0]
    kind = next((k for k in PEAK_BF16_TFLOPS if k in gpu.device_kind.upper().replace(" ", "")), "H200")
    results = {"device": gpu.device_kind, "jax": jax.__version__}
    print(f"device: {gpu.device_kind}", flush=True)
    results["gpu_vs_cpu"] = check_gpu_matches_cpu(gpu, cpu)
    print("gpu vs cpu compared", flush=True)
    results["bandwidth"] = quantizer_bandwidth(gpu)
    print("bandwidth measured", flush=True)
    results["train"] = [train_step_throughput(r, args.config, args.batch, PEAK_BF16_TFLOPS[kind]) for r in ("bf16", "nvfp4")]
    pathlib.Path(args.out).write_text(json.dumps(results, indent=1))

    mismatches = sum(row["mismatched_bytes"] for row in results["gpu_vs_cpu"])
    bw, (bf16, nvfp4) = results["bandwidth"], results["train"]
    print(f"\n| check | result | goal |\n|---|---|---|")
    print(f"| GPU vs CPU bytes differing ({len(results['gpu_vs_cpu'])} cases) | {mismatches} | 0 |")
    print(f"| quantizer vs copy bandwidth | {bw['quantize_GBps']:.0f} / {bw['copy_GBps']:.0f} GB/s = "
          f"{bw['fraction_of_copy']:.2f} | >= 0.50 |")
    for row in (bf16, nvfp4):
        print(f"| train step {row['recipe']} (batch {row['batch']}x{row['seq']}) | "
              f"{row['tokens_per_sec']:,.0f} tok/s, MFU {row['mfu']:.2f} | |")
    print(f"| nvfp4 / bf16 step time | {nvfp4['step_s'] / bf16['step_s']:.2f}x | <= 1.3x |")
    print(f"\nfull results: {args.out}")
    return 0 if mismatches == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
