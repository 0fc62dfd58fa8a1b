"""The Python half of bench/device_check.sh: one stage per call, each merged into device_check.json.

    python bench/device_check.py --stage STAGE --out device_check.json [--dry-run]

Stages (the shell script runs each under its own time limit, so one that hangs loses only itself):
  versions   jax, jaxlib, the CUDA plugin, flax, optax, orbax, ...; the GPU and its compute capability;
             what differs from requirements.lock and what is missing, said precisely.
  tests      records the pytest stage (run by the shell script) from its log and exit code.
  bits       GPU vs CPU: the same inputs quantized on both, codes/scale bytes/amax compared bit for bit.
  bandwidth  the NVFP4 quantizer against a device-to-device `x * c`, with the bytes XLA's compiled
             program really reads and writes (its cost analysis) next to the ideal bytes.
  train      the trainer's own step (loss scaling, clipping, AdamW, the policy: what `fp4lm train` runs) timed for
             bf16 and emulated nvfp4: step time, tokens/s and MFU, the blocks in a layer scan
             (model.scan_layers=true: one compiled block, so compile time stays bounded as --layers grows).
  compare    `fp4lm compare --preset gpu --recipes bf16,nvfp4`, shortened to `--compare-steps` steps (the
             preset's shapes, the bundled corpus): the records and report of a real comparison in
             OUT_DIR/compare/ and each recipe's final validation loss, gap and tokens/s here. It needs the
             trainer's packages (grain, tensorboardX) and matplotlib; without them it is skipped, saying which.
  summary    prints the table.
  note       records a stage the shell script had to stop (--name, --status, --seconds).

The JSON file is rewritten atomically after every stage and after every measured item within one,
so a timeout keeps everything measured before it. --dry-run uses small shapes on whatever device
JAX has (the CPU in the test suite: tests/bench/test_device_check.py).
The train stage imports the trainer (it needs grain and tensorboardX, and is skipped, saying so, without
them); the compare stage runs `python -m fp4lm compare` in a subprocess.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import pathlib
import platform
import re
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fp4lm.jsonio import write_json_atomically  # noqa: E402  (needs only the standard library)

# What the check needs (import name, distribution) and what it only reports.
NEEDED = (
    ("jax", "jax"),
    ("jaxlib", "jaxlib"),
    ("flax", "flax"),
    ("optax", "optax"),
    ("numpy", "numpy"),
    ("ml_dtypes", "ml-dtypes"),
    ("yaml", "pyyaml"),
    ("pytest", "pytest"),
    ("xdist", "pytest-xdist"),
    ("pytest_timeout", "pytest-timeout"),
    ("hypothesis", "hypothesis"),
)
REPORTED = ("orbax-checkpoint", "grain", "tensorboardX", "packaging")
CASES = (
    ("nvfp4", (1, 16), False),
    ("nvfp4", (16, 16), False),
    ("nvfp4", (1, 16), True),
    ("mxfp4", (1, 16), False),
    ("mxfp8", (1, 16), False),
    ("fp8_e4m3", (1, 16), False),
    ("fp8_e5m2", (1, 16), False),
)


class Results:
    """device_check.json: {"stages": {name: {...}}}, rewritten atomically on every `save`."""

    def __init__(self, path: pathlib.Path):
        self.path = path
        self.data = json.loads(path.read_text()) if path.exists() else {"stages": {}}

    def save(self, stage: str, payload: dict) -> None:
        self.data["stages"][stage] = payload
        write_json_atomically(self.path, self.data)


def distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def locked_versions() -> dict[str, str]:
    lock = ROOT / "requirements.lock"
    if not lock.exists():
        return {}
    pins = re.findall(r"^([A-Za-z0-9_.-]+)==([^\s;\\]+)", lock.read_text(), flags=re.M)
    return {name.lower().replace("_", "-"): version for name, version in pins}


def outside_pyproject_bounds() -> dict[str, str]:
    """Installed distributions that pyproject.toml's bounds exclude (empty where packaging is missing)."""
    try:
        import tomllib

        from packaging.requirements import Requirement
    except ImportError:
        return {}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    texts = project.get("dependencies", []) + project.get("optional-dependencies", {}).get("dev", [])
    out = {}
    for text in texts:
        requirement = Requirement(text)
        version = distribution_version(requirement.name)
        if version and not requirement.specifier.contains(version, prereleases=True):
            out[requirement.name] = f"{version} here, pyproject.toml wants {requirement.specifier}"
    return out


