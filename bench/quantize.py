"""Benchmark: NVFP4 1x16 quantize + dequantize under jit, against two yardsticks.

    python bench/quantize.py [--quick] [--repeats N] [--json PATH] [--allow-load]
    python bench/quantize.py --options [--quick] ...     # the 2026 options' cost against plain nvfp4

For a 4096x4096 tensor (1024x1024 with --quick), in float32 and bfloat16, it times
- floor:  an elementwise `x * c` over the same tensor (one read, one write: the memory-bound floor);
- fp4lm:  `fp4lm.numerics.nvfp4.quantize(x)` followed by `.dequantize(x.dtype)` (packed codes, scales, amax);
- fused:  `fp4lm.numerics.nvfp4_fused.quantize_dequantize(x)`, the same bits in one pass after the amax pass
          (what the emulated GEMM uses where it only needs dequantized values);
- jax:    JAX's own NVFP4 quantizer, `jax._src.cudnn.scaled_matmul_stablehlo.quantize` with
          `jax.nn.get_scaled_dot_general_config("nvfp4", global_scale=amax/2688)`, plus its
          dequantize (e2m1 · scale · global_scale), the path `jax.nn.scaled_dot_general` takes.
Each function is compiled and warmed up, then the three are run in interleaved rounds (so load
drift hits all alike); the table reports the median wall time of `block_until_ready` calls.
With --options it times instead the fused quantize+dequantize with each of NVFP4's 2026 options (row-scaled
amax, 4over6 MAE/MSE, with 1x16 blocks and 16x16 tiles) against plain nvfp4 in the same interleaved rounds.
Goals: quantize+dequantize (the fused path) <= 2.5x the floor for float32, <= 3x for bfloat16, and no slower
than jax. The host's load average is recorded before and after; above bench/host_load.py's IDLE_LOAD the figures
are refused (exit 3) unless --allow-load is given, and then the table says "loaded".
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax._src.cudnn import scaled_matmul_stablehlo as jax_scaled_matmul

from fp4lm.numerics import nvfp4, nvfp4_fused

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import host_load  # noqa: E402  (bench/host_load.py, beside this script)

GOALS = {"float32": 2.5, "bfloat16": 3.0}  # at 4096x4096; a smaller tensor's floor runs from cache
GOAL_SIZE = 4096


def floor_fn(x):
    return x * jnp.asarray(1.5, x.dtype)


def fp4lm_fn(x):
    return nvfp4.quantize(x).dequantize(x.dtype)


def fused_fn(x):
    return nvfp4_fused.quantize_dequantize(x, dtype=x.dtype)


def jax_builtin_fn(x):
    amax = jnp.max(jnp.abs(x)).astype(jnp.float32)
    global_scale = jnp.reshape(amax / np.float32(2688.0), (1,))
    config = jax.nn.get_scaled_dot_general_config("nvfp4", global_scale=global_scale)
    data, scales = jax_scaled_matmul.quantize(x, config)
    values = data.astype(jnp.float32).reshape(x.shape[:-1] + (-1, config.block_size))
    dequantized = values * scales.astype(jnp.float32)[..., None] * global_scale[0]
    return dequantized.reshape(x.shape).astype(x.dtype)


FUNCTIONS = {"floor": floor_fn, "fp4lm": fp4lm_fn, "fused": fused_fn, "jax": jax_builtin_fn}

# name -> (block, nvfp4.Options): the options a recipe can set per operand (fp4lm.quant.recipes).
OPTIONS = {
    "plain 1x16": ((1, 16), nvfp4.PLAIN),
    "row-scaled 1x16": ((1, 16), nvfp4.Options(row_scaled=True)),
    "4over6 MAE 256 1x16": ((1, 16), nvfp4.Options(four_over_six="mae", e4m3_max=256)),
    "4over6 MSE 448 1x16": ((1, 16), nvfp4.Options(four_over_six="mse")),
    "row-scaled + 4over6 MAE 256 1x16": ((1, 16), nvfp4.Options(row_scaled=True, four_over_six="mae", e4m3_max=256)),
    "plain 16x16": ((16, 16), nvfp4.PLAIN),
    "4over6 MAE 256 16x16": ((16, 16), nvfp4.Options(four_over_six="mae", e4m3_max=256)),
}


def option_fn(block, options):
    def quantize_dequantize(x):
        return nvfp4_fused.quantize_dequantize(x, block=block, dtype=x.dtype, options=options)

    return quantize_dequantize


def run_options(size, repeats):
    """Per dtype and option: median ms and the ratio to plain nvfp4 with the same block shape."""
    rows = []
    for dtype in (jnp.float32, jnp.bfloat16):
        x = jax.random.normal(jax.random.key(0), (size, size), jnp.float32).astype(dtype)
        fns = {name: option_fn(block, options) for name, (block, options) in OPTIONS.items()}
        seconds = time_interleaved(fns, x, repeats)
        for name, (block, _) in OPTIONS.items():
            plain = seconds[f"plain {block[0]}x{block[1]}"]
            rows.append(
                dict(
                    dtype=jnp.dtype(dtype).name,
                    shape=[size, size],
                    option=name,
                    ms=seconds[name] * 1e3,
                    ratio_to_plain=seconds[name] / plain,
                )
            )
    return rows


def options_markdown(rows):
    lines = ["| input | shape | option | fused q+dq (ms) | / plain nvfp4 |", "|---|---|---|---:|---:|"]
    for r in rows:
        shape = "x".join(map(str, r["shape"]))
        lines.append(f"| {r['dtype']} | {shape} | {r['option']} | {r['ms']:.2f} | {r['ratio_to_plain']:.2f}x |")
    return "\n".join(lines)


def time_interleaved(fns, x, repeats, warmup=2):
    """Median seconds per call of each jitted function, measured in interleaved rounds."""
    compiled = {name: jax.jit(fn) for name, fn in fns.items()}
    for fn in compiled.values():
        for _ in range(warmup):
            jax.block_until_ready(fn(x))
    samples = {name: [] for name in compiled}
    for _ in range(repeats):
        for name, fn in compiled.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(x))
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(times) for name, times in samples.items()}


def run(size, repeats):
    rows = []
    for dtype in (jnp.float32, jnp.bfloat16):
        x = jax.random.normal(jax.random.key(0), (size, size), jnp.float32).astype(dtype)
        seconds = time_interleaved(FUNCTIONS, x, repeats)
        name = jnp.dtype(dtype).name
        rows.append(
            dict(
                dtype=name,
                shape=[size, size],
                floor_ms=seconds["floor"] * 1e3,
                fp4lm_ms=seconds["fp4lm"] * 1e3,
                fused_ms=seconds["fused"] * 1e3,
                jax_ms=seconds["jax"] * 1e3,
                unfused_ratio_to_floor=seconds["fp4lm"] / seconds["floor"],
                ratio_to_floor=seconds["fused"] / seconds["floor"],
                ratio_to_jax=seconds["fused"] / seconds["jax"],
                goal_ratio_to_floor=GOALS[name] if size == GOAL_SIZE else None,
            )
        )
    return rows


def markdown(rows):
    lines = [
        "| input | shape | floor `x*c` (ms) | NVFP4Array q+dq (ms) | fused q+dq (ms) | jax q+dq (ms) "
        "| NVFP4Array / floor | fused / floor (goal) | fused / jax (goal <= 1) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        shape = "x".join(map(str, r["shape"]))
        goal = "" if r["goal_ratio_to_floor"] is None else f" (<= {r['goal_ratio_to_floor']})"
        lines.append(
            f"| {r['dtype']} | {shape} | {r['floor_ms']:.2f} | {r['fp4lm_ms']:.2f} | {r['fused_ms']:.2f} "
            f"| {r['jax_ms']:.2f} | {r['unfused_ratio_to_floor']:.2f} | {r['ratio_to_floor']:.2f}{goal} "
            f"| {r['ratio_to_jax']:.2f} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1024x1024 instead of 4096x4096")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 15, 5 with --quick)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("--options", action="store_true", help="the 2026 options' cost against plain nvfp4")
    host_load.add_allow_load_flag(parser)
    args = parser.parse_args(argv)
    size = 1024 if args.quick else GOAL_SIZE
    repeats = args.repeats or (5 if args.quick else 15)

    load_before = host_load.load_average()
    rows = run_options(size, repeats) if args.options else run(size, repeats)
    load_after = host_load.load_average()
    idle = host_load.refuse_unless_idle([load_before, load_after], allow_load=args.allow_load)
    device = jax.devices()[0]
    what = "NVFP4 options, fused" if args.options else "NVFP4 1x16"
    print(
        f"{what} quantize+dequantize, jit, {device.platform} ({device.device_kind}), "
        f"jax {jax.__version__}, median of {repeats}, {os.cpu_count()} CPUs, "
        f"{host_load.describe(load_before, load_after)}"
    )
    if not idle:
        print(host_load.LOADED_MARK)
    print()
    print(options_markdown(rows) if args.options else markdown(rows))
    if args.json:
        record = dict(
            benchmark="quantize",
            command="python bench/quantize.py"
            + (" --options" if args.options else "")
            + (" --quick" if args.quick else ""),
            device=f"{device.platform}:{device.device_kind}",
            host=platform.node(),
            load_average_before=load_before,
            load_average_after=load_after,
            idle=idle,
            jax=jax.__version__,
            repeats=repeats,
            results=rows,
        )
        with open(args.json, "w") as f:
            json.dump(record, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
