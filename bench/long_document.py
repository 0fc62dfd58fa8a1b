"""Benchmark: the peak memory of `fp4lm prepare` on one very long document (issue 21).

    .venv/bin/python bench/long_document.py                # one 50 MB document
    .venv/bin/python bench/long_document.py --mb 10        # a smaller one
    .venv/bin/python bench/long_document.py --tokenizer byte

Writes a JSONL file holding one document of `--mb` MB of English-like text (words and spaces, no newline: the
worst case; `--lines` ends a line every ~80 characters) and a 2048-token byte-level BPE tokenizer.json trained
on a sample of it, then runs `fp4lm prepare` on it in a fresh process and reports that process's peak resident
memory (ru_maxrss), its wall time and the host's load average around it. The working directory is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import resource
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "bench"))

import host_load  # noqa: E402  (bench/host_load.py, beside this script)

WORDS = (
    "the",
    "of",
    "and",
    "to",
    "in",
    "a",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
)


def long_text(mb: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    lines, size = [], 0
    while size < mb * 1_000_000:
        line = " ".join(rng.choice(WORDS) + rng.choice(("", "s", "ed", "ing")) for _ in range(14)) + ".\n"
        lines.append(line)
        size += len(line)
    return "".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=50, help="the document's size in MB")
    parser.add_argument("--tokenizer", default="bpe", choices=("bpe", "byte"))
    parser.add_argument("--lines", action="store_true", help="end a line every ~80 characters (default: none)")
    args = parser.parse_args()
    from fp4lm.tokenizer import BPETokenizer

    with tempfile.TemporaryDirectory() as work:
        root = pathlib.Path(work)
        text = long_text(args.mb)
        text = text if args.lines else text.replace("\n", " ")
        (root / "one.jsonl").write_text(json.dumps({"text": text}) + "\n")
        tokenizer = "byte"
        if args.tokenizer == "bpe":
            BPETokenizer.train(text[:2_000_000], 2048).save(root / "tok")
            tokenizer = str(root / "tok" / "tokenizer.json")
        del text
        before = host_load.load_average()
        start = time.perf_counter()
        command = [sys.executable, "-m", "fp4lm", "prepare", str(root / "one.jsonl"), "--tokenizer", tokenizer]
        subprocess.run([*command, "--out", str(root / "out"), "--progress", "off"], check=True, cwd=ROOT)
        seconds = time.perf_counter() - start
        peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        after = host_load.load_average()
    print(
        f"one {args.mb} MB document{' of lines' if args.lines else ', no newline'}, tokenizer {args.tokenizer}: "
        f"peak RSS {peak_mib:,.0f} MiB "
        f"({peak_mib * 1.048576 / args.mb:.1f}x the document), {seconds:.1f} s, {host_load.describe(before, after)}"
    )


if __name__ == "__main__":
    main()
