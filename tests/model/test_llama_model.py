"""The decoder's structure and numerics: shapes, causality, GQA, tied embeddings, init, policies, stats.

Rematerialisation and sharding are tested in test_sharded_model.py (a subprocess with its own XLA flags).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from fp4lm.config import DebugConfig
from fp4lm.linear_layers import linear_layers
from fp4lm.model import Llama, param_count, set_policy
from fp4lm.quant.policy import Policy
from fp4lm.train.fault_injection import poisoned_forward
from tests.model.helpers import TINY, VOCAB, PlainPolicy, forward, forward_with_stats, tiny_model, tokens

pytestmark = pytest.mark.slow

QUANT_CFG = dataclasses.replace(TINY, num_layers=1)
"""Quantized tests use one block, with attention in NVFP4 and the MLP in bf16: compiling quantized
matmuls (especially their backward) is what costs time on CPU."""


def mixed_policy() -> Policy:
    return Policy("nvfp4", num_layers=1, rules=((r"blocks\.0\.mlp\..*", "bf16"),))


def bf16_policy(cfg=TINY) -> Policy:
    return Policy.bf16(cfg.num_layers)


def quantized_forward(model, quant_key=None):
    """Logits and stats of the shared quantized setup (one compilation for all tests that use it)."""
    return forward_with_stats(model, tokens(), jax.random.key(1) if quant_key is None else quant_key)


def test_forward_shapes_dtypes_and_finite():
    model = tiny_model(mixed_policy(), QUANT_CFG)
    logits, _ = quantized_forward(model)
    assert logits.shape == (2, 16, VOCAB)
    assert logits.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(logits)))
    params = jax.tree.leaves(nnx.state(model, nnx.Param))
    assert params and all(p.dtype == jnp.float32 for p in params)


def test_linear_paths_in_execution_order():
    paths = tiny_model(PlainPolicy()).linear_paths()
    names = ("attn.q", "attn.k", "attn.v", "attn.o", "mlp.gate", "mlp.up", "mlp.down")
    assert paths == [f"blocks.{i}.{name}" for i in range(TINY.num_layers) for name in names]


def test_projections_are_built_from_the_linear_layer_inventory():
    cfg = dataclasses.replace(TINY, head_dim=32, mlp_dim=96)
    model = nnx.eval_shape(lambda: Llama(cfg, VOCAB, PlainPolicy(), rngs=nnx.Rngs(0)))
    for layer in linear_layers(cfg):
        module = model
        for part in layer.path.split("."):
            module = module[int(part)] if part.isdigit() else getattr(module, part)
        assert module.path == layer.path
        assert module.kernel.shape == (layer.in_features, layer.out_features), layer.path
        assert module.kernel.get_metadata()["out_sharding"] == layer.logical_axes, layer.path


def test_perturbing_a_later_token_leaves_earlier_logits_unchanged():
    """Checked in bf16. Under NVFP4 the per-tensor amax spans every position of the batch, so a later
    token can in principle move an earlier position's quantization scale (as in any per-tensor recipe)."""
    model = tiny_model(bf16_policy())
    toks = tokens()
    t = 10
    changed = toks.at[:, t + 1 :].set((toks[:, t + 1 :] + 7) % VOCAB)
    before, after = forward(model, toks), forward(model, changed)
    np.testing.assert_array_equal(np.asarray(before[:, : t + 1]), np.asarray(after[:, : t + 1]))
    assert not np.array_equal(np.asarray(before[:, t + 1 :]), np.asarray(after[:, t + 1 :]))


def test_no_gradient_from_a_later_position_to_an_earlier_one():
    model = tiny_model(bf16_policy())
    x_BTD = model.embed(tokens()).astype(jnp.float32)
    t = 6
    graphdef, state = nnx.split(model)

    @jax.jit
    def grad_of_logits_at_t(x_BTD):
        m = nnx.merge(graphdef, state)
        return jax.grad(lambda x: m.from_embeddings(x)[:, t].sum())(x_BTD)

    grad_BTD = grad_of_logits_at_t(x_BTD)
    assert bool(jnp.all(grad_BTD[:, t + 1 :] == 0))
    assert bool(jnp.all(jnp.any(grad_BTD[:, : t + 1] != 0, axis=-1)))


def test_bf16_policy_equals_the_plain_model_exactly():
    toks = tokens()
    plain = forward(tiny_model(PlainPolicy()), toks)
    via_policy = forward(tiny_model(bf16_policy()), toks)
    np.testing.assert_array_equal(np.asarray(plain), np.asarray(via_policy))


