"""Benchmark: fused attention (model.attention) against the plain attention it replaced, in a training step.

    .venv/bin/python bench/attention.py              # sequence lengths 512 and 2048, 7 repeats
    .venv/bin/python bench/attention.py --quick      # the same lengths, 3 repeats
    .venv/bin/python bench/attention.py --json out.json

For each sequence length two trainer steps (fp4lm.train.step, jitted as the trainer jits them) of the default
config's model in bf16, with the same tokens per step (16 x 128, so batch 4 at 512 and 1 at 2048): one with
`model.attention` resolved here (auto: xla on a CPU, cudnn on a GPU that runs it), one with the "reference"
implementation, the whole [B, N, T, S] score matrix as fp4lm computed it before (fp4lm.model.attention; not a
config choice, set here directly). Step time: median over repeats, round-robin, the fused step's time over the
reference's. Memory: XLA's temporary buffers of each compiled step (`memory_analysis()`): the reference's
grow with T x S, the fused step's do not (on a CPU the xla implementation holds one block of queries' scores
at a time). It need not be faster on a CPU. The host's load average is recorded and a busy host's figures
are refused (exit 3) unless --allow-load, which marks the table loaded (bench/host_load.py).
"""

from __future__ import annotations

import argparse
import dataclasses
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
from fp4lm.model.attention import cudnn_unsupported_reason  # noqa: E402
from fp4lm.quant import Policy  # noqa: E402
from fp4lm.train import model_setup  # noqa: E402
from fp4lm.train.loss_scale import LossScaler  # noqa: E402
from fp4lm.train.optimizer import build_optimizer, learning_rate_schedule  # noqa: E402
from fp4lm.train.state import init_train_state  # noqa: E402
from fp4lm.train.step import make_train_step, model_apply_routed  # noqa: E402

CONFIG = "default"
LENGTHS = (512, 2048)
TOKENS_PER_STEP = 16 * 128  # the default config's batch x sequence


class Step:
    """A compiled bf16 train step of the default model at `length` tokens per sequence, attention `attention`."""

    def __init__(self, length: int, attention: str):
        overrides = [
            "precision.recipe=bf16",
            "precision.bf16_after=null",
            f"data.seq_len={length}",
            f"train.batch_size={max(1, TOKENS_PER_STEP // length)}",
        ]
        c = load_config(ROOT / "configs" / f"{CONFIG}.yaml", overrides)
        policy = Policy.from_config(c)
        c = dataclasses.replace(c, model=dataclasses.replace(c.model, attention=attention))  # type: ignore[arg-type]
        vocab = c.data.vocab_size or 512
        model = model_setup.abstract_model(c, vocab, policy)
        optimizer = build_optimizer(c.optimizer, c.train.steps)
        scaler = LossScaler.from_config(c.loss_scale, recipe_is_quantized=False)
        self.state = jax.jit(
            lambda: init_train_state(model_setup.init_params(c, vocab, policy), optimizer, scaler, 0)
        )()
        step = make_train_step(
            model_apply_routed(model_setup.graphdef_of(model)),
            optimizer,
            scaler,
            learning_rate_schedule(c.optimizer, c.train.steps),
            1,
        )
        tokens = np.random.default_rng(0).integers(0, vocab, (c.train.batch_size, length + 1), np.int32)
        self.batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
        self.compiled = jax.jit(step, donate_argnums=0).lower(self.state, self.batch).compile()
        memory = self.compiled.memory_analysis()
        self.temp_bytes = memory.temp_size_in_bytes if memory is not None else 0
        self.config = c

    def run(self) -> None:
        self.state, metrics = self.compiled(self.state, self.batch)
        jax.block_until_ready(metrics)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 repeats")
    parser.add_argument("--repeats", type=int, default=None, help="timed steps each (default 7; 3 quick)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    host_load.add_allow_load_flag(parser)
    args = parser.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 7)
    device = jax.devices()[0]
    head_dim = load_config(ROOT / "configs" / f"{CONFIG}.yaml").model.resolved_head_dim
    fused = "xla" if cudnn_unsupported_reason(head_dim=head_dim) else "cudnn"  # what model.attention=auto runs
    results = {"benchmark": "fused attention", "device": f"{device.platform}:{device.device_kind}", "rows": []}
    steps = {}
    for length in LENGTHS:
        steps[(length, "fused")] = Step(length, fused)
        steps[(length, "reference")] = Step(length, "reference")
    load_before = host_load.load_average()
    seconds = round_robin.median_seconds(steps, repeats)
    load_after = host_load.load_average()
    c = steps[(LENGTHS[0], "fused")].config
    print(
        f"fused attention ({fused}) vs the whole score matrix, {CONFIG} config in bf16 ({c.model.num_layers} layers, "
        f"d_model {c.model.d_model}, {c.model.num_heads} heads), {TOKENS_PER_STEP} tokens per step, median of "
        f"{repeats}, {results['device']}; {host_load.describe(load_before, load_after)}\n"
    )
    idle = host_load.refuse_unless_idle([load_before, load_after], allow_load=args.allow_load)
    if not idle:
        print(host_load.LOADED_MARK)
    print(f"| seq | batch | reference step ms | {fused} step ms | time {fused}/reference | temp MiB reference "
          f"| temp MiB {fused} | temp saved |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for length in LENGTHS:
        reference, fused_step = steps[(length, "reference")], steps[(length, "fused")]
        row = {
            "seq_len": length,
            "batch": fused_step.config.train.batch_size,
            "implementation": fused,
            "reference_step_seconds": seconds[(length, "reference")],
            "fused_step_seconds": seconds[(length, "fused")],
            "time_ratio": seconds[(length, "fused")] / seconds[(length, "reference")],
            "reference_temp_bytes": reference.temp_bytes,
            "fused_temp_bytes": fused_step.temp_bytes,
        }
        results["rows"].append(row)
        print(
            f"| {length} | {row['batch']} | {row['reference_step_seconds'] * 1e3:.0f} | "
            f"{row['fused_step_seconds'] * 1e3:.0f} | {row['time_ratio']:.2f}x | "
            f"{reference.temp_bytes / 2**20:.1f} | {fused_step.temp_bytes / 2**20:.1f} | "
            f"{reference.temp_bytes / max(fused_step.temp_bytes, 1):.2f}x |"
        )
    results.update(load_average_before=load_before, load_average_after=load_after, idle=idle)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
