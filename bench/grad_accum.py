"""Benchmark: the cost of gradient accumulation, N micro-batches against one batch of the same micro-batch size.

    .venv/bin/python bench/grad_accum.py              # default config, bf16 and nvfp4, N = 4
    .venv/bin/python bench/grad_accum.py --quick      # bf16 only, fewer repeats
    .venv/bin/python bench/grad_accum.py --json out.json

For each recipe two trainer steps (fp4lm.train.step, jitted as the trainer jits them) on the default config's
model: N=1 on a batch of `train.batch_size` sequences, and `train.grad_accum_steps=N` on a batch N times as
large, so both run micro-batches of the same size. The overhead is the accumulating step's time over N times
the single step's: 1.00x means the `lax.scan` over micro-batches and the float32 gradient sums cost nothing
beyond the extra micro-batches themselves (the optimizer update, done once either way, pushes it below 1).
Memory: XLA's temporary buffers of each compiled step (`memory_analysis()`), against a step that takes the N
times larger batch in one piece: what accumulation saves. Timing: median over repeats, round-robin; the
host's load average is recorded and a busy host's figures are refused (exit 3) unless --allow-load, which
marks the table loaded (bench/host_load.py).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import jax
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "bench"))

import host_load  # noqa: E402  (bench/host_load.py, beside this script)
import round_robin  # noqa: E402  (bench/round_robin.py)

from fp4lm.config import load_config  # noqa: E402
from fp4lm.quant import Policy  # noqa: E402
from fp4lm.train import model_setup  # noqa: E402
from fp4lm.train.loss_scale import LossScaler  # noqa: E402
from fp4lm.train.optimizer import build_optimizer, learning_rate_schedule  # noqa: E402
from fp4lm.train.state import init_train_state  # noqa: E402
from fp4lm.train.step import make_train_step, model_apply_routed  # noqa: E402

CONFIG = "default"
RECIPES = ("bf16", "nvfp4")
QUICK_RECIPES = ("bf16",)


class Step:
    """A compiled train step of one recipe on `micro_batch * count` sequences in `count` micro-batches."""

    def __init__(self, recipe: str, micro_batch: int, count: int):
        overrides = [
            f"precision.recipe={recipe}",
            "precision.bf16_after=null",
            f"train.batch_size={micro_batch * count}",
            f"train.grad_accum_steps={count}",
        ]
        c = load_config(ROOT / "configs" / f"{CONFIG}.yaml", overrides)
        policy = Policy.from_config(c)
        vocab = c.data.vocab_size
        model = model_setup.abstract_model(c, vocab, policy)
        optimizer = build_optimizer(c.optimizer, c.train.steps)
        scaler = LossScaler.from_config(c.loss_scale, recipe_is_quantized=recipe != "bf16")
        self.state = jax.jit(
            lambda: init_train_state(model_setup.init_params(c, vocab, policy), optimizer, scaler, 0)
        )()
        step = make_train_step(
            model_apply_routed(model_setup.graphdef_of(model)),
            optimizer,
            scaler,
            learning_rate_schedule(c.optimizer, c.train.steps),
            count,
        )
        tokens = np.random.default_rng(0).integers(0, vocab, (c.train.batch_size, c.data.seq_len + 1), np.int32)
        self.batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
        self.compiled = jax.jit(step, donate_argnums=0).lower(self.state, self.batch).compile()
        self.temp_bytes = self.compiled.memory_analysis().temp_size_in_bytes
        self.config = c

    def run(self) -> None:
        self.state, metrics = self.compiled(self.state, self.batch)
        jax.block_until_ready(metrics)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="bf16 only, 3 repeats")
    parser.add_argument("--count", type=int, default=4, help="micro-batches of the accumulating step (default 4)")
    parser.add_argument("--repeats", type=int, default=None, help="timed steps each (default 7; 3 quick)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    host_load.add_allow_load_flag(parser)
    args = parser.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 7)
    count = args.count
    recipes = QUICK_RECIPES if args.quick else RECIPES
    micro_batch = load_config(ROOT / "configs" / f"{CONFIG}.yaml").train.batch_size
    device = jax.devices()[0]
    results = {"benchmark": "gradient accumulation", "device": f"{device.platform}:{device.device_kind}", "rows": []}
    steps = {}
    for recipe in recipes:
        steps[(recipe, "single")] = Step(recipe, micro_batch, 1)
        steps[(recipe, "accumulated")] = Step(recipe, micro_batch, count)
        steps[(recipe, "whole")] = Step(recipe, micro_batch * count, 1)
    load_before = host_load.load_average()
    seconds = round_robin.median_seconds(steps, repeats)
    load_after = host_load.load_average()
    c = steps[(recipes[0], "single")].config
    print(
        f"gradient accumulation, {CONFIG} config ({c.model.num_layers} layers, d_model {c.model.d_model}, "
        f"micro-batch {micro_batch} x {c.data.seq_len} tokens), N={count}, median of {repeats}, {results['device']}; "
        f"{host_load.describe(load_before, load_after)}\n"
    )
    idle = host_load.refuse_unless_idle([load_before, load_after], allow_load=args.allow_load)
    if not idle:
        print(host_load.LOADED_MARK)
    print(
        f"| recipe | N=1 step ms | N={count} step ms | overhead (N={count} / {count}x N=1) | temp MiB N={count} "
        f"| temp MiB, batch {count}x in one piece | temp saved |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for recipe in recipes:
        single, accumulated = seconds[(recipe, "single")], seconds[(recipe, "accumulated")]
        accumulated_temp = steps[(recipe, "accumulated")].temp_bytes
        whole_temp = steps[(recipe, "whole")].temp_bytes
        row = {
            "recipe": recipe,
            "single_step_seconds": single,
            "accumulated_step_seconds": accumulated,
            "overhead": accumulated / (count * single),
            "accumulated_temp_bytes": accumulated_temp,
            "whole_batch_temp_bytes": whole_temp,
        }
        results["rows"].append(row)
        print(
            f"| {recipe} | {single * 1e3:.0f} | {accumulated * 1e3:.0f} | {row['overhead']:.2f}x | "
            f"{accumulated_temp / 2**20:.1f} | {whole_temp / 2**20:.1f} | "
            f"{whole_temp / max(accumulated_temp, 1):.2f}x |"
        )
    results.update(load_average_before=load_before, load_average_after=load_after, idle=idle, count=count)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
