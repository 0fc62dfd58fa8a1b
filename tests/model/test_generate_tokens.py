"""The generator chooses exactly the recorded tokens (tests/fixtures/generate_tokens.json, made by
tests/fixtures/make_generate_tokens.py with the generator as it was before the KV cache moved into the model's
own call) for fixed models: greedy and sampled with a fixed seed, past the context (where the cache is rebuilt)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flax import nnx

from fp4lm.model.generate import generate
from tests.fixtures.make_generate_tokens import MAX_TOKENS, MODELS, OUT, PROMPT, SAMPLINGS, SEQ_LEN, VOCAB, fixed_model

RECORDED = json.loads(OUT.read_text())["cached"]


@pytest.mark.parametrize("name", list(MODELS))
def test_the_generator_chooses_the_recorded_tokens(name):
    _, model = fixed_model(name)
    graphdef, state = nnx.split(model, nnx.Param)
    params = nnx.to_pure_dict(state)
    for sampling, options in SAMPLINGS.items():
        args = {"max_tokens": MAX_TOKENS, "seq_len": SEQ_LEN, "vocab_limit": VOCAB, **options}
        assert generate(graphdef, params, np.asarray(PROMPT), **args) == RECORDED[f"{name}/{sampling}"], sampling
