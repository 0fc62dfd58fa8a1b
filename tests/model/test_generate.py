"""Token choice (greedy, temperature, top-k, vocabulary limit) and the fixed-window generation loop."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4lm.errors import UserError
from fp4lm.model.generate import check_sampling_options, choose_token, generate

VOCAB = 10


def _successor_model(params, tokens_BT, **_):
    """Logits that put all mass on (token + 1) % VOCAB at every position."""
    return jax.nn.one_hot((tokens_BT + 1) % VOCAB, VOCAB) * params["sharpness"]


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


def test_generate_greedy_follows_the_model_and_slides_the_window():
    params = {"sharpness": jnp.asarray(20.0)}
    out = generate(
        _successor_model, params, np.array([3, 4]), max_tokens=12, seq_len=4, temperature=0.0, vocab_limit=VOCAB
    )
    assert out == [(5 + i) % VOCAB for i in range(12)]


def test_generate_sampling_is_seeded():
    params = {"sharpness": jnp.asarray(0.5)}
    kwargs = dict(max_tokens=8, seq_len=4, temperature=1.0, top_k=0, vocab_limit=VOCAB)
    a = generate(_successor_model, params, np.array([1]), seed=1, **kwargs)
    b = generate(_successor_model, params, np.array([1]), seed=1, **kwargs)
    c = generate(_successor_model, params, np.array([1]), seed=2, **kwargs)
    assert a == b and a != c


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(temperature=-1.0),
        dict(top_k=-1),
        dict(max_tokens=-2),
        # issue 11, item 15: nan/inf temperatures sampled from NaN logits (NUL bytes or noise)
        dict(temperature=float("nan")),
        dict(temperature=float("inf")),
        dict(temperature=float("-inf")),
    ],
)
def test_bad_sampling_arguments(kwargs):
    args = {"max_tokens": 2, "seq_len": 4, "vocab_limit": VOCAB, **kwargs}
    with pytest.raises(UserError):
        generate(_successor_model, {"sharpness": 1.0}, np.array([1]), **args)


def test_empty_prompt():
    with pytest.raises(UserError, match="prompt is empty"):
        generate(
            _successor_model, {"sharpness": 1.0}, np.array([], np.int32), max_tokens=2, seq_len=4, vocab_limit=VOCAB
        )


@pytest.mark.parametrize("temperature", [float("nan"), float("inf")])
def test_non_finite_temperature_names_the_option(temperature):
    with pytest.raises(UserError, match="--temperature .* must be a finite number >= 0"):
        check_sampling_options(temperature=temperature, top_k=0, max_tokens=1)