def _reference_forward(model, toks, cfg):
    """An independent float32 transcription of the Llama forward: MHA with key/value heads repeated."""
    p = lambda v: np.asarray(v[...], np.float64)  # noqa: E731
    H, K, E = cfg.num_heads, cfg.num_kv_heads, cfg.d_model // cfg.num_heads
    x = p(model.embed.table)[np.asarray(toks)]
    length = x.shape[1]

    def norm(v, scale):
        return v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + cfg.norm_eps) * p(scale)

    def rope(v):  # v [B, T, heads, E]
        inv = cfg.rope_theta ** (-np.arange(0, E, 2) / E)
        ang = np.arange(length)[:, None] * inv[None]
        c, s = np.cos(ang)[None, :, None], np.sin(ang)[None, :, None]
        a, b = v[..., : E // 2], v[..., E // 2 :]
        return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)

    for block in model.blocks:
        h = norm(x, block.attn_norm.scale)
        q = rope((h @ p(block.attn.q.kernel)).reshape(*h.shape[:2], H, E))
        k = rope((h @ p(block.attn.k.kernel)).reshape(*h.shape[:2], K, E))
        v = (h @ p(block.attn.v.kernel)).reshape(*h.shape[:2], K, E)
        k, v = np.repeat(k, H // K, axis=2), np.repeat(v, H // K, axis=2)
        scores = np.einsum("bthe,bshe->bhts", q, k) / math.sqrt(E)
        scores = np.where(np.tril(np.ones((length, length), bool)), scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = np.einsum("bhts,bshe->bthe", probs, v).reshape(*h.shape[:2], H * E)
        x = x + attn @ p(block.attn.o.kernel)
        h = norm(x, block.mlp_norm.scale)
        gate = h @ p(block.mlp.gate.kernel)
        x = x + (gate / (1 + np.exp(-gate)) * (h @ p(block.mlp.up.kernel))) @ p(block.mlp.down.kernel)
    x = norm(x, model.final_norm.scale)
    head = p(model.embed.table).T if cfg.tie_embeddings else p(model.lm_head)
    return x @ head


@pytest.mark.parametrize("num_kv_heads", [1, 2])
def test_matches_an_independent_reference_forward(num_kv_heads):
    """Grouped-query attention (K < H shares each key/value head among H/K query heads), RoPE, SwiGLU."""
    cfg = dataclasses.replace(TINY, num_kv_heads=num_kv_heads)
    model = tiny_model(bf16_policy(), cfg)
    assert model.blocks[0].attn.k.kernel.shape == (cfg.d_model, num_kv_heads * cfg.d_model // cfg.num_heads)
    toks = tokens()
    got = np.asarray(forward(model, toks), np.float64)
    want = _reference_forward(model, toks, cfg)
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert rel < 2e-2, rel  # bfloat16 compute against a float64 reference


def test_tied_embeddings_share_the_table_with_the_lm_head():
    cfg = dataclasses.replace(TINY, tie_embeddings=True)
    tied, untied = tiny_model(bf16_policy(), cfg), tiny_model(bf16_policy(), TINY)
    assert not hasattr(tied, "lm_head")
    assert param_count(untied) - param_count(tied) == cfg.d_model * VOCAB
    toks = tokens()
    want = _reference_forward(tied, toks, cfg)
    np.testing.assert_allclose(np.asarray(forward(tied, toks)), want, rtol=0.05, atol=0.05)
    # The same weights with the head set to the table's transpose give the same logits.
    nnx.update(untied, nnx.state(tied, nnx.Param))
    untied.lm_head[...] = tied.embed.table[...].T
    np.testing.assert_allclose(np.asarray(forward(untied, toks)), np.asarray(forward(tied, toks)), rtol=1e-6, atol=1e-6)


def test_param_count_matches_the_hand_formula():
    for tie in (False, True):
        cfg = dataclasses.replace(TINY, tie_embeddings=tie)
        D, F, E = cfg.d_model, cfg.mlp_dim, cfg.d_model // cfg.num_heads
        attention = D * cfg.num_heads * E * 2 + D * cfg.num_kv_heads * E * 2
        per_block = attention + 3 * D * F + 2 * D
        expected = VOCAB * D * (1 if tie else 2) + cfg.num_layers * per_block + D
        abstract = nnx.eval_shape(lambda: Llama(cfg, VOCAB, PlainPolicy(), rngs=nnx.Rngs(0)))  # noqa: B023
        assert param_count(abstract) == expected


def test_initialisation_scales_output_projections():
    model = tiny_model(PlainPolicy())
    block = model.blocks[1]
    std = lambda v: float(jnp.std(v[...]))  # noqa: E731
    scaled = TINY.init_std / math.sqrt(2 * TINY.num_layers)
    assert std(block.attn.q.kernel) == pytest.approx(TINY.init_std, rel=0.05)
    assert std(model.embed.table) == pytest.approx(TINY.init_std, rel=0.05)
    assert std(block.attn.o.kernel) == pytest.approx(scaled, rel=0.05)
    assert std(block.mlp.down.kernel) == pytest.approx(scaled, rel=0.05)
    assert bool(jnp.all(block.attn_norm.scale[...] == 1))


def test_set_policy_keeps_parameters_and_changes_numerics():
    quantized = tiny_model(mixed_policy(), QUANT_CFG)
    key = jax.random.key(1)
    switched = set_policy(quantized, bf16_policy(QUANT_CFG))
    for a, b in zip(jax.tree.leaves(nnx.state(quantized)), jax.tree.leaves(nnx.state(switched)), strict=True):
        assert a is b  # the very same arrays, nothing copied or re-drawn
    assert switched.blocks[0].attn.q.policy == bf16_policy(QUANT_CFG)
    fresh = tiny_model(bf16_policy(QUANT_CFG), QUANT_CFG)  # a bf16 model with the same initial weights
    bf16_logits = forward(switched, tokens())
    np.testing.assert_array_equal(np.asarray(bf16_logits), np.asarray(forward(fresh, tokens())))
    quantized_logits = quantized_forward(quantized, key)[0]
    assert not np.array_equal(np.asarray(bf16_logits), np.asarray(quantized_logits))
    back = set_policy(switched, mixed_policy())
    np.testing.assert_array_equal(np.asarray(quantized_forward(back, key)[0]), np.asarray(quantized_logits))


def test_activation_poison_reaches_the_logits():
    model = tiny_model(bf16_policy())
    toks = tokens()
    poisoned = nnx.jit(poisoned_forward(DebugConfig(inject_nonfinite_at=2, inject_nonfinite_into="activations")))
    # Equal up to bfloat16 rounding: XLA may fuse the extra add differently (excess precision on CPU).
    clean = np.asarray(poisoned(model, toks, quant_key=None, step_number=1))
    np.testing.assert_allclose(clean, np.asarray(forward(model, toks)), atol=0.05)
    assert bool(jnp.all(jnp.isnan(poisoned(model, toks, quant_key=None, step_number=2))))


@dataclasses.dataclass(frozen=True)
class KeyRecordingPolicy(PlainPolicy):
    """Records the key each layer passes to its dot (eager mode only)."""

    seen: dict = dataclasses.field(default_factory=dict, hash=False, compare=False)

    def dot_general_for(self, path):
        plain = super().dot_general_for(path)

        def dot(lhs, rhs, dims, precision=None, preferred_element_type=None, *, key=None):
            self.seen[path] = key
            return plain(lhs, rhs, dims, preferred_element_type=preferred_element_type)

        return dot

    def layer_seed(self, path):
        return len(path) * 1000 + sum(map(ord, path))


def test_each_layer_folds_its_seed_into_the_quant_key():
    policy = KeyRecordingPolicy()
    model = tiny_model(policy, QUANT_CFG)
    model(tokens())
    assert set(policy.seen) == set(model.linear_paths()) and all(k is None for k in policy.seen.values())
    step_key = jax.random.key(42)
    model(tokens(), quant_key=step_key)
    for path, key in policy.seen.items():
        want = jax.random.fold_in(step_key, policy.layer_seed(path))
        np.testing.assert_array_equal(jax.random.key_data(key), jax.random.key_data(want))


def test_collect_stats_reports_finite_numbers_for_quantized_layers_only():
    model = tiny_model(mixed_policy(), QUANT_CFG)
    _, stats = quantized_forward(model)
    assert set(stats) == {"blocks.0.attn.q", "blocks.0.attn.k", "blocks.0.attn.v", "blocks.0.attn.o"}
    for path, operands in stats.items():
        assert set(operands) == {"x", "w"}, path
        for operand, metrics in operands.items():
            assert set(metrics) == {"rel_err", "saturated_frac", "underflow_frac", "amax"}
            for name, value in metrics.items():
                assert jnp.shape(value) == () and bool(jnp.isfinite(value)), (path, operand, name)
            assert 0 < float(metrics["rel_err"]) < 0.5 and float(metrics["amax"]) > 0
