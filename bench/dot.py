"""Benchmark: forward + backward of one linear layer under every recipe, as a ratio to bf16.

    .venv/bin/python bench/dot.py                 # 2048 x 2048 x 2048, bf16 inputs
    .venv/bin/python bench/dot.py --quick         # 512^3, fewer repeats (a smoke run)
    .venv/bin/python bench/dot.py --json out.json

Each timing is the median over repeats (taken round-robin over all entries) of one jitted call that
returns Y, dX and dW (so no GEMM can be dead-code eliminated), after a warm-up call that compiles.
Backends: "emulated" and "native"; bf16 does not depend on the backend and is the baseline of both columns.
The host's load average is recorded before and after; above bench/host_load.py's IDLE_LOAD the figures are
refused (exit 3) unless --allow-load is given, and then the table says "loaded".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from fp4lm.quant import RECIPES, dot_general

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import host_load  # noqa: E402  (bench/host_load.py, beside this script)

BACKENDS = ("emulated", "native")


def layer_fwd_bwd(recipe: str, backend: str):
    """jit(x, w, dy, key) -> (y, dx, dw) for y = x @ w with w the kernel [K, N], as in nnx.Linear."""
    dot = dot_general(recipe, backend=backend)
    dims = (((1,), (0,)), ((), ()))

    def run(x, w, dy, key):
        y, vjp = jax.vjp(lambda x, w: dot(x, w, dims, key=key), x, w)
        dx, dw = vjp(dy)
        return y, dx, dw

    return jax.jit(run)


def time_interleaved(fns: dict, args, repeats: int) -> dict:
    """Per entry: (median wall seconds, median process CPU seconds). Entries are timed round-robin so
    machine load hits all of them alike; CPU time (all threads of this process) is the steadier measure
    on a shared machine."""
    for fn in fns.values():
        jax.block_until_ready(fn(*args))  # compile + warm up
    wall = {name: [] for name in fns}
    cpu = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            jax.block_until_ready(fn(*args))
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return {name: (statistics.median(wall[name]), statistics.median(cpu[name])) for name in fns}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="512^3 and 3 repeats")
    parser.add_argument("--size", type=int, default=None, help="M = K = N (default 2048, 512 with --quick)")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per entry (default 7; 3 quick)")
    parser.add_argument("--recipes", default=",".join(RECIPES), help="comma-separated recipe names")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    host_load.add_allow_load_flag(parser)
    args = parser.parse_args(argv)
    size = args.size or (512 if args.quick else 2048)
    repeats = args.repeats or (3 if args.quick else 7)
    recipes = [r for r in args.recipes.split(",") if r]

    kx, kw, kg = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (size, size), jnp.bfloat16)
    w = (jax.random.normal(kw, (size, size), jnp.float32) / size**0.5).astype(jnp.bfloat16)
    dy = jax.random.normal(kg, (size, size), jnp.bfloat16)
    inputs = (x, w, dy, jax.random.key(1))

    fns = {("bf16", "emulated"): layer_fwd_bwd("bf16", "emulated")}
    for recipe in recipes:
        if recipe != "bf16":
            fns.update({(recipe, backend): layer_fwd_bwd(recipe, backend) for backend in BACKENDS})
    load_before = host_load.load_average()
    seconds = time_interleaved(fns, inputs, repeats)
    load_after = host_load.load_average()
    baseline, baseline_cpu = seconds[("bf16", "emulated")]
    rows = []
    for recipe in recipes:
        row = {"recipe": recipe}
        for backend in BACKENDS:
            wall, cpu = seconds[("bf16", "emulated")] if recipe == "bf16" else seconds[(recipe, backend)]
            row[backend] = {
                "seconds": wall,
                "ratio_to_bf16": wall / baseline,
                "cpu_seconds": cpu,
                "cpu_ratio_to_bf16": cpu / baseline_cpu,
            }
        rows.append(row)

    device = jax.devices()[0]
    result = {
        "benchmark": "linear layer forward+backward (Y, dX, dW)",
        "shape": {"M": size, "K": size, "N": size},
        "dtype": "bfloat16",
        "repeats": repeats,
        "statistic": "median",
        "device": f"{device.platform}:{device.device_kind}",
        "host": platform.node(),
        "bf16_seconds": baseline,
        "bf16_cpu_seconds": baseline_cpu,
        "rows": rows,
        "load_average_before": load_before,
        "load_average_after": load_after,
    }
    print(
        f"linear fwd+bwd, M=K=N={size}, bf16 inputs, median of {repeats}, {result['device']}, "
        f"{host_load.describe(load_before, load_after)}"
    )
    result["idle"] = host_load.refuse_unless_idle([load_before, load_after], allow_load=args.allow_load)
    if not result["idle"]:
        print(host_load.LOADED_MARK)
    print("| recipe | emulated ms | emulated / bf16 | (CPU time) | native ms | native / bf16 | (CPU time) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        e, n = row["emulated"], row["native"]
        cells = [
            f"{b['seconds'] * 1e3:.1f} | {b['ratio_to_bf16']:.2f}x | {b['cpu_ratio_to_bf16']:.2f}x" for b in (e, n)
        ]
        print(f"| {row['recipe']} | {cells[0]} | {cells[1]} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