def stage_versions(args, results: Results) -> int:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    missing: list[str] = []
    for module, dist in NEEDED:
        versions[dist] = distribution_version(dist)
        if versions[dist] is None:
            try:
                __import__(module)
                versions[dist] = "importable (no metadata)"
            except ImportError:
                missing.append(dist)
    plugins = {
        d.metadata["Name"]: d.version
        for d in importlib.metadata.distributions()
        if (d.metadata["Name"] or "").lower().startswith(("jax-cuda", "jax_cuda"))
    }
    versions |= plugins
    for dist in REPORTED:
        versions[dist] = distribution_version(dist)
    lock = locked_versions()
    differs = {
        name: f"{version} here, {lock[name]} in requirements.lock"
        for name, version in versions.items()
        if name.lower() in lock and version and version[0].isdigit() and version != lock[name.lower()]
    }
    bounds = outside_pyproject_bounds()
    payload = {
        "status": "ok",
        "versions": versions,
        "cuda_plugins": plugins,
        "missing": missing,
        "differs_from_lock": differs,
        "outside_pyproject_bounds": bounds,
    }
    for name, version in versions.items():
        print(f"  {name:18s} {version or 'MISSING'}")
    import jax  # after the versions are printed: a broken install still shows them

    payload["backend"] = jax.default_backend()
    payload["devices"] = [
        {"kind": d.device_kind, "platform": d.platform, "compute_capability": getattr(d, "compute_capability", None)}
        for d in jax.devices()
    ]
    for device in payload["devices"]:
        print(f"  device: {device['kind']} ({device['platform']}, compute capability {device['compute_capability']})")
    if not args.dry_run and jax.default_backend() != "gpu":
        jaxlib = versions.get("jaxlib")
        payload["status"] = "error"
        missing.append(
            f"a CUDA plugin for jaxlib {jaxlib} (jax-cuda12-plugin or jax-cuda13-plugin=={jaxlib})"
            if not plugins
            else f"a GPU visible to the CUDA plugin(s) {plugins}"
        )
    for name, text in differs.items():
        print(f"  note: {name} {text}; bit-exactness was established with the locked version")
    for name, text in bounds.items():
        print(f"  WARNING: {name} {text}; expect API differences")
    for item in missing:
        print(f"  MISSING: {item}; carry it as a wheel (see the device tool's README)")
    results.save("versions", payload)
    return 0 if payload["status"] == "ok" else 2


OUTCOME_LINE = re.compile(r"^\[gw\d+\] \[ *\d+%\] (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+)", flags=re.M)


def stage_tests(args, results: Results) -> int:
    """The pytest stage's counts from its log and exit code: the summary line, or, when pytest was
    stopped before printing it, the per-test lines of `-v` (so a timeout keeps every outcome so far)."""
    text = pathlib.Path(args.log).read_text(errors="replace") if args.log and pathlib.Path(args.log).exists() else ""
    summary = re.findall(r"^=* ?((?:\d+ \w+,? )+)in [\d.]+s", text, flags=re.M)
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (\w+)", summary[-1] if summary else "")}
    outcomes = OUTCOME_LINE.findall(text)
    if not counts:
        for outcome, _ in outcomes:
            key = {"XFAIL": "xfailed", "XPASS": "xpassed", "ERROR": "errors"}.get(outcome, outcome.lower())
            counts[key] = counts.get(key, 0) + 1
    failures = [test for outcome, test in outcomes if outcome in ("FAILED", "ERROR")]
    failures += [test for test in re.findall(r"^(?:FAILED|ERROR) (\S+)", text, flags=re.M) if test not in failures]
    status = "ok" if args.exit_code == 0 else ("timeout" if args.exit_code in (124, 137) else "failed")
    results.save(
        "tests",
        {
            "status": status,
            "exit_code": args.exit_code,
            "counts": counts,
            "failures": failures[:200],
            "seconds": args.seconds,
        },
    )
    return 0


