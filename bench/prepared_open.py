"""Benchmark: what opening a prepared corpus costs a training start, now that the manifest records each shard's
largest token id, against the scan of every shard that checked the ids before (still what a manifest written
without that field gets, and what `fp4lm prepare --verify` does).

    .venv/bin/python bench/prepared_open.py            # 1,074M tokens (2 GiB of uint16 shards)
    .venv/bin/python bench/prepared_open.py --quick    # 134M tokens (256 MiB)
    .venv/bin/python bench/prepared_open.py --work-dir /big/disk --keep

One corpus of synthetic documents (bench/data_memory.py's writer: random byte tokens, 64-4095 per document) is
written once; then, round-robin, `PreparedCorpus.open(DIR)` followed by `check_token_ids()` — what
fp4lm/data/corpus.py does at every training start — with the manifest as `fp4lm prepare` writes it now, and
with the same manifest stripped of "max_token_id" (a corpus prepared by an older fp4lm: every shard is read).
The shards were just written, so they are in the page cache: the scan measured here is the cheap case; from a
cold cache it reads the whole corpus from disk. Reported: the median time of each and their ratio, with the
host's load average (above bench/host_load.py's IDLE_LOAD the figures are refused unless --allow-load).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "bench"))

import host_load  # noqa: E402  (bench/host_load.py, beside this script)
from data_memory import write_corpus  # noqa: E402  (the same synthetic corpus)

from fp4lm.data.prepared import MANIFEST_FILE, MAX_TOKEN_ID, PreparedCorpus  # noqa: E402

TOKENS = {"quick": 128 << 20, "full": 1 << 30}


def open_and_check(directory: pathlib.Path) -> float:
    """Seconds to open the corpus and check its token ids against the vocabulary, as a training start does."""
    start = time.perf_counter()
    PreparedCorpus.open(directory).check_token_ids()
    return time.perf_counter() - start


def without_recorded_ids(manifest: dict) -> dict:
    stripped = json.loads(json.dumps(manifest))
    for split in stripped["splits"].values():
        for shard in split["shards"]:
            del shard[MAX_TOKEN_ID]
    return stripped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="134M tokens instead of 1,074M")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--work-dir", type=pathlib.Path, default=None, help="where the corpus is written")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    host_load.add_allow_load_flag(parser)
    args = parser.parse_args()

    work = pathlib.Path(tempfile.mkdtemp(prefix="fp4lm-prepared-open-", dir=args.work_dir))
    try:
        corpus = work / "corpus"
        tokens = TOKENS["quick" if args.quick else "full"]
        documents = write_corpus(corpus, tokens, seed=0)
        manifest_path = corpus / MANIFEST_FILE
        manifests = {"recorded": manifest_path.read_text()}
        manifests["scanned"] = json.dumps(without_recorded_ids(json.loads(manifests["recorded"])), indent=1) + "\n"
        shards = sum(len(split["shards"]) for split in json.loads(manifests["recorded"])["splits"].values())
        on_disk = sum(p.stat().st_size for p in corpus.iterdir())

        load_before = host_load.load_average()
        times: dict[str, list[float]] = {name: [] for name in manifests}
        for _ in range(args.repeats):  # round-robin: load drift hits both alike
            for name, text in manifests.items():
                manifest_path.write_text(text)
                times[name].append(open_and_check(corpus))
        load_after = host_load.load_average()
        idle = host_load.refuse_unless_idle([load_before, load_after], allow_load=args.allow_load)

        recorded, scanned = (statistics.median(times[name]) for name in ("recorded", "scanned"))
        if not idle:
            print(host_load.LOADED_MARK + "\n")
        print(
            f"PreparedCorpus.open + check_token_ids, {tokens / 1e6:,.0f}M tokens ({on_disk / 2**20:,.0f} MiB, "
            f"{shards} shards, {documents:,} documents, page cache warm), median of {args.repeats}, "
            f"{host_load.describe(load_before, load_after)}\n"
        )
        print("| manifest | open + id check (ms) | / recorded |")
        print("|---|---:|---:|")
        print(f"| records each shard's largest id (now) | {recorded * 1e3:.2f} | 1.00x |")
        ratio = scanned / recorded
        print(f"| without it: every shard scanned (before; older corpora) | {scanned * 1e3:.2f} | {ratio:.0f}x |")
    finally:
        if args.keep:
            print(f"\nkept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
