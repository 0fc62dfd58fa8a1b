"""Benchmark: the grouped quantized GEMM against a per-expert loop of the dense quantized dot (issue 22).

    .venv/bin/python bench/grouped_dot.py              # 2048 tokens, 256 -> 512, 8 and 64 experts, nvfp4
    .venv/bin/python bench/grouped_dot.py --quick      # 512 tokens, fewer repeats (a smoke run)
    .venv/bin/python bench/grouped_dot.py --json out.json

Each entry is one jitted forward + backward (Y, dX, dW) of a layer whose tokens are split unevenly over the
experts (a fixed random routing). The loop pads each expert's tokens to the grouped path's multiple and
calls `dot_general(recipe)` once per expert, with the group sizes known when it is compiled; the grouped
path takes them as a traced array. Timings are medians of round-robin repeats after a compiling call; the
two results are compared too (the "equal" column: the bit-exactness test's claim, at these sizes).
The host's load average is recorded before and after; above bench/host_load.py's IDLE_LOAD the figures are
refused (exit 3) unless --allow-load is given.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from fp4lm.quant.grouped import grouped_dot

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import host_load  # noqa: E402  (bench/host_load.py, beside this script)
from dot import time_interleaved  # noqa: E402  (bench/dot.py: round-robin medians)
from grouped_reference import per_expert_loop  # noqa: E402  (bench/grouped_reference.py)


def routing(tokens: int, experts: int, seed: int = 0) -> tuple[int, ...]:
    """Uneven group sizes summing to ``tokens`` (each token to one expert, skewed probabilities)."""
    rng = np.random.default_rng(seed)
    probabilities = rng.dirichlet(np.ones(experts))
    return tuple(int(n) for n in np.bincount(rng.choice(experts, tokens, p=probabilities), minlength=experts))


def grouped_fwd_bwd(recipe: str):
    def run(x, w, dy, group_sizes, key):
        y, vjp = jax.vjp(lambda x, w: grouped_dot(x, w, group_sizes, recipe, key=key), x, w)
        return (y, *vjp(dy))

    return jax.jit(run)


def loop_fwd_bwd(recipe: str, sizes: tuple[int, ...]):
    """The per-expert loop the bit-exactness test proves equal (bench/grouped_reference.py)."""

    def run(x, w, dy, group_sizes, key):
        del group_sizes  # the loop's sizes are static
        return per_expert_loop(recipe, x, w, dy, sizes, key)

    return jax.jit(run)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="512 tokens and 3 repeats")
    parser.add_argument("--tokens", type=int, default=None, help="tokens (default 2048, 512 with --quick)")
    parser.add_argument("--d-in", type=int, default=256)
    parser.add_argument("--d-out", type=int, default=512)
    parser.add_argument("--experts", default="8,64", help="comma-separated expert counts")
    parser.add_argument("--recipe", default="nvfp4")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per entry (default 7; 3 quick)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    host_load.add_allow_load_flag(parser)
    args = parser.parse_args(argv)
    tokens = args.tokens or (512 if args.quick else 2048)
    repeats = args.repeats or (3 if args.quick else 7)

    rows = []
    load_before = host_load.load_average()
    for experts in (int(e) for e in args.experts.split(",") if e):
        sizes = routing(tokens, experts)
        keys = jax.random.split(jax.random.key(0), 3)
        x = jax.random.normal(keys[0], (tokens, args.d_in), jnp.bfloat16)
        w = (jax.random.normal(keys[1], (experts, args.d_in, args.d_out)) * args.d_in**-0.5).astype(jnp.bfloat16)
        dy = jax.random.normal(keys[2], (tokens, args.d_out), jnp.bfloat16)
        inputs = (x, w, dy, jnp.asarray(sizes, jnp.int32), jax.random.key(1))
        fns = {"grouped": grouped_fwd_bwd(args.recipe), "loop": loop_fwd_bwd(args.recipe, sizes)}
        seconds = time_interleaved(fns, inputs, repeats)
        equal = all(  # at these sizes and XLA's full optimisation too, not only the test's
            np.array_equal(np.asarray(g, np.float32), np.asarray(e, np.float32))
            for g, e in zip(fns["grouped"](*inputs), fns["loop"](*inputs), strict=True)
        )
        (grouped_wall, grouped_cpu), (loop_wall, loop_cpu) = seconds["grouped"], seconds["loop"]
        rows.append(
            {
                "experts": experts,
                "largest_group": max(sizes),
                "empty_groups": sizes.count(0),
                "grouped_seconds": grouped_wall,
                "loop_seconds": loop_wall,
                "ratio_grouped_to_loop": grouped_wall / loop_wall,
                "cpu_ratio_grouped_to_loop": grouped_cpu / loop_cpu,
                "bit_equal": equal,
            }
        )
    load_after = host_load.load_average()
    device = jax.devices()[0]
    result = {
        "benchmark": "grouped GEMM forward+backward vs a per-expert loop of dense quantized dots",
        "recipe": args.recipe,
        "shape": {"tokens": tokens, "d_in": args.d_in, "d_out": args.d_out},
        "dtype": "bfloat16",
        "repeats": repeats,
        "statistic": "median",
        "device": f"{device.platform}:{device.device_kind}",
        "rows": rows,
        "load_average_before": load_before,
        "load_average_after": load_after,
    }
    print(
        f"grouped vs loop, {args.recipe}, {tokens} tokens, {args.d_in} -> {args.d_out}, bf16 inputs, median of "
        f"{repeats}, {result['device']}, {host_load.describe(load_before, load_after)}"
    )
    result["idle"] = host_load.refuse_unless_idle([load_before, load_after], allow_load=args.allow_load)
    if not result["idle"]:
        print(host_load.LOADED_MARK)
    print("| experts | largest group | empty groups | grouped ms | loop ms | grouped / loop | (CPU time) | equal |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    for row in rows:
        print(
            f"| {row['experts']} | {row['largest_group']} | {row['empty_groups']} | {row['grouped_seconds'] * 1e3:.1f} "
            f"| {row['loop_seconds'] * 1e3:.1f} | {row['ratio_grouped_to_loop']:.2f}x "
            f"| {row['cpu_ratio_grouped_to_loop']:.2f}x | {'bit for bit' if row['bit_equal'] else 'NO'} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
