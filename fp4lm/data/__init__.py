"""Data: sources prepared into token shards, mixtures, the fixed validation sets and the grain pipeline.

`build(data_cfg, run_dir=..., seed=..., batch_size=...)` is the one call the trainer needs; it only reads the
run directory, and `Data.save(run_dir)` leaves the tokenizer and data cache there once a run is accepted.

Sources: `data.path` (a raw file or directory, a prepared directory, or a bundled corpus), or
`data.sources` (a mixture of such sources with weights, fp4lm/data/mixture.py). A raw source is prepared by
`fp4lm prepare`'s code into a cache (fp4lm/data/raw_source.py), so every source is read as prepared shards.
Validation: each source's held-out documents, or the tail of a single-document source, or `data.val_path`.
With several sources each has its own validation set, evaluated separately (`val_loss/<name>`).

The names below are imported on first use: `fp4lm prepare`'s worker processes import fp4lm.data.prepare,
which must not pull in grain and JAX (seconds per worker) through this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> the module that defines it
_EXPORTS = {
    "Data": "training_data",
    "ValidationSet": "training_data",
    "build": "training_data",
    "TrainIterator": "pipeline",
    "PreparedCorpus": "prepared",
}
__all__ = ["Data", "PreparedCorpus", "TrainIterator", "ValidationSet", "build"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups do not come here
    return value


if TYPE_CHECKING:
    from fp4lm.data.pipeline import TrainIterator
    from fp4lm.data.prepared import PreparedCorpus
    from fp4lm.data.training_data import Data, ValidationSet, build
