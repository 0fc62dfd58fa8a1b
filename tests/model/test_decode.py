"""The KV cache in the model's own call (fp4lm.model.decode): a prefill is the plain call, each decode step
follows the full window, unrolled or scanned (a scanned group's cache stacked [L, ...]), and a cached call
refuses what it cannot do."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from fp4lm.model import Llama
from tests.fixtures.make_generate_tokens import PROMPT, fixed_model

LENGTH = 16
STEPS = 6  # decode steps after the prompt


def _jitted(model: Llama):
    """(plain(window), prefill(window), decode(cache, tokens_B1, position)) of `model`, jitted."""
    graphdef, state = nnx.split(model, nnx.Param)
    params = nnx.to_pure_dict(state)

    def plain(window_BS):
        return nnx.merge(graphdef, params)(window_BS)

    def prefill(window_BS):
        model = nnx.merge(graphdef, params)
        return model(window_BS, cache=model.init_cache(*window_BS.shape), cache_position=jnp.int32(0))

    def decode(cache, tokens_B1, position):
        return nnx.merge(graphdef, params)(tokens_B1, cache=cache, cache_position=position)

    return jax.jit(plain), jax.jit(prefill), jax.jit(decode)


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_prefill_is_the_plain_call_and_decode_steps_follow_the_full_window(scan):
    """bf16, a dense block then two MoE blocks (scanned: the first alone, the other two in one lax.scan)."""
    _, model = fixed_model("moe_nvfp4", recipe="bf16", scan=scan)
    plain, prefill, decode = _jitted(model)
    text = PROMPT + [int(t) for t in np.random.default_rng(0).integers(0, 64, STEPS)]
    window = np.zeros((1, LENGTH), np.int32)
    window[0, : len(PROMPT)] = PROMPT
    logits, cache = prefill(jnp.asarray(window))
    np.testing.assert_array_equal(np.asarray(logits), np.asarray(plain(jnp.asarray(window))))
    for position in range(len(PROMPT), len(text)):
        window[0, position] = text[position]
        step_logits, cache = decode(cache, jnp.asarray([[text[position]]], np.int32), jnp.int32(position))
        expected = np.asarray(plain(jnp.asarray(window))[0, position])
        got = np.asarray(step_logits[0, 0])
        assert np.abs(got - expected).max() <= 0.02 * np.abs(expected).max(), position


def test_a_scanned_groups_cache_is_stacked():
    kv = (1, LENGTH, 2, 16)  # B, S, K, E
    _, unrolled = fixed_model("moe_nvfp4")
    _, scanned = fixed_model("moe_nvfp4", scan=True)
    assert [cache.keys.shape for cache in unrolled.init_cache(1, LENGTH)] == [kv, kv, kv]
    assert [cache.values.shape for cache in scanned.init_cache(1, LENGTH)] == [kv, (2, *kv)]


def test_a_cached_call_takes_a_whole_window_or_one_token_without_documents():
    _, model = fixed_model("dense_nvfp4")
    cache = model.init_cache(1, LENGTH)
    with pytest.raises(ValueError, match="whole window .* or one token per row, got T=3"):
        model(jnp.zeros((1, 3), jnp.int32), cache=cache, cache_position=jnp.int32(0))
    with pytest.raises(ValueError, match="no document layout"):
        segments = jnp.zeros((1, LENGTH), jnp.int32)
        model(jnp.zeros((1, LENGTH), jnp.int32), cache=cache, cache_position=jnp.int32(0), segment_ids_BT=segments)
