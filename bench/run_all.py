"""`make bench`: runs every benchmark in one go and rewrites their sections of BENCHMARKS.md.

Each benchmark prints a markdown report (tables of ratios measured in the same run) on stdout; this script
puts each report between its markers in BENCHMARKS.md, with the machine and the date. Quick sizes by default;
BENCH_FULL=1 runs the larger ones; BENCH_ONLY=train_step (comma-separated names) runs only those;
BENCH_ALLOW_LOAD=1 lets the benchmarks report from a busy host (their tables then say "loaded").
"""

from __future__ import annotations

import datetime
import os
import pathlib
import platform
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCHMARKS = ("quantize", "step_breakdown", "dot", "train_step", "data_memory")
# Every benchmark refuses to publish figures from a busy host unless BENCH_ALLOW_LOAD=1 (bench/host_load.py).


def machine() -> str:
    cores = os.cpu_count()
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    processor = platform.processor() or "cpu"
    return f"{platform.machine()} {processor}, {cores} cores, {mem_gib:.0f} GiB, Python {platform.python_version()}"


def run(name: str, full: bool) -> str:
    command = [sys.executable, str(ROOT / "bench" / f"{name}.py")] + ([] if full else ["--quick"])
    if os.environ.get("BENCH_ALLOW_LOAD", "") not in ("", "0"):
        command.append("--allow-load")
    env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    print(f"$ {' '.join(command[1:])}", flush=True)
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"bench/{name}.py failed with exit code {done.returncode}")
    print(done.stdout, flush=True)
    shown = "python " + " ".join(
        str(pathlib.Path(c).relative_to(ROOT)) if c.startswith(str(ROOT)) else c for c in command[1:]
    )
    return f"Command: `{shown}`\n\n{done.stdout.strip()}\n"


def replace_section(text: str, name: str, body: str) -> str:
    begin, end = f"<!-- bench:{name}:begin -->", f"<!-- bench:{name}:end -->"
    block = f"{begin}\n{body}{end}"
    if begin in text and end in text:
        return re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    return text.rstrip("\n") + f"\n\n## bench/{name}.py\n\n{block}\n"


def main() -> int:
    full = os.environ.get("BENCH_FULL", "") not in ("", "0")
    sizes = "full sizes (`make bench` BENCH_FULL=1)" if full else "quick sizes (`make bench`)"
    stamp = f"Measured {datetime.date.today().isoformat()} on {machine()}; {sizes}.\n\n"
    path = ROOT / "BENCHMARKS.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    only = [name for name in os.environ.get("BENCH_ONLY", "").split(",") if name]
    unknown = sorted(set(only) - set(BENCHMARKS))
    if unknown:
        raise SystemExit(
            f"error: unknown benchmark {', '.join(unknown)} in BENCH_ONLY; choose from {', '.join(BENCHMARKS)}"
        )
    for name in only or BENCHMARKS:
        text = replace_section(text, name, stamp + run(name, full))
        path.write_text(text)
    print(f"updated {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
