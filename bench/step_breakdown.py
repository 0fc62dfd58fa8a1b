"""Benchmark: where an nvfp4 linear layer's forward+backward spends its time over bf16 (CPU profile).

    python bench/step_breakdown.py [--quick] [--repeats N] [--json PATH] [--allow-load] [--compare-threefry]

For each shape (tokens M x in K x out N): the default config's MLP up-projection (2048 x 128 x 384: batch 16 x
seq 128 tokens, d_model 128, mlp_dim 384; bench/train_step.py's default) and 2048 x 1024 x 1024 (256^3 with
--quick), bf16 inputs, it times under jit (median of `block_until_ready` calls, all entries of a shape in
interleaved rounds, so load drift hits all alike):

- layers: y = x @ w with Y, dX, dW returned (as bench/dot.py, emulated backend) under bf16, nvfp4, and the
  ablations nvfp4_no_sr and nvfp4_no_rht; "nvfp4 - ablation" is what SR or the RHT costs inside the step;
- pieces, each a small jitted function over the operands one nvfp4 fwd+bwd quantizes (X, Wᵀ as 16x16 tiles,
  Xᵀ, dY, dYᵀ; SR on dY and dYᵀ; RHT on Xᵀ and dYᵀ):
  - amax:        block amaxes and the tensor amax of the five operands (nvfp4.scaled_blocks' first pass);
  - RHT:         the 16-point RHT of Xᵀ and dYᵀ;
  - quantize RNE: the five operands to the bf16 e2m1·s_b values the emulated GEMMs read, amax included, all
                 round-to-nearest (fused path for X, dY, dYᵀ; NVFP4Array + block_scaled for the saved Wᵀ, Xᵀ);
  - quantize SR:  the same with dY and dYᵀ stochastically rounded: "SR - RNE" is the SR cost (bits + rounding);
  - SR bits:     the 8-bit draws alone for dY and dYᵀ (rounding.random_bits, summed so the draws are not
                 written out: a fused quantize never writes them);
  - GEMMs:       the three bf16 GEMMs (fprop, dgrad, wgrad) with float32 accumulation, as the emulated backend
                 runs them.
With --compare-threefry it also times the nvfp4 layer and a 4096x4096 float32 fused SR quantize with the
previous bit source (threefry words, four elements' bits per 32-bit word) beside the current hash.

The host's load average (os.getloadavg, 1 minute) is recorded before and after each shape; above
bench/host_load.py's IDLE_LOAD the figures are refused (exit 3) unless --allow-load, and then marked loaded.
"""

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from fp4lm.numerics import formats, nvfp4, nvfp4_fused, rounding
from fp4lm.numerics.hadamard import rht
from fp4lm.quant import dot_general

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import host_load  # noqa: E402  (bench/host_load.py, beside this script)

SHAPES = ((2048, 128, 384), (2048, 1024, 1024))
QUICK_SHAPES = ((2048, 128, 384), (256, 256, 256))
LAYER_RECIPES = ("bf16", "nvfp4", "nvfp4_no_sr", "nvfp4_no_rht")
BF16 = jnp.bfloat16
FUSED_OPERANDS = (0, 3, 4)  # X, dY, dYᵀ feed one GEMM each (quant/dot.py gemm_input)


def layer(recipe):
    """jit(x, w, dy, key) -> (y, dx, dw) for y = x @ w, w the kernel [K, N] (bench/dot.py's layer)."""
    dot = dot_general(recipe, backend="emulated")
    dims = (((1,), (0,)), ((), ()))

    def run(x, w, dy, key):
        y, vjp = jax.vjp(lambda x, w: dot(x, w, dims, key=key), x, w)
        return (y, *vjp(dy))

    return run


def operands(x, w, dy):
    """The five tensors an nvfp4 fwd+bwd quantizes, as (tensor, block, stochastic, hadamard)."""
    return (
        (x, (1, 16), False, False),  # fprop X
        (w.T, (16, 16), False, False),  # fprop/dgrad Wᵀ tiles
        (x.T, (1, 16), False, True),  # wgrad Xᵀ
        (dy, (1, 16), True, False),  # dgrad dY
        (dy.T, (1, 16), True, True),  # wgrad dYᵀ
    )


def amax_passes(x, w, dy, key):
    del key
    return [formats.abs_max(lax.optimization_barrier(nvfp4._block_amax(t, b))) for t, b, _, _ in operands(x, w, dy)]


