"""Benchmark: training reads a prepared corpus by memory map, so its memory does not grow with the corpus, and
the input pipeline keeps up with the step.

    .venv/bin/python bench/data_memory.py             # a 4M-token corpus and a 1.07G-token one (2 GiB of uint16)
    .venv/bin/python bench/data_memory.py --quick     # 2M and 128M tokens (256 MiB), fewer steps
    .venv/bin/python bench/data_memory.py --work-dir /big/disk --keep

Two prepared corpora (fp4lm's prepared format, fp4lm/data/prepared.py) of synthetic documents — random byte
tokens, lengths 64-4095, each ending with the byte tokenizer's end-of-text id — are written straight through
the format's shard writer (tokenizing text would take far longer and measure `fp4lm prepare`, not training).
Then the same tiny model trains a few steps on each, each run in a fresh process whose peak resident memory
(ru_maxrss) is read when it ends. Reported: both corpus sizes, both peak RSS figures and their ratio (about 1:
the corpus is mapped, not loaded; what does grow is the document index, 8 bytes per document, and the pages a
run touches), and from metrics.jsonl the mean `data_wait_s` per step against the mean `step_time_s` (steps
after the first, which compiles). The working directory is removed at the end unless --keep.

The host's load average is recorded around the runs; above bench/host_load.py's IDLE_LOAD the figures are
refused (exit 3) unless --allow-load is given, and then the report says "loaded".
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "bench"))

import host_load  # noqa: E402  (bench/host_load.py, beside this script)

SHARD_TOKENS = 1 << 28  # 256M tokens (512 MiB of uint16) per shard
CHUNK_TOKENS = 1 << 24  # random tokens generated at a time
SIZES = {"quick": (2 << 20, 128 << 20), "full": (4 << 20, 1 << 30)}  # tokens: small corpus, large corpus
STEPS = {"quick": 12, "full": 40}
MODEL = [
    "model.num_layers=2",
    "model.d_model=64",
    "model.num_heads=4",
    "model.num_kv_heads=2",
    "model.mlp_dim=192",
    "data.seq_len=256",
    "train.batch_size=8",
    "precision.recipe=bf16",
]
QUIET = [
    "metrics.log_every=1",
    "metrics.quant_stats_every=100000",
    "metrics.tensorboard=false",
    "metrics.progress=plain",
    "eval.batches=1",
    "eval.every=100000",
    "eval.sample_tokens=0",
    "checkpoint.enabled=false",
    "optimizer.warmup_steps=2",
]


def write_corpus(directory: pathlib.Path, num_tokens: int, seed: int) -> int:
    """A prepared corpus of about `num_tokens` tokens (train split; a small val split); returns its documents."""
    from fp4lm.data.prepared import token_dtype
    from fp4lm.data.shard_writer import ShardWriter, make_manifest, shard_names, write_manifest
    from fp4lm.tokenizer import ByteTokenizer

    tokenizer = ByteTokenizer()
    eos = tokenizer.eos_id
    assert eos is not None
    entry = {
        "fingerprint": tokenizer.fingerprint,
        "name": tokenizer.name,
        "vocab_size": tokenizer.vocab_size,
        "eos_id": eos,
        "bos_id": tokenizer.bos_id,
    }
    dtype = token_dtype(tokenizer.vocab_size)
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    shards: dict[str, list[dict]] = {"train": [], "val": []}
    documents = 0
    for split, budget in (("train", num_tokens), ("val", max(1 << 16, num_tokens // 1000))):
        written, index = 0, 0
        while written < budget:
            writer = ShardWriter(directory, *shard_names(split, index), dtype)
            while writer.num_tokens < SHARD_TOKENS and written < budget:
                chunk = rng.integers(0, 256, size=min(CHUNK_TOKENS, budget - written), dtype=np.uint16)
                lengths = rng.integers(64, 4096, size=chunk.size // 64 + 1)
                ends = np.minimum(np.cumsum(lengths), chunk.size)
                chunk[ends - 1] = eos  # every document ends with end-of-text
                starts = np.concatenate([[0], ends[:-1]])
                for start, end in zip(starts, ends, strict=True):
                    if end > start:
                        writer.add(chunk[start:end])
                        documents += 1
                written += chunk.size
            shards[split].append(writer.finish())
            os.replace(writer.tokens_path, directory / writer.file)
            os.replace(writer.docs_path, directory / writer.docs)
            index += 1
    manifest = make_manifest(tokenizer=entry, dtype=dtype, val_fraction=0.001, sources=[], shards=shards)
    write_manifest(directory, manifest)
    return documents


def train_child(result_path: str, overrides: list[str]) -> int:
    """In a fresh process: `fp4lm train OVERRIDES`, then this process's peak RSS written to `result_path`."""
    from fp4lm import cli

    try:
        cli.main(["train", *overrides])
        code = 0
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    pathlib.Path(result_path).write_text(json.dumps({"code": code, "peak_rss_mib": peak_kib / 1024}))
    return code


