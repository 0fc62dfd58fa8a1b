"""Benchmark: one full training step (forward, backward, AdamW) per precision recipe, as a ratio to bf16.

    .venv/bin/python bench/train_step.py              # default + cpu-large configs, recipes bf16,fp8,mxfp8,mxfp4,nvfp4
    .venv/bin/python bench/train_step.py --quick      # bf16 and nvfp4 only, fewer repeats
    .venv/bin/python bench/train_step.py --json out.json

The step is the trainer's own jitted `train_step` (fp4lm.train.step) on the model shape of each config,
with every linear layer under the recipe (the config's bf16 first/last layers kept). Timing: after a
warm-up call that compiles, the median over repeats of one step, taken round-robin over recipes so machine
load hits them alike; wall and process-CPU seconds (CPU time is steadier on a shared machine).
The host's load average is recorded around each config's timing; above bench/host_load.py's IDLE_LOAD the
figures are refused (exit 3) unless --allow-load is given, and then the table says "loaded".
Memory: XLA's temporary buffer size of the compiled step (`compiled.memory_analysis()`), i.e. the peak
of everything the step allocates besides its inputs and outputs, activations saved for backward included;
and, separately, the bytes the forward pass saves for the backward pass (the residuals of `jax.vjp`, found
with `jax.eval_shape`, before XLA fuses or rematerialises anything). A recipe changes only the linear
layers' share of it: NVFP4 keeps 4.5-bit operand copies instead of bf16 ones (3.6x smaller per matmul,
tests/quant/test_dot_transforms.py). So both memory figures are taken twice: as configured (no remat), and
under `model.remat=save_matmul_operands`, the same policy for every recipe — each projection keeps its
operands as its recipe stores them and everything else is recomputed — where the recipe's share shows.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import jax
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "bench"))

import host_load  # noqa: E402  (bench/host_load.py, beside this script)

from fp4lm.config import load_config  # noqa: E402
from fp4lm.flops import training_flops_per_step  # noqa: E402
from fp4lm.quant import Policy  # noqa: E402
from fp4lm.train import model_setup  # noqa: E402
from fp4lm.train.loss_scale import LossScaler  # noqa: E402
from fp4lm.train.optimizer import build_optimizer, learning_rate_schedule  # noqa: E402
from fp4lm.train.state import init_train_state  # noqa: E402
from fp4lm.train.step import cross_entropy, make_train_step, model_apply, model_apply_routed  # noqa: E402

CONFIGS = ("default", "cpu-large")
ALL_RECIPES = ("bf16", "fp8", "mxfp8", "mxfp4", "nvfp4")
QUICK_RECIPES = ("bf16", "nvfp4")
GOAL_STEP_RATIO = 1.3
GOAL_MEMORY_RATIO = 0.7
REMAT_FOR_MEMORY = "save_matmul_operands"


class Entry:
    """A compiled train step of one (config, recipe) and the state it runs on."""

    def __init__(self, config_name: str, recipe: str, remat: str = "none", extra_overrides: tuple[str, ...] = ()):
        overrides = [f"precision.recipe={recipe}", "precision.bf16_after=null", f"model.remat={remat}"]
        overrides += list(extra_overrides)  # e.g. the MoE shape on the default config (bench/moe_step.py)
        self.config = load_config(ROOT / "configs" / f"{config_name}.yaml", overrides)
        policy = Policy.from_config(self.config)
        c = self.config
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
        )
        tokens = np.random.default_rng(0).integers(0, vocab, (c.train.batch_size, c.data.seq_len + 1), np.int32)
        self.batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
        start = time.perf_counter()
        self.compiled = jax.jit(step, donate_argnums=0).lower(self.state, self.batch).compile()
        self.compile_seconds = time.perf_counter() - start
        self.temp_bytes = self.compiled.memory_analysis().temp_size_in_bytes
        apply = model_apply(model_setup.graphdef_of(model))
        self.saved_bytes = saved_for_backward_bytes(
            lambda params: cross_entropy(
                apply(params, self.batch["inputs"], quant_key=self.state.quant_key()), self.batch["targets"]
            ),
            self.state.params,
        )
        self.tokens_per_step = c.train.batch_size * c.data.seq_len
        self.flops_per_step = training_flops_per_step(c.model, vocab, c.data.seq_len, c.train.batch_size).total

    def run(self) -> None:
        self.state, metrics = self.compiled(self.state, self.batch)
        jax.block_until_ready(metrics)


def saved_for_backward_bytes(loss_fn, params) -> int:
    """Bytes of the residuals `jax.vjp(loss_fn, params)` keeps for the backward pass (shapes only; no compute)."""
    vjp_fn = jax.eval_shape(lambda p: jax.vjp(loss_fn, p)[1], params)
    return sum(
        leaf.size * leaf.dtype.itemsize
        for leaf in jax.tree.leaves(vjp_fn)
        if jax.dtypes.issubdtype(leaf.dtype, np.number) or leaf.dtype == bool
    )


def time_round_robin(entries: dict, repeats: int) -> dict:
    for entry in entries.values():
        entry.run()  # warm-up (already compiled)
    wall = {key: [] for key in entries}
    cpu = {key: [] for key in entries}
    for _ in range(repeats):
        for key, entry in entries.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            entry.run()
            wall[key].append(time.perf_counter() - start)
            cpu[key].append(time.process_time() - start_cpu)
    return {key: (statistics.median(wall[key]), statistics.median(cpu[key])) for key in entries}


def describe(config) -> str:
    m = config.model
    return (
        f"{m.num_layers} layers, d_model {m.d_model}, mlp {m.mlp_dim}, vocab {config.data.vocab_size}, "
        f"batch {config.train.batch_size} x {config.data.seq_len} tokens, bf16 last layers "
        f"{config.precision.bf16_last_layers}"
    )


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="bf16 and nvfp4 only, 3 repeats")
    parser.add_argument("--recipes", default=None, help="comma-separated recipes (bf16 is always included)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="configs/<name>.yaml to benchmark")
    parser.add_argument("--repeats", type=int, default=None, help="timed steps per recipe (default 7; 3 quick)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    host_load.add_allow_load_flag(parser)
    args = parser.parse_args(argv)
    recipes = args.recipes.split(",") if args.recipes else list(QUICK_RECIPES if args.quick else ALL_RECIPES)
    recipes = ["bf16"] + [r for r in recipes if r and r != "bf16"]
    repeats = args.repeats or (3 if args.quick else 7)
    device = jax.devices()[0]
    results = {
        "benchmark": "training step (forward + backward + AdamW)",
        "device": f"{device.platform}:{device.device_kind}",
        "repeats": repeats,
        "statistic": "median",
        "configs": [],
    }
    print(
        f"train step per recipe, median of {repeats}, {results['device']}; goals: nvfp4/bf16 step time "
        f"<= {GOAL_STEP_RATIO}x, temp memory <= {GOAL_MEMORY_RATIO}x"
    )
    for config_name in [c for c in args.configs.split(",") if c]:
        entries = {recipe: Entry(config_name, recipe) for recipe in recipes}
        load_before = host_load.load_average()
        seconds = time_round_robin(entries, repeats)
        load_after = host_load.load_average()
        remat_entries = {recipe: Entry(config_name, recipe, REMAT_FOR_MEMORY) for recipe in recipes}
        base_wall, base_cpu = seconds["bf16"]
        base_memory = entries["bf16"].temp_bytes
        rows = []
        for recipe, entry in entries.items():
            wall, cpu = seconds[recipe]
            rows.append(
                {
                    "recipe": recipe,
                    "step_seconds": wall,
                    "step_cpu_seconds": cpu,
                    "tokens_per_sec": entry.tokens_per_step / wall,
                    "tflops_per_sec": entry.flops_per_step / wall / 1e12,
                    "step_ratio_to_bf16": wall / base_wall,
                    "cpu_ratio_to_bf16": cpu / base_cpu,
                    "temp_bytes": entry.temp_bytes,
                    "temp_ratio_to_bf16": entry.temp_bytes / base_memory,
                    "saved_for_backward_bytes": entry.saved_bytes,
                    "saved_ratio_to_bf16": entry.saved_bytes / entries["bf16"].saved_bytes,
                    "remat_temp_bytes": remat_entries[recipe].temp_bytes,
                    "remat_temp_ratio_to_bf16": remat_entries[recipe].temp_bytes / remat_entries["bf16"].temp_bytes,
                    "remat_saved_bytes": remat_entries[recipe].saved_bytes,
                    "remat_saved_ratio_to_bf16": remat_entries[recipe].saved_bytes / remat_entries["bf16"].saved_bytes,
                    "compile_seconds": entry.compile_seconds,
                }
            )
        config = entries["bf16"].config
        loads = {"load_average_before": load_before, "load_average_after": load_after}
        results["configs"].append({"name": config_name, "shape": describe(config), "rows": rows, **loads})
        print(f"\n**{config_name}** ({describe(config)}; {host_load.describe(load_before, load_after)})\n")
        idle = host_load.refuse_unless_idle([load_before, load_after], allow_load=args.allow_load)
        results["idle"] = results.get("idle", True) and idle
        if not idle:
            print(host_load.LOADED_MARK)
        print(
            "| recipe | step ms | tokens/s | step / bf16 | (CPU time) | temp MiB | temp / bf16 | saved MiB "
            "| saved / bf16 | compile s |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for row in rows:
            print(
                f"| {row['recipe']} | {row['step_seconds'] * 1e3:.0f} | {row['tokens_per_sec']:,.0f} | "
                f"{row['step_ratio_to_bf16']:.2f}x | {row['cpu_ratio_to_bf16']:.2f}x | "
                f"{row['temp_bytes'] / 2**20:.1f} | {row['temp_ratio_to_bf16']:.2f}x | "
                f"{row['saved_for_backward_bytes'] / 2**20:.1f} | {row['saved_ratio_to_bf16']:.2f}x | "
                f"{row['compile_seconds']:.0f} |"
            )
        print(f"\nMemory with `model.remat={REMAT_FOR_MEMORY}`:\n")
        print("| recipe | temp MiB | temp / bf16 | saved MiB | saved / bf16 |")
        print("|---|---:|---:|---:|---:|")
        for row in rows:
            print(
                f"| {row['recipe']} | {row['remat_temp_bytes'] / 2**20:.1f} | {row['remat_temp_ratio_to_bf16']:.2f}x | "
                f"{row['remat_saved_bytes'] / 2**20:.1f} | {row['remat_saved_ratio_to_bf16']:.2f}x |"
            )
        nvfp4 = next((row for row in rows if row["recipe"] == "nvfp4"), None)
        if nvfp4:
            step_ok = "met" if nvfp4["step_ratio_to_bf16"] <= GOAL_STEP_RATIO else "not met"
            memory_ok = "met" if nvfp4["temp_ratio_to_bf16"] <= GOAL_MEMORY_RATIO else "not met"
            print(
                f"\nnvfp4 vs bf16: step time {nvfp4['step_ratio_to_bf16']:.2f}x (goal {GOAL_STEP_RATIO}x: "
                f"{step_ok}), temp memory {nvfp4['temp_ratio_to_bf16']:.2f}x (goal {GOAL_MEMORY_RATIO}x: {memory_ok}); "
                f"with remat {REMAT_FOR_MEMORY}: temp {nvfp4['remat_temp_ratio_to_bf16']:.2f}x, saved for backward "
                f"{nvfp4['remat_saved_ratio_to_bf16']:.2f}x"
            )
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
