"""Benchmark: compile time and step time of the training step, scanned (model.scan_layers) vs unrolled blocks.

    .venv/bin/python bench/scan_layers.py                 # 4, 16 and 32 blocks, nvfp4
    .venv/bin/python bench/scan_layers.py --quick         # 2 and 4 blocks, bf16, a narrow model
    .venv/bin/python bench/scan_layers.py --json out.json

The step is forward + backward of the next-token loss (jax.value_and_grad) of a Llama of the given depth,
with a stochastic-rounding key, as the trainer runs it; the optimizer update is left out (it does not
depend on the scan). Compile time: `jit(step).lower(...).compile()` wall seconds, the figure the scan is
for: unrolled it grows with depth (one copy of the block per layer in the program), scanned it should stay
nearly flat. Step time: the median of a few calls after the compile. Each depth reports scanned / unrolled
ratios from the same run. The host's load average is recorded (bench/host_load.py): figures from a busy
host are refused (exit 3) unless --allow-load is given, and are then marked loaded.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "bench"))

import host_load  # noqa: E402  (bench/host_load.py, beside this script)
import optax  # noqa: E402
from flax import nnx  # noqa: E402

from fp4lm.config import ModelConfig  # noqa: E402
from fp4lm.model import Llama  # noqa: E402
from fp4lm.quant import Policy  # noqa: E402

FULL = {"depths": (4, 16, 32), "recipe": "nvfp4", "d_model": 128, "seq": 128, "batch": 4, "repeats": 5}
QUICK = {"depths": (2, 4), "recipe": "bf16", "d_model": 32, "seq": 32, "batch": 2, "repeats": 2}
VOCAB = 256


def measure(depth: int, scan: bool, shape: dict) -> dict:
    d_model = shape["d_model"]
    cfg = ModelConfig(
        num_layers=depth, d_model=d_model, num_heads=2, num_kv_heads=2, mlp_dim=2 * d_model, scan_layers=scan
    )
    policy = Policy(shape["recipe"], num_layers=depth)
    graphdef, params = nnx.split(Llama(cfg, VOCAB, policy, rngs=nnx.Rngs(0)))
    tokens = jax.random.randint(jax.random.key(1), (shape["batch"], shape["seq"] + 1), 0, VOCAB)

    def step(params, tokens, key):
        def loss(params):
            logits = nnx.merge(graphdef, params)(tokens[:, :-1], quant_key=key)
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

        return jax.value_and_grad(loss)(params)

    start = time.perf_counter()
    compiled = jax.jit(step).lower(params, tokens, jax.random.key(2)).compile()
    compile_s = time.perf_counter() - start
    times = []
    for i in range(shape["repeats"] + 1):  # the first call is a warm-up
        start = time.perf_counter()
        jax.block_until_ready(compiled(params, tokens, jax.random.key(3 + i)))
        times.append(time.perf_counter() - start)
    return {"depth": depth, "scan": scan, "compile_s": compile_s, "step_s": statistics.median(times[1:])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 and 4 blocks of a narrow bf16 model")
    parser.add_argument("--json", type=pathlib.Path, help="write the rows here")
    host_load.add_allow_load_flag(parser)
    args = parser.parse_args(argv)
    shape = QUICK if args.quick else FULL
    load_before = host_load.load_average()
    rows = []
    for depth in shape["depths"]:
        unrolled, scanned = measure(depth, False, shape), measure(depth, True, shape)
        rows.append(
            {
                "depth": depth,
                "unrolled": dataclasses.asdict(_Pair(unrolled["compile_s"], unrolled["step_s"])),
                "scanned": dataclasses.asdict(_Pair(scanned["compile_s"], scanned["step_s"])),
                "compile_ratio": scanned["compile_s"] / unrolled["compile_s"],
                "step_ratio": scanned["step_s"] / unrolled["step_s"],
            }
        )
    load_after = host_load.load_average()
    idle = host_load.refuse_unless_idle([load_before, load_after], allow_load=args.allow_load)
    if not idle:
        print(host_load.LOADED_MARK)
    print(f"recipe {shape['recipe']}, d_model {shape['d_model']}, batch {shape['batch']} x seq {shape['seq']}")
    print(f"{'blocks':>6}  {'compile unrolled':>16}  {'compile scanned':>15}  {'ratio':>5}  {'step ratio':>10}")
    for row in rows:
        print(
            f"{row['depth']:>6}  {row['unrolled']['compile_s']:>15.2f}s  {row['scanned']['compile_s']:>14.2f}s  "
            f"{row['compile_ratio']:>5.2f}  {row['step_ratio']:>10.2f}"
        )
    print(host_load.describe(load_before, load_after))
    if args.json:
        payload = {"shape": {**shape, "depths": list(shape["depths"])}, "rows": rows, "idle": idle}
        payload["load_average"] = {"before": load_before, "after": load_after}
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


@dataclasses.dataclass
class _Pair:
    compile_s: float
    step_s: float


if __name__ == "__main__":
    jnp.zeros(())  # initialise the backend before timing
    raise SystemExit(main())
