"""Benchmark: compile time and step time of the training step, scanned (model.scan_layers) vs unrolled blocks.

    .venv/bin/python bench/scan_layers.py                 # 4, 16 and 32 blocks, nvfp4
    .venv/bin/python bench/scan_layers.py --quick         # 2 and 4 blocks, bf16, a narrow model
    .venv/bin/python bench/scan_layers.py --json out.json
    .venv/bin/python bench/scan_layers.py --max-unrolled 16   # the unrolled step up to 16 blocks only

The step is forward + backward of the next-token loss (jax.value_and_grad) of a Llama of the given depth,
with a stochastic-rounding key, as the trainer runs it; the optimizer update is left out (it does not
depend on the scan). Compile time: `jit(step).lower(...).compile()` wall seconds, the figure the scan is
for: unrolled it grows with depth (one copy of the block per layer in the program), scanned it should stay
nearly flat. Step time: the median of a few calls after the compile. Each depth reports scanned / unrolled
ratios from the same run. Each configuration compiles in a fresh process (an empty compilation cache; a
compile that runs out of memory is reported as killed, and the others still run), which also reports its
peak resident memory. The host's load average is recorded (bench/host_load.py): figures from a busy
host are refused (exit 3) unless --allow-load is given, and are then marked loaded.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import resource
import signal
import statistics
import subprocess
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


def measure_in_child(depth: int, scan: bool, quick: bool) -> dict:
    """`measure` in a fresh process: its compile starts from an empty cache, and a configuration whose compile
    runs out of memory (the unrolled 32-block nvfp4 step takes more than 24 GB on XLA:CPU) is reported as
    such instead of ending the benchmark."""
    command = [sys.executable, __file__, "--measure", str(depth), "scanned" if scan else "unrolled"]
    done = subprocess.run([*command, *(["--quick"] if quick else [])], capture_output=True, text=True)
    if done.returncode != 0:
        killed = done.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL)
        reason = "killed (out of memory)" if killed else f"failed: {done.stderr.strip().splitlines()[-1:]}"
        return {"depth": depth, "scan": scan, "error": reason}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cell(row: dict, key: str, unit: str = "s") -> str:
    return row["error"] if "error" in row else f"{row[key]:.2f}{unit}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 and 4 blocks of a narrow bf16 model")
    parser.add_argument("--json", type=pathlib.Path, help="write the rows here")
    parser.add_argument(
        "--max-unrolled", type=int, default=None, help="measure the unrolled step only up to this many blocks"
    )
    parser.add_argument("--measure", nargs=2, metavar=("DEPTH", "unrolled|scanned"), help=argparse.SUPPRESS)
    host_load.add_allow_load_flag(parser)
    args = parser.parse_args(argv)
    shape = QUICK if args.quick else FULL
    if args.measure:  # the child of measure_in_child
        depth, mode = int(args.measure[0]), args.measure[1]
        row = measure(depth, mode == "scanned", shape)
        row["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(json.dumps(row))
        return 0
    load_before = host_load.load_average()
    rows = []
    for depth in shape["depths"]:
        skip_unrolled = args.max_unrolled is not None and depth > args.max_unrolled
        unrolled = (
            {"depth": depth, "scan": False, "error": "not measured (--max-unrolled)"}
            if skip_unrolled
            else measure_in_child(depth, False, args.quick)
        )
        scanned = measure_in_child(depth, True, args.quick)
        row = {"depth": depth, "unrolled": unrolled, "scanned": scanned}
        if "error" not in unrolled and "error" not in scanned:
            row["compile_ratio"] = scanned["compile_s"] / unrolled["compile_s"]
            row["step_ratio"] = scanned["step_s"] / unrolled["step_s"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    load_after = host_load.load_average()
    idle = host_load.refuse_unless_idle([load_before, load_after], allow_load=args.allow_load)
    if not idle:
        print(host_load.LOADED_MARK)
    print(f"recipe {shape['recipe']}, d_model {shape['d_model']}, batch {shape['batch']} x seq {shape['seq']}")
    print(f"{'blocks':>6}  {'compile unrolled':>22}  {'compile scanned':>15}  {'ratio':>5}  {'step ratio':>10}")
    for row in rows:
        ratios = (
            f"{row['compile_ratio']:>5.2f}  {row['step_ratio']:>10.2f}"
            if "compile_ratio" in row
            else f"{'-':>5}  {'-':>10}"
        )
        unrolled, scanned = _cell(row["unrolled"], "compile_s"), _cell(row["scanned"], "compile_s")
        print(f"{row['depth']:>6}  {unrolled:>22}  {scanned:>15}  {ratios}")
    print(host_load.describe(load_before, load_after))
    if args.json:
        payload = {"shape": {**shape, "depths": list(shape["depths"])}, "rows": rows, "idle": idle}
        payload["load_average"] = {"before": load_before, "after": load_after}
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    jnp.zeros(())  # initialise the backend before timing
    raise SystemExit(main())
