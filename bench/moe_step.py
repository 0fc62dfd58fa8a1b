"""Benchmark: the MoE training step, nvfp4 against bf16, on the CPU MoE default (issue 22's goal: at most 1.3x).

    .venv/bin/python bench/moe_step.py              # bf16 and nvfp4, 7 repeats
    .venv/bin/python bench/moe_step.py --quick      # 3 repeats
    .venv/bin/python bench/moe_step.py --dense      # the dense default's ratio too, measured in the same run
    .venv/bin/python bench/moe_step.py --json out.json

The model is configs/moe.yaml when it exists, else configs/default.yaml with the MoE shape of `MOE_SHAPE`
(4 layers, d_model 128, 8 experts top-2 of width 128, one shared expert, the first block dense). The step
is the trainer's own (bench/train_step.py's `Entry`: forward, backward, AdamW, every linear layer under the
recipe but the config's bf16 last layers), timed round-robin over the recipes after a compiling call.
On CPU the bf16 experts run the same tiled grouped GEMM as nvfp4, with nothing quantized (fp4lm.quant.grouped:
`jax.lax.ragged_dot` would run every expert on every token there), so the ratio is that of the quantization.
The host's load average is recorded around the timing; above bench/host_load.py's IDLE_LOAD the figures are
refused (exit 3) unless --allow-load is given.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import jax

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import host_load  # noqa: E402  (bench/host_load.py, beside this script)
from train_step import GOAL_STEP_RATIO, Entry, time_round_robin  # noqa: E402

MOE_SHAPE = (
    "model.num_experts=8",
    "model.experts_per_token=2",
    "model.moe_mlp_dim=128",
    "model.num_shared_experts=1",
    "model.first_dense_layers=1",
)
RECIPES = ("bf16", "nvfp4")


def moe_config() -> tuple[str, tuple[str, ...]]:
    """(config name, overrides): configs/moe.yaml as it is, or the default config given the MoE shape."""
    if (ROOT / "configs" / "moe.yaml").exists():
        return "moe", ()
    return "default", MOE_SHAPE


def describe(config) -> str:
    m = config.model
    return (
        f"{m.num_layers} layers, d_model {m.d_model}, {m.num_experts} experts top-{m.experts_per_token} of width "
        f"{m.resolved_moe_mlp_dim}, {m.num_shared_experts} shared, first {m.first_dense_layers} dense, batch "
        f"{config.train.batch_size} x {config.data.seq_len} tokens, bf16 last layers "
        f"{config.precision.bf16_last_layers}"
    )


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 repeats")
    parser.add_argument("--repeats", type=int, default=None, help="timed steps per recipe (default 7; 3 quick)")
    parser.add_argument("--dense", action="store_true", help="also time the dense default, in the same rounds")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    host_load.add_allow_load_flag(parser)
    args = parser.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 7)
    name, overrides = moe_config()
    entries = {("moe", recipe): Entry(name, recipe, extra_overrides=overrides) for recipe in RECIPES}
    if args.dense:
        entries |= {("dense", recipe): Entry("default", recipe) for recipe in RECIPES}
    load_before = host_load.load_average()
    seconds = time_round_robin(entries, repeats)
    load_after = host_load.load_average()
    device = jax.devices()[0]
    rows = []
    for model in dict.fromkeys(model for model, _ in entries):
        (bf16_wall, bf16_cpu), (nvfp4_wall, nvfp4_cpu) = seconds[(model, "bf16")], seconds[(model, "nvfp4")]
        rows.append(
            {
                "model": model,
                "shape": describe(entries[(model, "bf16")].config) if model == "moe" else "configs/default.yaml",
                "bf16_step_seconds": bf16_wall,
                "nvfp4_step_seconds": nvfp4_wall,
                "step_ratio": nvfp4_wall / bf16_wall,
                "cpu_ratio": nvfp4_cpu / bf16_cpu,
            }
        )
    result = {
        "benchmark": "MoE training step, nvfp4 vs bf16",
        "config": f"configs/{name}.yaml" + (f" with {' '.join(overrides)}" if overrides else ""),
        "device": f"{device.platform}:{device.device_kind}",
        "repeats": repeats,
        "statistic": "median",
        "rows": rows,
        "load_average_before": load_before,
        "load_average_after": load_after,
    }
    print(
        f"MoE train step, nvfp4 / bf16, median of {repeats}, {result['device']}, "
        f"{host_load.describe(load_before, load_after)}\nconfig: {result['config']}"
    )
    result["idle"] = host_load.refuse_unless_idle([load_before, load_after], allow_load=args.allow_load)
    if not result["idle"]:
        print(host_load.LOADED_MARK)
    print("| model | bf16 step ms | nvfp4 step ms | nvfp4 / bf16 | (CPU time) |")
    print("|---|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['model']} | {row['bf16_step_seconds'] * 1e3:.0f} | {row['nvfp4_step_seconds'] * 1e3:.0f} "
            f"| {row['step_ratio']:.2f}x | {row['cpu_ratio']:.2f}x |"
        )
    moe = rows[0]
    met = "met" if moe["step_ratio"] <= GOAL_STEP_RATIO else "not met"
    print(f"\nMoE nvfp4 / bf16: {moe['step_ratio']:.2f}x (goal {GOAL_STEP_RATIO}x: {met})")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
