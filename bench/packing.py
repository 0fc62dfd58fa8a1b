"""Benchmark: fp4lm's random-access window packing against grain's own packers, per batch of sequences.

    .venv/bin/python bench/packing.py            # seq_len 2048, batch 32, 40 batches each
    .venv/bin/python bench/packing.py --quick    # seq_len 256, batch 8, 10 batches each
    .venv/bin/python bench/packing.py --allow-load

Every packer makes batches with segment ids and positions from the same synthetic corpus (documents of
random lengths, uint16 tokens in memory; lengths drawn so a window holds a few documents):
- windows: fp4lm.data.pipeline (shuffled fixed windows over the concatenation, layout from the document
  starts; a pure function of the batch index);
- concat_then_split: grain.experimental.ConcatThenSplitIterDataset over documents shuffled by grain, batched
  by grain (the same layout: no padding, documents cut at window ends);
- first_fit: grain.experimental.FirstFitPackIterDataset (documents are not cut, bins are padded; it takes no
  document longer than a window, so longer ones are truncated, which loses their tail).
Reported per packer: the median time per batch (after two warm-up batches), that time as a ratio to the
windows packer's, the fraction of padding tokens, and the size of the JSON iterator state a checkpoint keeps.
The host's load average is recorded; on a busy host (bench/host_load.py) the figures are refused (exit 3)
unless --allow-load, which marks them loaded.

The pipeline keeps its windows for the design, not for speed (see fp4lm/data/pipeline.py): random access,
an iterator state of one integer, and the same global batch however many hosts share it.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import grain
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "bench"))

import host_load  # noqa: E402  (bench/host_load.py, beside this script)

from fp4lm.data import pipeline  # noqa: E402


def synthetic_corpus(num_tokens: int, mean_document: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens uint16, document starts int64): documents of geometric lengths around `mean_document`."""
    rng = np.random.default_rng(seed)
    lengths = rng.geometric(1.0 / mean_document, size=num_tokens // mean_document * 2)
    ends = np.cumsum(lengths)
    lengths = lengths[ends <= num_tokens]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    tokens = rng.integers(0, 50_000, size=int(lengths.sum()), dtype=np.uint16)
    return tokens, starts


def windows_iterator(tokens, starts, seq_len, batch):
    return pipeline.make_train_iterator(tokens, seq_len, batch, seed=0, document_starts=starts)


def _documents(tokens, starts, longest: int | None = None):
    ends = np.append(starts[1:], tokens.size)
    if longest is not None:  # first-fit takes no document longer than a bin: the rest of it is dropped
        ends = np.minimum(ends, starts + longest)
    return (
        grain.MapDataset.range(starts.size)
        .shuffle(seed=0)
        .repeat()
        .map(lambda i: {"inputs": np.asarray(tokens[starts[i] : ends[i]], dtype=np.int32)})
        .to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
    )


def concat_then_split_iterator(tokens, starts, seq_len, batch):
    packed = grain.experimental.ConcatThenSplitIterDataset(
        _documents(tokens, starts), length_struct={"inputs": seq_len}
    )
    return iter(packed.batch(batch))


def first_fit_iterator(tokens, starts, seq_len, batch):
    packed = grain.experimental.FirstFitPackIterDataset(
        _documents(tokens, starts, longest=seq_len), length_struct={"inputs": seq_len}, num_packing_bins=batch
    )
    return iter(packed.batch(batch))


PACKERS = {
    "windows": windows_iterator,
    "concat_then_split": concat_then_split_iterator,
    "first_fit": first_fit_iterator,
}


def measure(make, tokens, starts, seq_len, batch, batches) -> dict:
    iterator = make(tokens, starts, seq_len, batch)
    for _ in range(2):
        next(iterator)
    times, padding, total = [], 0, 0
    for _ in range(batches):
        start = time.perf_counter()
        element = next(iterator)
        times.append(time.perf_counter() - start)
        segments = element.get("segment_ids", element.get("inputs_segment_ids"))
        padding += int(np.sum(segments == 0))
        total += int(segments.size)
    state = iterator.get_state()
    return {
        "ms_per_batch": 1000 * statistics.median(times),
        "padding": padding / total,
        "state_bytes": len(json.dumps(state, default=repr)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small shape and few batches")
    parser.add_argument("--json", type=pathlib.Path, help="also write the results here")
    host_load.add_allow_load_flag(parser)
    args = parser.parse_args()
    seq_len, batch, batches, num_tokens = (256, 8, 10, 1 << 20) if args.quick else (2048, 32, 40, 1 << 25)
    tokens, starts = synthetic_corpus(num_tokens, mean_document=seq_len // 3, seed=0)
    before = host_load.load_average()
    results = {name: measure(make, tokens, starts, seq_len, batch, batches) for name, make in PACKERS.items()}
    after = host_load.load_average()
    host_load.refuse_unless_idle([before, after], allow_load=args.allow_load)
    baseline = results["windows"]["ms_per_batch"]
    print(
        f"packing {batch} x {seq_len} tokens per batch, {starts.size:,} documents; {host_load.describe(before, after)}"
    )
    print(f"{'packer':<18} {'ms/batch':>9} {'x windows':>10} {'padding':>8} {'state bytes':>12}")
    for name, r in results.items():
        ratio = r["ms_per_batch"] / baseline
        print(f"{name:<18} {r['ms_per_batch']:>9.3f} {ratio:>10.2f} {r['padding']:>8.1%} {r['state_bytes']:>12,}")
    if args.json:
        args.json.write_text(json.dumps({"load": [before, after], "seq_len": seq_len, "batch": batch, **results}))


if __name__ == "__main__":
    main()