def rht_passes(x, w, dy, key):
    del key
    return [rht(t) for t, _, _, hadamard in operands(x, w, dy) if hadamard]


def quantize_passes(stochastic_allowed):
    def run(x, w, dy, key):
        out = []
        for i, (t, block, stochastic, _) in enumerate(operands(x, w, dy)):
            rounding = "stochastic" if stochastic and stochastic_allowed else "nearest"
            k = jax.random.fold_in(key, i) if rounding == "stochastic" else None
            if i in FUSED_OPERANDS:  # operands that feed one GEMM: the fused path
                out.append(nvfp4_fused.quantize_block_scaled(t, block=block, rounding=rounding, key=k, dtype=BF16))
            else:  # saved copies: NVFP4Array now, e2m1·s_b values in the backward pass
                out.append(nvfp4.quantize(t, block=block, rounding=rounding, key=k).block_scaled(BF16))
        return out

    return run


def sr_bits(x, w, dy, key):
    del x, w
    draws = [rounding.random_bits(jax.random.fold_in(key, i), s) for i, s in enumerate((dy.shape, dy.T.shape))]
    return [jnp.sum(d, dtype=jnp.uint32) for d in draws]


def gemms(x, w, dy, key):
    del key

    def tn(a, b):  # gemm._tn_dot: [R_a, K] x [R_b, K] -> [R_a, R_b], float32 accumulation
        dims = (((1,), (1,)), ((), ()))
        return lax.dot_general(a, b, dims, precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)

    return tn(x, w.T), tn(dy, w), tn(dy.T, x.T)


def threefry_random_bits(key, shape):
    """The previous SR bit source: threefry 32-bit words, four elements' bits per word."""
    shape = tuple(shape)
    if not shape or shape[-1] % 4:
        return jax.random.bits(key, shape, jnp.uint8)
    words = jax.random.bits(key, shape[:-1] + (shape[-1] // 4,), jnp.uint32)
    return lax.bitcast_convert_type(words, jnp.uint8).reshape(shape)


@contextlib.contextmanager
def _bit_source(fn):
    saved = rounding.random_bits, nvfp4_fused.random_bits
    rounding.random_bits = nvfp4_fused.random_bits = fn
    try:
        yield
    finally:
        rounding.random_bits, nvfp4_fused.random_bits = saved


def with_threefry(fn):
    """fn traced with the threefry bit source (jit traces on the first call, inside the patch)."""

    def run(*args):
        with _bit_source(threefry_random_bits):
            return fn(*args)

    return run


def time_interleaved(fns, args, repeats, warmup=2):
    """Median seconds per call of each jitted function, measured in interleaved rounds."""
    compiled = {name: jax.jit(fn) for name, fn in fns.items()}
    for fn in compiled.values():
        for _ in range(warmup):
            jax.block_until_ready(fn(*args))
    samples = {name: [] for name in compiled}
    for _ in range(repeats):
        for name, fn in compiled.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(times) for name, times in samples.items()}


def entries(compare_threefry) -> dict[str, Callable[..., Any]]:
    fns: dict[str, Callable[..., Any]] = {f"layer {recipe}": layer(recipe) for recipe in LAYER_RECIPES}
    fns.update(
        {
            "amax passes": amax_passes,
            "RHT": rht_passes,
            "quantize RNE": quantize_passes(False),
            "quantize SR": quantize_passes(True),
            "SR bits": sr_bits,
            "GEMMs": gemms,
        }
    )
    if compare_threefry:
        fns["layer nvfp4 (threefry bits)"] = with_threefry(layer("nvfp4"))
        fns["quantize SR (threefry bits)"] = with_threefry(quantize_passes(True))
        fns["SR bits (threefry)"] = with_threefry(sr_bits)
    return fns


def run_shape(shape, repeats, compare_threefry):
    m, k, n = shape
    kx, kw, kg = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (m, k), BF16)
    w = (jax.random.normal(kw, (k, n), jnp.float32) / k**0.5).astype(BF16)
    dy = jax.random.normal(kg, (m, n), BF16)
    load_before = host_load.load_average()
    seconds = time_interleaved(entries(compare_threefry), (x, w, dy, jax.random.key(1)), repeats)
    return dict(shape=list(shape), ms={name: s * 1e3 for name, s in seconds.items()}), load_before


