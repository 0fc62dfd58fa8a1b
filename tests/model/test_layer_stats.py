"""Telemetry through NNX state: quantized layers store LayerStats when asked, the caller pops them."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from fp4lm.model import collect_layer_stats, pop_layer_stats
from fp4lm.model.layers import COMPUTE_DTYPE
from fp4lm.quant.policy import Policy
from fp4lm.quant.stats import layer_stats
from tests.model.helpers import TINY, forward_with_stats, tiny_model, tokens

pytestmark = pytest.mark.slow

CFG = dataclasses.replace(TINY, num_layers=1)


def _policy() -> Policy:
    return Policy("nvfp4", num_layers=1, rules=((r"blocks\.0\.mlp\..*", "bf16"),))


def test_stats_equal_a_direct_computation_and_leave_no_state_behind():
    model = tiny_model(_policy(), CFG)
    toks = tokens()
    _, stats = forward_with_stats(model, toks)
    assert set(stats) == {"blocks.0.attn.q", "blocks.0.attn.k", "blocks.0.attn.v", "blocks.0.attn.o"}
    block = model.blocks[0]
    x_BTD = block.attn_norm(model.embed(toks)).astype(COMPUTE_DTYPE)
    want = jax.jit(layer_stats, static_argnums=2)(
        x_BTD, block.attn.q.kernel[...].astype(COMPUTE_DTYPE), _policy().recipe_for("blocks.0.attn.q")
    )
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(stats["blocks.0.attn.q"]), jax.device_get(want))
    # Nothing is left in the model: its state is parameters only, and telemetry is off again.
    assert not nnx.state(model, nnx.Not(nnx.Param))
    assert not any(getattr(m, "collect_stats", False) for _, m in nnx.iter_graph(model))


def test_stats_are_the_same_under_remat():
    toks = tokens()
    _, plain = forward_with_stats(tiny_model(_policy(), CFG), toks)
    for mode in ("full", "save_quantized"):
        _, remat = forward_with_stats(tiny_model(_policy(), dataclasses.replace(CFG, remat=mode)), toks)
        assert set(remat) == set(plain)
        jax.tree.map(np.testing.assert_array_equal, jax.device_get(remat), jax.device_get(plain))


def test_without_collect_layer_stats_nothing_is_stored():
    model = tiny_model(_policy(), CFG)
    model(tokens())
    assert pop_layer_stats(model) == {}
    collect_layer_stats(model)
    model(tokens())
    assert len(pop_layer_stats(model)) == 4
    assert pop_layer_stats(model) == {}  # popped: a second pop finds nothing
