"""Fault injection from outside the model: the telemetry step sees the poison the train step saw."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from fp4lm.config import DebugConfig
from fp4lm.quant.policy import Policy
from fp4lm.train.fault_injection import injection_active, poisoned_forward
from fp4lm.train.step import make_stats_step, model_stats, run_model
from tests.model.helpers import TINY, tiny_model, tokens

pytestmark = pytest.mark.slow

CFG = dataclasses.replace(TINY, num_layers=1)
ACTIVATIONS = DebugConfig(inject_nonfinite_at=2, inject_nonfinite_steps=2, inject_nonfinite_into="activations")


def _stats_steps(debug: DebugConfig):
    model = tiny_model(Policy("nvfp4", num_layers=1, rules=((r"blocks\.0\.mlp\..*", "bf16"),)), CFG)
    graphdef, state = nnx.split(model, nnx.Param)
    clean = jax.jit(make_stats_step(model_stats(graphdef, run_model)))
    poisoned = jax.jit(make_stats_step(model_stats(graphdef, poisoned_forward(debug))))
    rng = jax.random.key_data(jax.random.key(3))
    return nnx.to_pure_dict(state), {"inputs": tokens()}, rng, clean, poisoned


def _finite(stats) -> bool:
    return all(math.isfinite(float(v)) for v in jax.tree.leaves(stats))


def test_injection_window():
    active = [bool(injection_active(jnp.int32(step), ACTIVATIONS)) for step in range(1, 6)]
    assert active == [False, True, True, False, False]
    assert poisoned_forward(DebugConfig()) is None


def test_poisoned_activations_reach_the_telemetry_only_on_poisoned_steps():
    params, batch, rng, clean, poisoned = _stats_steps(ACTIVATIONS)
    for step in (1, 4):
        want = jax.device_get(clean(params, batch, rng, jnp.int32(step)))
        got = jax.device_get(poisoned(params, batch, rng, jnp.int32(step)))
        assert _finite(got) and set(got) == set(want)
        jax.tree.map(np.testing.assert_array_equal, got, want)
    stats = jax.device_get(poisoned(params, batch, rng, jnp.int32(2)))
    assert not _finite(stats["blocks.0.attn.q"]["x"]) and _finite(stats["blocks.0.attn.q"]["w"])


def test_poisoned_gradients_leave_the_forward_telemetry_alone():
    params, batch, rng, clean, poisoned = _stats_steps(DebugConfig(inject_nonfinite_at=1))
    got = jax.device_get(poisoned(params, batch, rng, jnp.int32(1)))
    jax.tree.map(np.testing.assert_array_equal, got, jax.device_get(clean(params, batch, rng, jnp.int32(1))))


def test_poisoned_forwards_pass_the_document_layout_on():
    """With document masking the batch carries segment ids and positions: the poisoned forwards must pass them to
    the model (a masked batch gives the masked model's logits on a clean step)."""
    model = tiny_model(Policy("bf16", num_layers=1), CFG)
    tokens_BT = tokens()
    batch_size, length = tokens_BT.shape
    segment_ids = jnp.broadcast_to((jnp.arange(length) >= length // 2).astype(jnp.int32) + 1, (batch_size, length))
    positions = jnp.where(segment_ids == 1, jnp.arange(length), jnp.arange(length) - length // 2)
    layout = {"segment_ids_BT": segment_ids, "positions_BT": positions}
    want = run_model(model, tokens_BT, quant_key=None, step_number=jnp.int32(1), **layout)
    assert not np.allclose(want, run_model(model, tokens_BT, quant_key=None, step_number=jnp.int32(1)))
    for into in ("grads", "activations"):
        forward = poisoned_forward(DebugConfig(inject_nonfinite_at=5, inject_nonfinite_into=into))
        assert forward is not None
        got = forward(model, tokens_BT, quant_key=None, step_number=jnp.int32(1), **layout)
        np.testing.assert_array_equal(got, want)
