"""Benchmark: sampling tokens/s with the KV cache (fp4lm.model.generate) against a full window per token.

    .venv/bin/python bench/sample.py            # context 512, 4 blocks, d_model 256, nvfp4
    .venv/bin/python bench/sample.py --quick    # context 64, 2 blocks, d_model 64
    .venv/bin/python bench/sample.py --json out.json

The generator runs a randomly initialised model (the speed does not depend on training) greedily from an
8-token prompt until the context is full. The cache-free figure is what a token would cost without the cache:
the model's plain jitted call over the whole window (seq_len positions), once per new token. Timing: a first run
that compiles (not counted), then the wall time of a second run; tokens/s = new tokens / seconds, and the
cached / cache-free ratio from the same run. With the cache a token costs one position's work instead of a
window's, so the ratio grows with the context. The host's load average is recorded (bench/host_load.py):
figures from a busy host are refused (exit 3) unless --allow-load is given, and are then marked loaded.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "bench"))

import host_load  # noqa: E402  (bench/host_load.py, beside this script)
import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from fp4lm.config import ModelConfig  # noqa: E402
from fp4lm.model import Llama  # noqa: E402
from fp4lm.model.generate import generate  # noqa: E402
from fp4lm.quant import Policy  # noqa: E402

FULL = {"seq_len": 512, "layers": 4, "d_model": 256, "recipe": "nvfp4"}
QUICK = {"seq_len": 64, "layers": 2, "d_model": 64, "recipe": "nvfp4"}
VOCAB = 256
PROMPT = np.arange(1, 9, dtype=np.int32)


def timed(run) -> tuple[list[int], float]:
    run()  # compiles
    start = time.perf_counter()
    tokens = run()
    return tokens, time.perf_counter() - start


def full_windows(graphdef: nnx.GraphDef, params, window_1S: np.ndarray, count: int):
    """A function that runs the model's plain call over `window_1S` `count` times (waiting for each result, as a
    generator must before it chooses the token): the cost of `count` tokens without a cache."""
    forward = jax.jit(lambda params, window_1S: nnx.merge(graphdef, params)(window_1S))

    def run() -> list[int]:
        for _ in range(count):
            forward(params, window_1S).block_until_ready()
        return []

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a short context and a small model")
    parser.add_argument("--json", type=pathlib.Path, help="write the figures here")
    host_load.add_allow_load_flag(parser)
    args = parser.parse_args(argv)
    shape = QUICK if args.quick else FULL
    d_model, seq_len = shape["d_model"], shape["seq_len"]
    cfg = ModelConfig(num_layers=shape["layers"], d_model=d_model, num_heads=4, num_kv_heads=2, mlp_dim=3 * d_model)
    policy = Policy(shape["recipe"], num_layers=cfg.num_layers)
    graphdef, params = nnx.split(Llama(cfg, VOCAB, policy, rngs=nnx.Rngs(0)), nnx.Param)
    params = nnx.to_pure_dict(params)
    options = {"max_tokens": seq_len - len(PROMPT), "seq_len": seq_len, "vocab_limit": VOCAB}

    window_1S = np.zeros((1, seq_len), np.int32)
    window_1S[0, : len(PROMPT)] = PROMPT
    load_before = host_load.load_average()
    _, free_s = timed(full_windows(graphdef, params, window_1S, options["max_tokens"]))
    _, cached_s = timed(lambda: generate(graphdef, params, PROMPT, **options))
    load_after = host_load.load_average()
    idle = host_load.refuse_unless_idle([load_before, load_after], allow_load=args.allow_load)

    new = options["max_tokens"]
    figures = {
        "shape": shape,
        "new_tokens": new,
        "cache_free_tokens_per_s": new / free_s,
        "cached_tokens_per_s": new / cached_s,
        "speedup": free_s / cached_s,
        "idle": idle,
        "load_average": {"before": load_before, "after": load_after},
    }
    if not idle:
        print(host_load.LOADED_MARK)
    print(f"context {seq_len}, {cfg.num_layers} blocks, d_model {d_model}, {shape['recipe']}: {new} greedy tokens")
    print(f"  full window {figures['cache_free_tokens_per_s']:9.1f} tokens/s (the forward pass alone)")
    print(f"  KV cache    {figures['cached_tokens_per_s']:9.1f} tokens/s   ({figures['speedup']:.2f}x)")
    print(host_load.describe(load_before, load_after))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
