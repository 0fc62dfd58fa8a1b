"""A small mutation audit: apply one-line mutations to a module, one at a time, run its tests, restore it.

    .venv/bin/python tools/mutate.py tools/mutations/grouped.txt [--timeout 900] [--only 3,7]

A list file names the module and the tests, then one mutation per line, ``old => new``: ``old`` must occur
exactly once in the module (else the mutation is reported as invalid and skipped):

    # module: fp4lm/quant/grouped.py
    # tests: tests/quant/test_grouped_boundaries.py tests/quant/test_grouped_dot.py
    takes = size - done >= length => takes = size - done > length

Each mutant runs ``pytest -x -q`` over the tests (a fresh bytecode cache, so no stale .pyc of the original
is read); a failing run (or one past --timeout) caught it, a passing one let it survive. Several ``# tests:``
lines are stages, run in order until one fails: the fast tests first, a slow subprocess test only for the
mutants they miss (tests/conftest.py would otherwise start the slow modules first). The module's text
is restored after every mutant, also on Ctrl-C, and the script refuses a module with uncommitted changes,
so that ``git checkout`` could always restore it too. Prints one line per mutant and the score.
(mutmut and cosmic-ray re-run the whole suite or need a JAX-aware runner; this is the same audit, cheaper.)
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]


def read_list(path: pathlib.Path) -> tuple[str, list[list[str]], list[tuple[str, str]]]:
    module, stages, mutations = "", [], []
    for line in path.read_text().splitlines():
        if line.startswith("# module:"):
            module = line.split(":", 1)[1].strip()
        elif line.startswith("# tests:"):
            stages.append(line.split(":", 1)[1].split())
        elif line.strip() and not line.startswith("#"):
            old, sep, new = line.partition(" => ")
            if not sep:
                raise SystemExit(f"{path}: not 'old => new': {line!r}")
            mutations.append((old.strip(), new.strip()))
    if not module or not stages:
        raise SystemExit(f"{path}: needs '# module:' and '# tests:' lines")
    return module, stages, mutations


def run_stages(stages: list[list[str]], timeout: float) -> str:
    """'caught' (a test of some stage failed), 'timeout' (counted as caught) or 'survived'."""
    for tests in stages:
        outcome = run_tests(tests, timeout)
        if outcome != "survived":
            return outcome
    return "survived"


def run_tests(tests: list[str], timeout: float) -> str:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, PYTHONPYCACHEPREFIX=cache, PYTHONDONTWRITEBYTECODE="1")
        command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
        try:
            done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "timeout"
    return "survived" if done.returncode == 0 else "caught"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mutations", type=pathlib.Path)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per mutant's test run")
    parser.add_argument("--only", default="", help="comma-separated mutant numbers (1-based) to run")
    args = parser.parse_args()
    module, stages, mutations = read_list(args.mutations)
    path = REPO / module
    if subprocess.run(["git", "diff", "--quiet", "--", module], cwd=REPO).returncode:
        raise SystemExit(f"{module} has uncommitted changes: commit or stash them first")
    original = path.read_text()
    only = {int(n) for n in args.only.split(",") if n}
    caught = total = 0
    try:
        for number, (old, new) in enumerate(mutations, 1):
            if only and number not in only:
                continue
            if original.count(old) != 1:
                print(f"{number:3d} invalid ({original.count(old)} matches): {old}", flush=True)
                continue
            path.write_text(original.replace(old, new))
            start = time.monotonic()
            try:
                outcome = run_stages(stages, args.timeout)
            finally:
                path.write_text(original)
            total += 1
            caught += outcome != "survived"
            print(f"{number:3d} {outcome:8s} {time.monotonic() - start:5.0f}s  {old}  =>  {new}", flush=True)
    finally:
        path.write_text(original)
    print(f"{module}: {caught}/{total} caught", flush=True)


if __name__ == "__main__":
    main()
