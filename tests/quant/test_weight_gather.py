"""precision.fp4_param_gather's pieces on one device: which recipes have one weight copy to gather, where a kernel's
shards live and how they are gathered, and the refusals. On 8 devices: tests/train/test_fp4_param_gather.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, PartitionSpec

from fp4lm.config import MeshConfig, load_config
from fp4lm.errors import UserError
from fp4lm.quant import Policy
from fp4lm.quant.dot import dot_general
from fp4lm.quant.recipes import RECIPES
from fp4lm.quant.weight_gather import WeightGather
from fp4lm.sharding import MESH_AXES, fsdp_placements, make_mesh


def test_the_recipes_with_one_16x16_weight_copy_for_both_gemms():
    sharing = {name for name, recipe in RECIPES.items() if recipe.shares_weight_tiles}
    # 1x16 or MX weights, 4over6 (its transposed tile may pick the other candidate), an unquantized or
    # differently quantized dgrad weight: each needs more than the forward's tiles.
    assert sharing == {"nvfp4", "nvfp4_no_rht", "nvfp4_no_sr", "nvfp4_row_scaled", "nvfp4_bwd_dequantized"}


def _mesh(data=1, fsdp=1, expert=1, tensor=1) -> AbstractMesh:
    return AbstractMesh((data, fsdp, expert, tensor), MESH_AXES)


def test_a_kernel_is_gathered_over_the_fsdp_axes_only():
    place = lambda names, shape, mesh: fsdp_placements(names, shape, mesh, tile=16, where="layer x")  # noqa: E731
    assert place(("embed", "mlp"), (64, 128), _mesh(data=2, fsdp=4)) == (
        PartitionSpec("fsdp", None),
        PartitionSpec(None, None),
    )
    assert place(("embed", "mlp"), (64, 128), _mesh(fsdp=2, tensor=4)) == (
        PartitionSpec("fsdp", "tensor"),
        PartitionSpec(None, "tensor"),
    )
    assert place(("mlp", "embed"), (128, 64), _mesh(fsdp=2, expert=2)) == (
        PartitionSpec(None, ("fsdp", "expert")),
        PartitionSpec(None, None),
    )
    assert place(("embed", "mlp"), (64, 128), _mesh(data=8)) is None  # nothing to gather
    assert place(("embed", "mlp"), (64, 128), AbstractMesh((), ())) is None  # no mesh in context


def test_a_shard_that_splits_a_tile_is_refused():
    with pytest.raises(UserError, match=r"layer x: .* 64 / 8 \(mesh fsdp\) is not a whole number of 16x16 tiles"):
        fsdp_placements(("embed", "mlp"), (64, 128), _mesh(fsdp=8), tile=16, where="layer x")


def test_a_recipe_without_one_weight_copy_is_refused_by_name():
    config = load_config(None, ["precision.recipe=nvfp4_1d_weights", "precision.fp4_param_gather=true"])
    with pytest.raises(UserError, match=r"fp4_param_gather=true .* 'nvfp4_1d_weights' .* use one of nvfp4, "):
        Policy.from_config(config)
    one_layer = ['precision.rules=["blocks[.]0[.]attn[.]q=nvfp4_1d_weights"]', "precision.fp4_param_gather=true"]
    config = load_config(None, one_layer)
    with pytest.raises(UserError, match=r"layer blocks\.0\.attn\.q"):
        Policy.from_config(config)
    config = load_config(
        None, ["precision.recipe=nvfp4", "precision.bf16_last_layers=1", "precision.fp4_param_gather=true"]
    )
    assert Policy.from_config(config).fp4_param_gather  # bf16 layers gather their bf16 weights as before
    with pytest.raises(ValueError, match="no single 16x16 NVFP4 weight copy"):
        dot_general("mxfp4")(jnp.ones((32, 32)), jnp.ones((32, 32)), (((1,), (0,)), ((), ())), weight_gather=_gather())


def _gather() -> WeightGather:
    return WeightGather(PartitionSpec("fsdp", None), PartitionSpec(None, None))


def test_the_gathered_dot_computes_what_the_plain_one_computes():
    """On a one-device mesh the placements are no-ops: the same values and gradients, through the gather's code
    (the kernel [K, N] of a linear layer: its spec is mapped onto the GEMM's [N, K] weight)."""
    mesh = make_mesh(MeshConfig(), devices=jax.devices()[:1])
    dot = dot_general("nvfp4")
    x = jax.random.normal(jax.random.key(0), (32, 64), jnp.bfloat16)
    w = jax.random.normal(jax.random.key(1), (64, 48), jnp.bfloat16)

    def loss(x, w, gather):
        y = dot(x, w, (((1,), (0,)), ((), ())), key=jax.random.key(2), weight_gather=gather)
        return jnp.sum(y.astype(jnp.float32) ** 2)

    value_and_grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), static_argnums=2)
    plain = value_and_grads(x, w, None)
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        gathered = value_and_grads(x, w, _gather())
    for got, want in zip(jax.tree.leaves(gathered), jax.tree.leaves(plain), strict=True):
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