def run_quantize_4096(repeats):
    """Fused quantize-dequantize with SR, 4096x4096 float32: hash bits vs threefry bits."""
    x = jax.random.normal(jax.random.key(0), (4096, 4096), jnp.float32)

    def fused(x, key):
        return nvfp4_fused.quantize_dequantize(x, rounding="stochastic", key=key)

    fns = {"fused SR quantize (hash bits)": fused, "fused SR quantize (threefry bits)": with_threefry(fused)}
    return {name: s * 1e3 for name, s in time_interleaved(fns, (x, jax.random.key(1)), repeats).items()}


def markdown(result):
    lines = []
    for r in result["shapes"]:
        ms = r["ms"]
        base, full = ms["layer bf16"], ms["layer nvfp4"]
        extra = full - base
        m, k, n = r["shape"]
        lines += [
            f"\n**{m} tokens x {k} in x {n} out** (load average {r['load_before']:.2f} before, {r['load_after']:.2f} "
            "after)\n",
            "| what | ms | / bf16 layer | share of nvfp4's extra |",
            "|---|---:|---:|---:|",
        ]

        def row(name, value, share=True, base=base, extra=extra, lines=lines):
            cell = f"{value / extra:.0%}" if share and extra > 0 else ""
            lines.append(f"| {name} | {value:.2f} | {value / base:.2f}x | {cell} |")

        row("layer bf16 (baseline)", base, share=False)
        row("layer nvfp4", full, share=False)
        row("nvfp4 extra over bf16", extra, share=False)
        row("nvfp4 - nvfp4_no_sr (SR in the step)", full - ms["layer nvfp4_no_sr"])
        row("nvfp4 - nvfp4_no_rht (RHT in the step)", full - ms["layer nvfp4_no_rht"])
        row("amax passes (5 operands)", ms["amax passes"])
        row("RHT (Xᵀ, dYᵀ)", ms["RHT"])
        row("quantize+dequantize RNE, excl. amax", ms["quantize RNE"] - ms["amax passes"])
        row("SR cost: quantize SR - quantize RNE", ms["quantize SR"] - ms["quantize RNE"])
        row("SR bits alone (dY, dYᵀ)", ms["SR bits"])
        row("GEMMs (3, bf16, f32 accumulation)", ms["GEMMs"], share=False)
        for name in ("layer nvfp4 (threefry bits)", "quantize SR (threefry bits)", "SR bits (threefry)"):
            if name in ms:
                row(name, ms[name], share=False)
    if result.get("quantize_4096"):
        lines += ["\n| 4096x4096 float32, fused SR quantize-dequantize | ms |", "|---|---:|"]
        lines += [f"| {name} | {value:.2f} |" for name, value in result["quantize_4096"].items()]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=(__doc__ or "").strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="256^3 instead of 2048x1024x1024, fewer repeats")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 9, 3 with --quick)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    host_load.add_allow_load_flag(parser)
    parser.add_argument("--compare-threefry", action="store_true", help="also time the previous SR bit source")
    args = parser.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 9)

    shapes = []
    for shape in QUICK_SHAPES if args.quick else SHAPES:
        record, load_before = run_shape(shape, repeats, args.compare_threefry)
        shapes.append(dict(record, load_before=load_before, load_after=host_load.load_average()))
    quantize_4096 = run_quantize_4096(repeats) if args.compare_threefry else None
    loads = [r[key] for r in shapes for key in ("load_before", "load_after")] + [host_load.load_average()]
    described = host_load.describe(loads[0], loads[-1])
    idle = host_load.refuse_unless_idle(loads, allow_load=args.allow_load)
    result = dict(
        benchmark="step_breakdown",
        device=f"{jax.devices()[0].platform}:{jax.devices()[0].device_kind}",
        host=platform.node(),
        jax=jax.__version__,
        repeats=repeats,
        cpus=os.cpu_count(),
        idle=idle,
        shapes=shapes,
        quantize_4096=quantize_4096,
    )
    print(
        f"nvfp4 linear fwd+bwd breakdown, jit, emulated, bf16 inputs, {result['device']}, jax {jax.__version__}, "
        f"median of {repeats}, {os.cpu_count()} CPUs, {described}"
    )
    if not idle:
        print(host_load.LOADED_MARK)
    print(markdown(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
