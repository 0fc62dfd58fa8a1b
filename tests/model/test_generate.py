"""Token choice (greedy, temperature, top-k, vocabulary limit) and the generator's arguments and seeds.
(The generator's tokens for fixed models: test_generate_tokens.py.)"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from fp4lm.config import ModelConfig
from fp4lm.errors import UserError
from fp4lm.model import Llama
from fp4lm.model.generate import check_sampling_options, choose_token, generate
from fp4lm.quant import Policy

VOCAB = 10


@functools.cache
def _tiny_model() -> tuple[nnx.GraphDef, dict]:
    """(graphdef, params) of a one-block bf16 model with a context of 4 positions."""
    cfg = ModelConfig(num_layers=1, d_model=16, num_heads=2, num_kv_heads=1, mlp_dim=32, init_std=0.5)
    graphdef, state = nnx.split(Llama(cfg, VOCAB, Policy("bf16", num_layers=1), rngs=nnx.Rngs(0)), nnx.Param)
    return graphdef, nnx.to_pure_dict(state)


def _generate(prompt, **options) -> list[int]:
    graphdef, params = _tiny_model()
    return generate(graphdef, params, np.asarray(prompt, np.int32), **{"seq_len": 4, "vocab_limit": VOCAB, **options})


def test_greedy_is_argmax():
    logits = jnp.array([0.1, 3.0, 0.2, 2.9])
    assert int(choose_token(logits, jax.random.key(0), temperature=0.0, top_k=0, vocab_limit=4)) == 1


def test_vocab_limit_excludes_padding_ids():
    logits = jnp.array([0.1, 0.2, 0.3, 9.0])
    assert int(choose_token(logits, jax.random.key(0), temperature=0.0, top_k=0, vocab_limit=3)) == 2
    draws = {int(choose_token(logits, jax.random.key(i), temperature=5.0, top_k=0, vocab_limit=3)) for i in range(50)}
    assert 3 not in draws and len(draws) > 1


def test_top_k_restricts_the_draws():
    logits = jnp.array([1.0, 1.1, 1.2, 5.0, 4.9, 0.0])
    draws = {int(choose_token(logits, jax.random.key(i), temperature=10.0, top_k=2, vocab_limit=6)) for i in range(60)}
    assert draws == {3, 4}


def test_sampling_is_seeded():
    """Past the context too (4 positions, 8 new tokens): the same seed draws the same text, another seed another."""
    kwargs = dict(max_tokens=8, temperature=1.0, top_k=0)
    a = _generate([1], seed=1, **kwargs)
    assert len(a) == 8 and a == _generate([1], seed=1, **kwargs) and a != _generate([1], seed=2, **kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(temperature=-1.0),
        dict(top_k=-1),
        dict(max_tokens=-2),
        # nan/inf temperatures would sample from NaN logits (NUL bytes or noise)
        dict(temperature=float("nan")),
        dict(temperature=float("inf")),
        dict(temperature=float("-inf")),
    ],
)
def test_bad_sampling_arguments(kwargs):
    with pytest.raises(UserError):
        _generate([1], **{"max_tokens": 2, **kwargs})


def test_empty_prompt():
    with pytest.raises(UserError, match="prompt is empty"):
        _generate([], max_tokens=2)


def test_a_prompt_longer_than_the_context_is_refused():
    with pytest.raises(UserError, match="longer than the model's context of 4"):
        _generate([1, 2, 3, 4, 5], max_tokens=2)


@pytest.mark.parametrize("temperature", [float("nan"), float("inf")])
def test_non_finite_temperature_names_the_option(temperature):
    with pytest.raises(UserError, match="--temperature .* must be a finite number >= 0"):
        check_sampling_options(temperature=temperature, top_k=0, max_tokens=1)
