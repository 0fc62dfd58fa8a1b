"""Scanned layers (model.scan_layers, fp4lm.model.scan): the same model as the unrolled loop — parameters,
precision groups, stochastic-rounding keys, telemetry rows — with one compiled block per group."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax import lax

from fp4lm.config import SCAN_LAYERS_FROM, ModelConfig
from fp4lm.model import Llama, collect_layer_stats, pop_layer_stats
from fp4lm.model.scan import block_groups
from fp4lm.quant.policy import Policy

pytestmark = pytest.mark.slow

CFG = ModelConfig(num_layers=3, d_model=32, num_heads=2, num_kv_heads=1, mlp_dim=64, init_std=0.05)
VOCAB = 64
TOKENS = jnp.arange(32).reshape(2, 16) % VOCAB


@dataclasses.dataclass(frozen=True)
class _NotQuantized:
    is_quantized: bool = False


@dataclasses.dataclass(frozen=True)
class NoisyPolicy:
    """Every projection adds noise drawn from its own key: the output shows which key each layer was given."""

    shared_weight_scale: bool = False
    attention: str = "bf16"  # precision.attention
    fp4_param_gather: bool = False

    def dot_general_for(self, path):
        def noisy_dot(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, *, key):
            out = lax.dot_general(lhs, rhs, dimension_numbers, preferred_element_type=preferred_element_type)
            return out + 0.1 * jax.random.normal(key, out.shape, out.dtype)

        return noisy_dot

    def layer_seed(self, path):
        return Policy("bf16", num_layers=0).layer_seed(path)

    def recipe_for(self, path):
        return _NotQuantized()


def _model(policy, *, scan: bool, cfg: ModelConfig = CFG) -> Llama:
    return Llama(dataclasses.replace(cfg, scan_layers=scan), VOCAB, policy, rngs=nnx.Rngs(0))


def test_default_scans_from_the_threshold():
    assert not ModelConfig(num_layers=SCAN_LAYERS_FROM - 1).resolved_scan_layers
    assert ModelConfig(num_layers=SCAN_LAYERS_FROM).resolved_scan_layers
    assert ModelConfig(num_layers=2, scan_layers=True).resolved_scan_layers
    assert not ModelConfig(num_layers=64, scan_layers=False).resolved_scan_layers


def test_blocks_of_another_precision_are_separate_groups():
    policy = Policy(
        "nvfp4", num_layers=7, bf16_first_layers=1, bf16_last_layers=2, rules=[(r"blocks\.3\.mlp\.down", "bf16")]
    )
    model = nnx.eval_shape(lambda: _model(policy, scan=True, cfg=dataclasses.replace(CFG, num_layers=7)))
    assert block_groups(model.blocks) == [[0], [1, 2], [3], [4], [5, 6]]
    # the late bf16 switch: every block alike, one group
    model = nnx.eval_shape(lambda: _model(Policy.bf16(7), scan=True, cfg=dataclasses.replace(CFG, num_layers=7)))
    assert block_groups(model.blocks) == [list(range(7))]


def test_scanned_blocks_compute_the_unrolled_model_with_each_layers_key():
    """Op by op (no XLA fusion, so bf16 rounding happens at the same places) the two are bit-identical; each
    layer's noise comes from its own key, so a scan that gave layers the wrong keys would differ."""
    key = jax.random.key(3)
    with jax.disable_jit():
        unrolled = _model(NoisyPolicy(), scan=False)(TOKENS, quant_key=key)
        scanned = _model(NoisyPolicy(), scan=True)(TOKENS, quant_key=key)
        other_key = _model(NoisyPolicy(), scan=True)(TOKENS, quant_key=jax.random.key(4))
    assert jnp.array_equal(unrolled, scanned)
    assert not jnp.array_equal(scanned, other_key)


def _loss_and_grads(model: Llama, key):
    graphdef, params = nnx.split(model)

    def loss(params):
        return jnp.mean(nnx.merge(graphdef, params)(TOKENS, quant_key=key) ** 2)

    return jax.jit(jax.value_and_grad(loss))(params)


def test_scanned_gradients_with_remat_match_the_unrolled_ones():
    policy = Policy.bf16(3)
    loss_u, grads_u = _loss_and_grads(_model(policy, scan=False), None)
    remat = dataclasses.replace(CFG, remat="full")
    loss_s, grads_s = _loss_and_grads(_model(policy, scan=True, cfg=remat), None)
    # compiled, XLA fuses the scan body differently from the unrolled blocks: bf16 roundings move a little
    assert jnp.allclose(loss_u, loss_s, rtol=1e-2)
    for g_u, g_s in zip(jax.tree.leaves(grads_u), jax.tree.leaves(grads_s), strict=True):
        assert g_u.shape == g_s.shape
        assert jnp.linalg.norm(g_u - g_s) <= 0.03 * jnp.linalg.norm(g_u) + 1e-9


def test_telemetry_rows_keep_their_layer_names():
    policy = Policy("nvfp4", num_layers=3)
    rows = {}
    for scan in (False, True):
        graphdef, params = nnx.split(_model(policy, scan=scan))

        def stats(params, graphdef=graphdef):
            model = nnx.merge(graphdef, params)
            collect_layer_stats(model)
            model(TOKENS)
            return pop_layer_stats(model)

        rows[scan] = jax.jit(stats)(params)
    assert sorted(rows[True]) == sorted(rows[False])
    assert len(rows[True]) == 3 * 7
    for path, row in rows[False].items():  # each row is its own layer's: the weights' statistics are exact
        assert jax.tree.all(jax.tree.map(jnp.array_equal, row["w"], rows[True][path]["w"])), path
        assert jnp.allclose(row["x"]["amax"], rows[True][path]["x"]["amax"], rtol=0.05), path


def test_scanned_program_holds_one_block_per_group():
    """The lowered program of 6 scanned blocks has the matmuls of one block, the unrolled one those of six."""
    cfg = dataclasses.replace(CFG, num_layers=6)

    def dot_count(scan: bool) -> int:
        model = nnx.eval_shape(lambda: _model(Policy.bf16(6), scan=scan, cfg=cfg))
        graphdef, params = nnx.split(model)
        lowered = jax.jit(lambda p, t: nnx.merge(graphdef, p)(t)).lower(params, TOKENS)
        return lowered.as_text().count("dot_general")

    assert dot_count(scan=False) >= 6 * 7
    assert dot_count(scan=True) < 2 * 7