def train_on(corpus: pathlib.Path, run_dir: pathlib.Path, steps: int) -> dict:
    result = run_dir.parent / f"{run_dir.name}.rss.json"
    overrides = [*MODEL, *QUIET, f"data.path={corpus}", f"train.run_dir={run_dir}", f"train.steps={steps}"]
    command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--train-child", str(result), *overrides]
    env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
        raise SystemExit(f"training on {corpus} failed with exit code {done.returncode}")
    measured = json.loads(result.read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steady = [r for r in records if "loss" in r and r["step"] > 1]
    return {
        "peak_rss_mib": measured["peak_rss_mib"],
        "data_wait_s": statistics.mean(r["data_wait_s"] for r in steady),
        "step_time_s": statistics.mean(r["step_time_s"] for r in steady),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2M and 128M tokens, 12 steps")
    parser.add_argument("--work-dir", default=None, help="where the corpora are written (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the corpora and runs")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    host_load.add_allow_load_flag(parser)
    args = parser.parse_args(argv)
    mode = "quick" if args.quick else "full"
    small_tokens, large_tokens = SIZES[mode]
    work = pathlib.Path(tempfile.mkdtemp(prefix="fp4lm-data-memory-", dir=args.work_dir))
    try:
        need = 2 * (small_tokens + large_tokens) * 1.1
        free = shutil.disk_usage(work).free
        if free < need:
            raise SystemExit(
                f"error: {work} has {free / 2**30:.1f} GiB free, the corpora need {need / 2**30:.1f} GiB; "
                "choose another --work-dir or use --quick"
            )
        load_before = host_load.load_average()
        results = {}
        for name, tokens, seed in (("small", small_tokens, 1), ("large", large_tokens, 2)):
            started = time.perf_counter()
            documents = write_corpus(work / name, tokens, seed)
            written_s = time.perf_counter() - started
            size = sum(p.stat().st_size for p in (work / name).glob("*.npy"))
            print(f"wrote {name} corpus: {tokens:,} tokens, {documents:,} documents, {size / 2**20:,.0f} MiB "
                  f"in {written_s:.0f} s", file=sys.stderr, flush=True)  # fmt: skip
            results[name] = {"tokens": tokens, "documents": documents, "bytes": size}
            results[name].update(train_on(work / name, work / f"run-{name}", STEPS[mode]))
        load_after = host_load.load_average()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    small, large = results["small"], results["large"]
    print(f"\n{host_load.describe(load_before, load_after)}\n")
    if not host_load.refuse_unless_idle([load_before, load_after], allow_load=args.allow_load):
        print(host_load.LOADED_MARK + "\n")
    print("| corpus | tokens | on disk | documents | peak RSS | data_wait_s / step | step_time_s | wait / step |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        print(
            f"| {name} | {r['tokens'] / 1e6:,.0f}M | {r['bytes'] / 2**20:,.0f} MiB | {r['documents']:,} | "
            f"{r['peak_rss_mib']:,.0f} MiB | {r['data_wait_s'] * 1e3:.2f} ms | {r['step_time_s'] * 1e3:.1f} ms | "
            f"{r['data_wait_s'] / r['step_time_s']:.1%} |"
        )
    growth = large["tokens"] / small["tokens"]
    print(
        f"\nThe large corpus is {growth:.0f}x the small one; its peak RSS is "
        f"{large['peak_rss_mib'] / small['peak_rss_mib']:.2f}x ({large['peak_rss_mib'] - small['peak_rss_mib']:+,.0f} "
        f"MiB). Model: {', '.join(MODEL)}; {STEPS[mode]} steps."
    )
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--train-child":
        raise SystemExit(train_child(sys.argv[2], sys.argv[3:]))
    raise SystemExit(main())
