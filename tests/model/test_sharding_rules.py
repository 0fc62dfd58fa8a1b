"""fp4lm.sharding without devices: mesh sizes, the logical-axis table and its divisibility fallback."""

from __future__ import annotations

import jax
import pytest
from flax import nnx
from jax.sharding import AbstractMesh, PartitionSpec

from fp4lm.config import MeshConfig
from fp4lm.errors import UserError
from fp4lm.model import Llama
from fp4lm.sharding import MESH_AXES, batch_sharding, logical_to_spec, make_mesh, mesh_shape, model_shardings
from tests.model.helpers import TINY, VOCAB, PlainPolicy

MESH_222 = AbstractMesh((2, 2, 1, 2), MESH_AXES)  # data, fsdp, expert, tensor
MESH_EXPERT = AbstractMesh((2, 1, 4, 1), MESH_AXES)


def test_minus_one_takes_the_rest_of_the_devices():
    assert mesh_shape(MeshConfig(data=1, fsdp=-1, tensor=1), 8) == (1, 8, 1, 1)
    assert mesh_shape(MeshConfig(data=2, fsdp=1, tensor=-1), 8) == (2, 1, 1, 4)
    assert mesh_shape(MeshConfig(data=2, fsdp=2, tensor=2), 8) == (2, 2, 1, 2)
    assert mesh_shape(MeshConfig(data=2, fsdp=-1, expert=4), 8) == (2, 1, 4, 1)


@pytest.mark.parametrize(
    "mesh_cfg", [MeshConfig(data=2, fsdp=2, tensor=1), MeshConfig(data=3, fsdp=-1, tensor=1), MeshConfig(fsdp=16)]
)
def test_sizes_that_do_not_fit_the_devices_are_a_user_error(mesh_cfg):
    with pytest.raises(UserError, match=r"mesh\.data=.*8 devices"):
        mesh_shape(mesh_cfg, 8)


def test_make_mesh_on_this_host():
    mesh = make_mesh(MeshConfig(data=1, fsdp=-1, tensor=1))
    assert mesh.axis_names == MESH_AXES
    assert mesh.devices.size == jax.device_count()
    assert batch_sharding(mesh).spec == PartitionSpec(("data", "fsdp", "expert"), None)
    with pytest.raises(UserError, match=f"{jax.device_count()} devices"):
        make_mesh(MeshConfig(data=jax.device_count() + 1, fsdp=1, tensor=1))


def test_logical_axes_map_onto_the_mesh():
    assert logical_to_spec(("embed", "mlp"), MESH_222) == PartitionSpec("fsdp", "tensor")
    assert logical_to_spec(("vocab", "embed"), MESH_222) == PartitionSpec("tensor", "fsdp")
    assert logical_to_spec(("batch", "length"), MESH_222) == PartitionSpec(("data", "fsdp"), None)
    assert logical_to_spec(("norm",), MESH_222) == PartitionSpec(None)


def test_the_expert_axis_splits_the_experts_and_the_batch():
    assert logical_to_spec(("expert", "embed", "mlp"), MESH_EXPERT) == PartitionSpec("expert", None, None)
    assert logical_to_spec(("batch", "length"), MESH_EXPERT) == PartitionSpec(("data", "expert"), None)
    assert logical_to_spec(("expert", "embed", "mlp"), MESH_222) == PartitionSpec(None, "fsdp", "tensor")
    # The other parameters are sharded over it as over fsdp.
    assert logical_to_spec(("embed", "mlp"), MESH_EXPERT) == PartitionSpec("expert", None)
    assert logical_to_spec(("embed", "mlp"), AbstractMesh((1, 2, 4, 1), MESH_AXES)) == PartitionSpec(
        ("fsdp", "expert"), None
    )


def test_a_dimension_the_mesh_does_not_divide_stays_whole():
    assert logical_to_spec(("vocab", "embed"), MESH_222, shape=(2047, 64)) == PartitionSpec(None, "fsdp")
    assert logical_to_spec(("batch", None), MESH_222, shape=(6, 16)) == PartitionSpec(None, None)
    # Size-1 mesh axes are left out of the spec.
    assert logical_to_spec(("embed", "mlp"), AbstractMesh((4, 1, 1, 2), MESH_AXES)) == PartitionSpec(None, "tensor")


def test_model_shardings_mirror_the_state():
    abstract = nnx.eval_shape(lambda: Llama(TINY, VOCAB, PlainPolicy(), rngs=nnx.Rngs(0)))
    shardings = model_shardings(abstract, MESH_222)
    state = nnx.state(abstract)
    assert jax.tree.structure(shardings) == jax.tree.structure(state)
    block = shardings["blocks"][0]
    assert block["attn"]["q"]["kernel"].get_value().spec == PartitionSpec("fsdp", "tensor")
    assert block["attn"]["o"]["kernel"].get_value().spec == PartitionSpec("tensor", "fsdp")
    assert block["mlp"]["down"]["kernel"].get_value().spec == PartitionSpec("tensor", "fsdp")
    assert block["attn_norm"]["scale"].get_value().spec == PartitionSpec(None)
    assert shardings["embed"]["table"].get_value().spec == PartitionSpec("tensor", "fsdp")
    assert shardings["lm_head"].get_value().spec == PartitionSpec("fsdp", "tensor")
