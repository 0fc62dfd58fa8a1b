"""Runs in a subprocess with 8 fake CPU devices (see test_expert_parallel.py): one case of CASES, named on the
command line; prints one JSON line.

A one-block MoE model's loss and gradients on one device against the same on a mesh with the experts split
(mesh.expert=4 mesh.data=2, and mesh.expert=2 mesh.fsdp=2 mesh.tensor=2), in bf16 and NVFP4 (stochastic
rounding on), dropless and with a capacity. The UNEVEN cases run the forward alone with telemetry on, with an
expert shard's experts split unevenly over its devices (`telemetry`).
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from fp4lm.config import MeshConfig, ModelConfig
from fp4lm.model import Llama
from fp4lm.model.layers import collect_layer_stats, pop_layer_stats
from fp4lm.model.moe import pop_routing_stats, set_expert_parallel
from fp4lm.quant.policy import Policy
from fp4lm.sharding import batch_sharding, make_mesh, model_shardings, on_mesh

CFG = ModelConfig(
    num_layers=1,
    d_model=64,
    num_heads=4,
    num_kv_heads=2,
    mlp_dim=128,
    init_std=0.05,
    num_experts=8,
    experts_per_token=2,
    moe_mlp_dim=32,
    num_shared_experts=1,
    first_dense_layers=0,
    load_balance_loss=0.01,
)
VOCAB = 96
BATCH, LENGTH = 8, 16


def relative_difference(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def loss_and_grads(cfg: ModelConfig, recipe: str, mesh, *, with_stats: bool = False):
    """(logits, loss, grads of the parameters, the compiled program's text, the experts' telemetry rows) on
    `mesh` (None: one device); the telemetry ({"blocks.0.mlp.experts.gate.3": ...}) only `with_stats`."""
    model = Llama(cfg, VOCAB, Policy(recipe, num_layers=cfg.num_layers, backend="emulated"), rngs=nnx.Rngs(0))
    set_expert_parallel(model, mesh is not None)
    graphdef, params = nnx.split(model)
    tokens_BT = jax.random.randint(jax.random.key(1), (BATCH, LENGTH), 0, VOCAB, dtype=jnp.int32)

    def forward(params, tokens_BT):
        model = nnx.merge(graphdef, params)
        collect_layer_stats(model, with_stats)
        logits = model(tokens_BT, quant_key=jax.random.key(7))
        return logits, {path: v for path, v in pop_layer_stats(model).items() if ".experts." in path}

    def loss(params, tokens_BT):
        logits, stats = forward(params, tokens_BT)
        targets = jnp.roll(tokens_BT, -1, axis=1)
        loss = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1))
        return loss, (logits, stats)

    step = jax.value_and_grad(loss, has_aux=True)
    if mesh is not None:
        step = on_mesh(step, mesh)
        params = jax.device_put(params, model_shardings(params, mesh))
        tokens_BT = jax.device_put(tokens_BT, batch_sharding(mesh))
    compiled = jax.jit(step).lower(params, tokens_BT).compile()
    (loss_value, (logits, stats)), grads = compiled(params, tokens_BT)
    return logits, loss_value, grads, compiled.as_text(), jax.device_get(stats)


def largest_array(hlo: str) -> int:
    """Elements of the largest array shape anywhere in a compiled program's text."""
    sizes = [int(np.prod([int(d) for d in dims.split(",") if d])) for dims in re.findall(r"\[([\d,]*)\]", hlo)]
    return max(sizes)


def compare(mesh_cfg: MeshConfig, cfg: ModelConfig, recipe: str, name: str) -> dict:
    with_stats = name in STATS_CASES
    single = loss_and_grads(cfg, recipe, None, with_stats=with_stats)
    mesh = make_mesh(mesh_cfg)
    sharded = loss_and_grads(cfg, recipe, mesh, with_stats=with_stats)
    results = {
        f"{name}_logits_rel_diff": relative_difference(sharded[0], single[0]),
        f"{name}_loss_diff": abs(float(sharded[1]) - float(single[1])),
        f"{name}_logits_devices": len(sharded[0].sharding.device_set),
    }
    grads = {
        ".".join(map(str, path)): (a, b)
        for (path, a), (_, b) in zip(nnx.to_flat_state(sharded[2]), nnx.to_flat_state(single[2]), strict=True)
    }
    results[f"{name}_grad_rel_diff"] = max(relative_difference(a, b) for a, b in grads.values())
    expert_grad = grads["blocks.0.mlp.gate.kernel"]
    results[f"{name}_expert_grad_rel_diff"] = relative_difference(*expert_grad)
    results[f"{name}_expert_grad_spec"] = [str(a) for a in expert_grad[0].sharding.spec]
    results[f"{name}_largest_array"] = largest_array(sharded[3])
    if with_stats:
        single_stats, sharded_stats = single[4], sharded[4]
        results[f"{name}_expert_stats_rows"] = [len(sharded_stats), len(single_stats)]
        results[f"{name}_expert_stats_max_diff"] = max(
            abs(float(a) - float(b)) / max(abs(float(b)), 1e-30)
            for path in single_stats
            for a, b in zip(
                jax.tree.leaves(sharded_stats.get(path, {})), jax.tree.leaves(single_stats[path]), strict=True
            )
        )
    return results