def timed(fn, *args, repeats: int = 10) -> float:
    """Median seconds of fn(*args) after a warm-up call."""
    import jax

    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def stage_bits(args, results: Results) -> int:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from fp4lm import numerics

    device, cpu = jax.devices()[0], jax.devices("cpu")[0]
    rng = np.random.default_rng(0)
    shape = (64, 256) if args.dry_run else (256, 1024)
    inputs = {
        "normal": rng.standard_normal(shape),
        "outliers": rng.standard_normal(shape) * np.where(rng.random(shape) < 0.001, 300.0, 1.0),
        "tiny": rng.standard_normal(shape) * 1e-20,
        "ties": np.repeat(rng.choice([0.25, 0.75, 1.25, 2.5, 5.0, -3.5, 6.0], shape[:-1] + (shape[-1] // 16,)), 16, -1)
        * 2.0 ** rng.integers(-8, 8),
    }
    rows = []
    payload = {"status": "running", "device": device.device_kind, "rows": rows}
    for fmt, block, hadamard in CASES:
        quantize = jax.jit(lambda v, f=fmt, b=block, h=hadamard: numerics.quantize(v, f, block=b, hadamard=h))
        for data_name, data in inputs.items():
            for dtype in (jnp.float32, jnp.bfloat16):
                x = np.asarray(jnp.asarray(data, dtype))
                on_device = jax.tree_util.tree_leaves(quantize(jax.device_put(x, device)))
                on_cpu = jax.tree_util.tree_leaves(quantize(jax.device_put(x, cpu)))
                mismatched = sum(
                    int(
                        np.sum(
                            np.atleast_1d(np.asarray(a)).view(np.uint8) != np.atleast_1d(np.asarray(b)).view(np.uint8)
                        )
                    )
                    for a, b in zip(on_device, on_cpu, strict=True)
                )
                rows.append(
                    {
                        "data": data_name,
                        "dtype": jnp.dtype(dtype).name,
                        "format": fmt,
                        "block": list(block),
                        "hadamard": hadamard,
                        "mismatched_bytes": mismatched,
                    }
                )
        results.save("bits", payload)
    payload["status"] = "ok"
    payload["mismatched_bytes"] = sum(row["mismatched_bytes"] for row in rows)
    results.save("bits", payload)
    return 0


def bytes_accessed(compiled) -> float | None:
    """What XLA's compiled program reads and writes, from its cost analysis (None where unavailable)."""
    try:
        analysis = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - an optional figure; some backends have none
        return None
    if isinstance(analysis, list):
        analysis = analysis[0] if analysis else {}
    value = (analysis or {}).get("bytes accessed")
    return float(value) if value is not None else None


def stage_bandwidth(args, results: Results) -> int:
    import jax
    import jax.numpy as jnp

    from fp4lm import numerics

    shape = (512, 1024) if args.dry_run else (8192, 8192)
    x = jax.random.normal(jax.random.key(0), shape, jnp.bfloat16)
    c = jnp.asarray(1.5, jnp.bfloat16)
    copy = jax.jit(lambda v, s: v * s).lower(x, c).compile()  # reads and writes every byte once
    quantize = jax.jit(lambda v: numerics.quantize(v, "nvfp4")).lower(x).compile()
    t_copy, t_quant = timed(copy, x, c), timed(quantize, x)
    copy_bytes = 2 * x.size * x.dtype.itemsize
    ideal_bytes = x.size * x.dtype.itemsize + x.size // 2 + x.size // 16 + 4  # read x; write codes, scales, amax
    xla_bytes = bytes_accessed(quantize)
    copy_gbs = copy_bytes / t_copy / 1e9
    payload = {
        "status": "ok",
        "shape": list(shape),
        "copy_s": t_copy,
        "quantize_s": t_quant,
        "copy_GBps": copy_gbs,
        "quantize_ideal_bytes": ideal_bytes,
        "quantize_xla_bytes": xla_bytes,
        "quantize_GBps_of_xla_bytes": xla_bytes / t_quant / 1e9 if xla_bytes else None,
        # time over the memory floor: the ideal bytes moved at the copy's bandwidth
        "times_the_floor": t_quant / (ideal_bytes / (copy_gbs * 1e9)),
        "copy_xla_bytes": bytes_accessed(copy),
    }
    results.save("bandwidth", payload)
    return 0


def train_step(recipe: str, args, peak_tflops: float | None) -> dict:
    """The trainer's own step (fp4lm.train.run_functions.RunFunctions: loss scaling, clipping, the optimizer
    and the precision policy exactly as `fp4lm train` runs them), timed on one fixed random batch."""
    import jax
    import numpy as np

    from fp4lm.config import load_config
    from fp4lm.config.tiny import TINY_DATA, TINY_MODEL
    from fp4lm.flops import training_flops_per_step
    from fp4lm.quant import Policy
    from fp4lm.sharding import make_mesh
    from fp4lm.train.run_functions import RunFunctions
    from fp4lm.train.setup import build_run
    from fp4lm.train.validate import check_config_for_training

    # The dry run times the tiny run's shapes (fp4lm.config.tiny); the real one the config's, --layers deep.
    shape = [*TINY_MODEL, *TINY_DATA] if args.dry_run else [f"model.num_layers={args.layers}"]
    # model.remat=none: the step timed keeps its activations, whatever the config's own layout recomputes.
    overrides = [*shape, "model.scan_layers=true", "model.remat=none", f"precision.recipe={recipe}"]
    overrides.append("precision.backend=emulated")
    if not args.dry_run:
        overrides.append(f"train.batch_size={args.batch}")
    config = load_config(args.config, overrides)
    vocab, seq, batch = config.data.vocab_size, config.data.seq_len, config.train.batch_size
    if vocab is None:  # the timed shape must name its vocabulary (no tokenizer is built here)
        raise ValueError(f"{args.config} sets no data.vocab_size; the train stage needs one")
    check_config_for_training(config)
    policy = Policy.from_config(config)
    mesh = make_mesh(config.mesh)
    setup = build_run(config, mesh, policy, vocab)
    functions = RunFunctions.build(setup, policy)
    tokens = np.asarray(jax.random.randint(jax.random.key(1), (batch, seq + 1), 0, vocab), np.int32)
    batch_arrays = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
    state = setup.fresh_state()
    start = time.perf_counter()
    compiled = functions.train_step.lower(state, batch_arrays).compile()
    compile_s = time.perf_counter() - start
    times, metrics = [], None
    for _ in range(args.steps + 1):  # the first step is a warm-up
        start = time.perf_counter()
        state, metrics = compiled(state, batch_arrays)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    step_s = statistics.median(times[1:])
    flops = training_flops_per_step(config.model, vocab, seq, batch).total
    tflops = flops / step_s / 1e12
    return {
        "recipe": recipe,
        "layers": config.model.num_layers,
        "scan_layers": config.model.resolved_scan_layers,
        "d_model": config.model.d_model,
        "batch": batch,
        "seq": seq,
        "compile_s": compile_s,
        "step_s": step_s,
        "tokens_per_sec": batch * seq / step_s,
        "tflops_per_sec": tflops,
        "mfu": tflops / peak_tflops if peak_tflops else None,
        "loss": None if metrics is None else float(metrics["loss"]),
        "skipped_steps": None if metrics is None else int(metrics["skipped_steps"]),
    }


def stage_train(args, results: Results) -> int:
    missing = missing_packages(TRAINER_NEEDS)
    if missing:
        results.save("train", {"status": "skipped", "reason": f"not installed: {', '.join(missing)}"})
        print(f"train stage skipped: not installed: {', '.join(missing)}")
        return 0
    import jax

    from fp4lm.hardware import peak_bf16_tflops

    peak = peak_bf16_tflops(jax.devices()[0].device_kind)
    rows = []
    payload = {"status": "running", "device": jax.devices()[0].device_kind, "peak_bf16_tflops": peak, "rows": rows}
    for recipe in ("bf16", "nvfp4"):
        rows.append(train_step(recipe, args, peak))
        results.save("train", payload)
    payload["status"] = "ok"
    payload["nvfp4_over_bf16"] = rows[1]["step_s"] / rows[0]["step_s"]
    results.save("train", payload)
    return 0


# The compare stage's dry run: the gpu preset's plumbing, with the tiny run's shapes (fp4lm.config.tiny).
DRY_RUN_COMPARE = ("eval.batches=1", "checkpoint.enabled=false")
TRAINER_NEEDS = ("grain", "tensorboardX")  # what importing fp4lm.train needs beyond jax, flax and optax
COMPARE_NEEDS = (*TRAINER_NEEDS, "matplotlib")


def missing_packages(names: tuple[str, ...]) -> list[str]:
    return [name for name in names if importlib.util.find_spec(name) is None]


def compare_command(args, out_dir: pathlib.Path) -> list[str]:
    """`fp4lm compare --preset gpu --recipes bf16,nvfp4`, with the steps and evaluations scaled down."""
    steps = args.compare_steps
    every = max(1, steps // 4)
    overrides = [f"train.steps={steps}", f"eval.every={every}", f"metrics.log_every={every}"]
    overrides += [f"metrics.quant_stats_every={every}"]
    overrides += [f"optimizer.warmup_steps={max(1, steps // 10)}", "eval.sample_tokens=0"]
    if args.dry_run:
        from fp4lm.config.tiny import TINY_DATA, TINY_MODEL

        overrides += [*TINY_MODEL, *TINY_DATA, *DRY_RUN_COMPARE]
    command = [sys.executable, "-m", "fp4lm", "compare", "--preset", "gpu", "--recipes", "bf16,nvfp4"]
    return [*command, "--out", str(out_dir), *overrides]


def stage_compare(args, results: Results) -> int:
    import subprocess

    missing = missing_packages(COMPARE_NEEDS)
    if missing:
        results.save("compare", {"status": "skipped", "reason": f"not installed: {', '.join(missing)}"})
        print(f"compare stage skipped: not installed: {', '.join(missing)}")
        return 0
    out_dir = pathlib.Path(args.out).parent / "compare"
    command = compare_command(args, out_dir)
    results.save("compare", {"status": "running", "command": command[2:], "dir": str(out_dir)})
    with (pathlib.Path(args.out).parent / "compare.log").open("w") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    report = json.loads((out_dir / "results.json").read_text()) if (out_dir / "results.json").exists() else {}
    rows = [
        {
            "recipe": row["label"],
            "val_loss": row["val_loss"],
            "gap_pct": row["gap_pct"],
            "tokens_per_sec": row["tokens_per_sec"],
            "status": row["status"],
        }
        for row in report.get("table", [])
    ]
    status = "ok" if code == 0 and len(rows) == 2 else "failed"
    results.save(
        "compare", {"status": status, "exit_code": code, "command": command[2:], "dir": str(out_dir), "rows": rows}
    )
    return 0 if status == "ok" else 1


def stage_note(args, results: Results) -> int:
    previous = results.data["stages"].get(args.name, {})
    results.save(args.name, previous | {"status": args.status, "seconds": args.seconds})
    return 0


def _fmt(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def stage_summary(args, results: Results) -> int:
    stages = results.data["stages"]
    print("\n| stage | status | result | goal |\n|---|---|---|---|")
    tests = stages.get("tests", {})
    print(f"| tests | {tests.get('status', 'not run')} | {tests.get('counts', {})} | 0 failed |")
    bits = stages.get("bits", {})
    print(
        f"| GPU vs CPU bytes differing ({len(bits.get('rows', []))} cases) | {bits.get('status', 'not run')} | "
        f"{sum(row['mismatched_bytes'] for row in bits.get('rows', []))} | 0 |"
    )
    bw = stages.get("bandwidth", {})
    print(
        f"| quantizer time / memory floor | {bw.get('status', 'not run')} | "
        f"{_fmt(bw.get('times_the_floor'), '.2f')}x (XLA bytes {_fmt(bw.get('quantize_xla_bytes'), '.3g')} "
        f"vs ideal {_fmt(bw.get('quantize_ideal_bytes'), '.3g')}) | <= 2.5x |"
    )
    train = stages.get("train", {})
    for row in train.get("rows", []):
        print(
            f"| train {row['recipe']} ({row['layers']} layers, {row['batch']}x{row['seq']}) | ok | "
            f"{row['tokens_per_sec']:,.0f} tok/s, MFU {_fmt(row['mfu'], '.2f')}, "
            f"compile {row['compile_s']:.0f} s | |"
        )
    ratio = _fmt(train.get("nvfp4_over_bf16"), ".2f")
    print(f"| nvfp4 / bf16 step time | {train.get('status', 'not run')} | {ratio}x | <= 1.3x |")
    compare = stages.get("compare", {})
    for row in compare.get("rows", []):
        print(
            f"| compare --preset gpu (shortened): {row['recipe']} | {row['status']} | val loss "
            f"{_fmt(row['val_loss'], '.4f')}, gap {_fmt(row['gap_pct'], '+.2f')}%, "
            f"{_fmt(row['tokens_per_sec'], ',.0f')} tok/s | runs, report written |"
        )
    if not compare.get("rows"):
        reason = compare.get("reason") or compare.get("error") or ""
        print(f"| compare --preset gpu | {compare.get('status', 'not run')} | {reason} | runs, report written |")
    print(f"\nfull results: {results.path}")
    failed = [name for name, stage in stages.items() if stage.get("status") not in ("ok", "skipped")]
    mismatches = sum(row["mismatched_bytes"] for row in bits.get("rows", []))
    return 0 if not failed and mismatches == 0 else 1


STAGES = {
    "versions": stage_versions,
    "tests": stage_tests,
    "bits": stage_bits,
    "bandwidth": stage_bandwidth,
    "train": stage_train,
    "compare": stage_compare,
    "note": stage_note,
    "summary": stage_summary,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", choices=sorted(STAGES), required=True)
    parser.add_argument("--out", default="device_check.json")
    parser.add_argument("--dry-run", action="store_true", help="small shapes, any device (the CPU test)")
    parser.add_argument("--config", default=str(ROOT / "configs" / "350m.yaml"), help="model shape to time")
    parser.add_argument("--layers", type=int, default=8, help="train stage: layers (scanned: one compiled block)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--compare-steps", type=int, default=100, help="compare stage: steps per recipe")
    parser.add_argument("--log", help="tests stage: the pytest log")
    parser.add_argument("--exit-code", type=int, default=0, help="tests stage: pytest's exit code")
    parser.add_argument("--name", help="note stage: the stage stopped")
    parser.add_argument("--status", default="timeout", help="note stage: its status")
    parser.add_argument("--seconds", type=float, help="tests/note stage: its wall time")
    args = parser.parse_args()
    if args.dry_run:
        args.steps, args.compare_steps = 1, 4  # the shapes are the tiny run's (train_step)
    results = Results(pathlib.Path(args.out))
    print(f"== {args.stage}", flush=True)
    try:
        if args.stage in ("bits", "bandwidth", "train") and not args.dry_run:
            import jax

            if jax.default_backend() != "gpu":
                raise RuntimeError(f"no GPU visible to jax (devices: {jax.devices()}); see the versions stage")
        return STAGES[args.stage](args, results)
    except Exception as err:  # noqa: BLE001 - record why a stage failed, keep the others' results
        results.save(
            args.stage,
            results.data["stages"].get(args.stage, {})
            | {"status": "error", "error": f"{type(err).__name__}: {err}"[:2000]},
        )
        print(f"stage {args.stage} failed: {type(err).__name__}: {err}", flush=True)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
