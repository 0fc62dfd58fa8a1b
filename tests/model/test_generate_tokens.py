"""The generator chooses exactly the recorded tokens (tests/fixtures/generate_tokens.json, made by
tests/fixtures/make_generate_tokens.py) for fixed models: greedy and sampled with a fixed seed, past the context
(where the cache is rebuilt), with the blocks unrolled or scanned."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from flax import nnx

from fp4lm.model import Llama
from fp4lm.model.generate import generate_cached
from tests.fixtures.make_generate_tokens import MAX_TOKENS, MODELS, OUT, PROMPT, SAMPLINGS, SEQ_LEN, VOCAB, fixed_model

RECORDED = json.loads(OUT.read_text())["cached"]


def _tokens(model: Llama, options: dict) -> list[int]:
    graphdef, state = nnx.split(model, nnx.Param)
    args = {"max_tokens": MAX_TOKENS, "seq_len": SEQ_LEN, "vocab_limit": VOCAB, **options}
    return generate_cached(graphdef, nnx.to_pure_dict(state), np.asarray(PROMPT), **args)


# The MoE model scanned runs both kinds of group: its dense block alone, its two MoE blocks in one lax.scan.
CASES = [(name, False) for name in MODELS] + [("moe_nvfp4", True)]


@pytest.mark.parametrize(
    ("name", "scan"), CASES, ids=[f"{name}-{'scanned' if scan else 'unrolled'}" for name, scan in CASES]
)
def test_the_generator_chooses_the_recorded_tokens(name, scan):
    cfg, model = fixed_model(name)
    if scan:
        model.cfg = dataclasses.replace(cfg, scan_layers=True)
    for sampling, options in SAMPLINGS.items():
        assert _tokens(model, options) == RECORDED[f"{name}/{sampling}"], sampling