CASES = {
    "expert4_data2_bf16": (MeshConfig(data=2, fsdp=1, expert=4, tensor=1), CFG, "bf16"),
    "expert4_data2_capacity_nvfp4": (
        MeshConfig(data=2, fsdp=1, expert=4, tensor=1),
        dataclasses.replace(CFG, capacity_factor=1.0),
        "nvfp4",
    ),
    "expert2_fsdp2_tensor2_nvfp4": (MeshConfig(data=1, fsdp=2, expert=2, tensor=2), CFG, "nvfp4"),
}


STATS_CASES = ("expert2_fsdp2_tensor2_nvfp4",)
"""Cases that also compare the per-expert telemetry (an expert shard's experts split over fsdp and tensor)."""


def forward_with_stats(cfg: ModelConfig, recipe: str, mesh):
    """(logits, {expert telemetry row: {operand: {metric}}}, the MoE block's routing stats) of one forward pass
    on `mesh` (None: one device), telemetry on."""
    model = Llama(cfg, VOCAB, Policy(recipe, num_layers=cfg.num_layers, backend="emulated"), rngs=nnx.Rngs(0))
    set_expert_parallel(model, mesh is not None)
    graphdef, params = nnx.split(model)
    tokens_BT = jax.random.randint(jax.random.key(1), (BATCH, LENGTH), 0, VOCAB, dtype=jnp.int32)

    def forward(params, tokens_BT):
        model = nnx.merge(graphdef, params)
        collect_layer_stats(model)
        logits = model(tokens_BT, quant_key=jax.random.key(7))
        stats = {path: v for path, v in pop_layer_stats(model).items() if ".experts." in path}
        return logits, stats, pop_routing_stats(model)["blocks.0.mlp"]

    if mesh is not None:
        forward = on_mesh(forward, mesh)
        params = jax.device_put(params, model_shardings(params, mesh))
        tokens_BT = jax.device_put(tokens_BT, batch_sharding(mesh))
    return jax.device_get(jax.jit(forward)(params, tokens_BT))


def telemetry(mesh_cfg: MeshConfig, cfg: ModelConfig, recipe: str, name: str) -> dict:
    """The per-expert telemetry rows, routing stats and logits of the mesh against one device: each row's
    largest relative difference over its metrics, by row name."""
    single = forward_with_stats(cfg, recipe, None)
    sharded = forward_with_stats(cfg, recipe, make_mesh(mesh_cfg))
    rows = {
        path: max(
            abs(float(a) - float(b)) / max(abs(float(b)), 1e-30)
            for a, b in zip(jax.tree.leaves(sharded[1][path]), jax.tree.leaves(single[1][path]), strict=True)
        )
        for path in single[1]
        if path in sharded[1]
    }
    return {
        f"{name}_logits_rel_diff": relative_difference(sharded[0], single[0]),
        f"{name}_rows": sorted(sharded[1]),
        f"{name}_row_rel_diff": rows,
        f"{name}_x_amax": {path: float(row["x"]["amax"]) for path, row in single[1].items()},
        f"{name}_routing": {key: np.asarray(v).tolist() for key, v in sharded[2].items()},
        f"{name}_routing_single": {key: np.asarray(v).tolist() for key, v in single[2].items()},
    }


UNEVEN = dataclasses.replace(CFG, num_shared_experts=0)
UNEVEN_CASES = {
    # 12 experts over expert=4: 3 per shard, split over data=2: each device runs 2, the second device's slice
    # clamped to experts 1-2 of its shard, of which it runs only 2; with a capacity, so pairs are dropped.
    "uneven_expert4_data2_capacity_nvfp4": (
        MeshConfig(data=2, fsdp=1, expert=4, tensor=1),
        dataclasses.replace(UNEVEN, num_experts=12, capacity_factor=1.1),
        "nvfp4",
    ),
    # 6 experts over expert=2: 3 per shard, split over fsdp=2 x tensor=2: one each, and one device runs none.
    "uneven_expert2_fsdp2_tensor2_nvfp4": (
        MeshConfig(data=1, fsdp=2, expert=2, tensor=2),
        dataclasses.replace(UNEVEN, num_experts=6),
        "nvfp4",
    ),
}


def main(case: str) -> None:
    assert jax.device_count() == 8, jax.devices()
    if case in UNEVEN_CASES:
        print(json.dumps(telemetry(*UNEVEN_CASES[case], case)))
        return
    mesh_cfg, cfg, recipe = CASES[case]
    results = {"tokens_experts_d_model": BATCH * LENGTH * CFG.num_experts * CFG.d_model}
    results.update(compare(mesh_cfg, cfg, recipe, case))
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])
