"""Who runs which experts under expert parallelism (fp4lm.model.expert_parallel), on abstract meshes (no
devices): the refusal of an expert axis that does not divide the experts, the experts per device when a
shard's experts do not split evenly over its devices, and the bound on a device's rows; the refusals of a
batch that does not split over the mesh and of a model built for a mesh traced without one. The telemetry of such
splits, on 8 fake devices, is in test_expert_parallel.py (slow)."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.sharding import AbstractMesh

from fp4lm.config import ModelConfig, load_config
from fp4lm.errors import UserError
from fp4lm.model import Llama
from fp4lm.model.expert_parallel import experts_per_device, owned_experts, rows_bound
from fp4lm.model.moe import set_expert_parallel
from fp4lm.quant import Policy
from fp4lm.sharding import MESH_AXES
from tests.train.conftest import TINY
from tests.train.test_collectives import EIGHT_DEVICES, REPO


def mesh(data=1, fsdp=1, expert=1, tensor=1) -> AbstractMesh:
    sizes = {"data": data, "fsdp": fsdp, "expert": expert, "tensor": tensor}
    return AbstractMesh(tuple(sizes[axis] for axis in MESH_AXES), MESH_AXES)


def test_an_expert_axis_that_does_not_divide_the_experts_is_refused():
    base = ["model.num_layers=2", "model.num_experts=6", "model.moe_mlp_dim=32"]
    with pytest.raises(UserError, match=r"mesh.expert=4 does not divide model.num_experts=6"):
        load_config(None, [*base, "mesh.expert=4"])
    assert load_config(None, [*base, "mesh.expert=3"]).mesh.expert == 3


@pytest.mark.parametrize(
    ("experts", "sizes", "want"),
    [
        (8, {"expert": 2, "fsdp": 2, "tensor": 2}, (4, 1)),  # even: 4 per shard over 4 devices
        (12, {"expert": 4, "data": 2}, (3, 2)),  # 3 over 2 devices: ceil, the second runs one
        (6, {"expert": 2, "fsdp": 2, "tensor": 2}, (3, 1)),  # 3 over 4 devices: one runs none
        (10, {"expert": 2, "data": 4}, (5, 2)),  # 5 over 4: 2, 2, 1, 0
        (4, {"expert": 4, "data": 2}, (1, 1)),  # 1 over 2
    ],
)
def test_a_shards_experts_split_over_its_devices_rounding_up(experts, sizes, want):
    """(X / E, ceil(X / (E · R))), R = data · fsdp · tensor: every expert of a shard has a device."""
    assert owned_experts(experts, mesh(**sizes)) == want
    owners = sizes.get("data", 1) * sizes.get("fsdp", 1) * sizes.get("tensor", 1)
    assert experts_per_device(experts, expert=sizes["expert"], owners=owners) == want[1]
    assert want[1] * owners >= want[0] > (want[1] - 1) * owners


@pytest.mark.parametrize(
    ("tokens", "k", "runs", "capacity", "want"),
    [
        (100, 2, 1, None, 100),  # one expert: each token at most once
        (100, 2, 3, None, 200),  # k distinct experts: at most k of a token's pairs
        (100, 4, 3, None, 300),  # at most one pair per expert it runs
        (100, 2, 3, 30, 90),  # the capacities bind
        (100, 2, 3, 80, 200),  # the tokens bind
    ],
)
def test_a_devices_rows_are_bounded_by_its_tokens_and_capacities(tokens, k, runs, capacity, want):
    assert rows_bound(tokens, k, runs, capacity) == want


def test_a_batch_that_does_not_split_over_the_experts_mesh_is_one_line_before_the_run(tmp_path):
    """The experts run split over the mesh whenever it has several devices; 6 sequences over the 4 devices of
    mesh.fsdp * mesh.expert do not split: `fp4lm train` stops with one line (exit 2), before writing anything."""
    moe = ["model.num_experts=4", "model.experts_per_token=2", "model.moe_mlp_dim=32", "train.steps=1"]
    mesh_cfg = ["mesh.expert=2", "mesh.fsdp=2", "mesh.tensor=2"]
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COORDINATOR")}
    env.update(EIGHT_DEVICES, PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", "fp4lm", "train", *TINY, *moe, *mesh_cfg, f"train.run_dir={run_dir}"]
    done = subprocess.run([*command, "train.batch_size=6"], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert "a micro-batch of 6 sequences" in done.stderr and "make it a multiple of 4" in done.stderr
    assert not run_dir.exists()


def test_experts_built_to_split_over_the_mesh_never_fall_back_to_one_device():
    """A MoE model built for expert parallelism (the trainer's, on a mesh of several devices) traced without
    the step's mesh is an error, not the one-device code."""
    cfg = ModelConfig(num_layers=1, d_model=32, num_heads=2, num_kv_heads=1, num_experts=4, moe_mlp_dim=32)
    model = Llama(cfg, 64, Policy("bf16", num_layers=1), rngs=nnx.Rngs(0))
    tokens_BT = jnp.zeros((2, 8), jnp.int32)
    assert model(tokens_BT).shape == (2, 8, 64)
    set_expert_parallel(model)
    with pytest.raises(UserError, match="the experts were built to run split over the step's mesh"):
        jax.eval_shape(lambda tokens_BT: model(tokens_BT), tokens_BT)
