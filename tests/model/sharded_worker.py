"""Runs in a subprocess with 8 fake CPU devices (see test_sharded_model.py); prints one JSON line.

XLA_FLAGS must hold --xla_force_host_platform_device_count=8 before jax is imported. The parent also
passes --xla_allow_excess_precision=false so that differently fused programs (sharded vs not, remat vs
not) round bfloat16 intermediates identically.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from fp4lm import numerics
from fp4lm.config import MeshConfig, ModelConfig
from fp4lm.model import Llama
from fp4lm.quant.policy import Policy
from fp4lm.sharding import batch_sharding, make_mesh, model_shardings

CFG = ModelConfig(num_layers=1, d_model=64, num_heads=4, num_kv_heads=2, mlp_dim=128, init_std=0.05)
VOCAB = 96


def shard_model(model: nnx.Module, mesh: Mesh) -> nnx.Module:
    """Places the model's parameters on `mesh` as the logical-axis table says (in place; returns it)."""
    state = nnx.state(model)
    nnx.update(model, jax.device_put(state, model_shardings(state, mesh)))
    return model


def create_sharded(make_model, mesh: Mesh) -> nnx.Module:
    """Builds `make_model()` directly into sharded memory: no device ever holds a full copy.

    `make_model` is a zero-argument function returning a fresh module (e.g. ``lambda: Llama(...)``).
    """
    abstract = nnx.eval_shape(make_model)
    graphdef, _ = nnx.split(abstract)

    def init_state():
        return nnx.state(make_model())

    state = jax.jit(init_state, out_shardings=model_shardings(abstract, mesh))()
    return nnx.merge(graphdef, state)


def relative_difference(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def sharded_forward_results(mesh) -> tuple[dict, Llama]:
    tokens_BT = jax.random.randint(jax.random.key(1), (4, 16), 0, VOCAB, dtype=jnp.int32)
    quant_key = jax.random.key(7)
    results = {}
    for recipe in ("bf16", "nvfp4"):
        policy = Policy(recipe, num_layers=CFG.num_layers, backend="emulated")
        model = Llama(CFG, VOCAB, policy, rngs=nnx.Rngs(0))
        forward = nnx.jit(lambda m, t: m(t, quant_key=quant_key))
        single = forward(model, tokens_BT)
        shard_model(model, mesh)
        sharded = forward(model, jax.device_put(tokens_BT, batch_sharding(mesh)))
        results[f"forward_rel_diff_{recipe}"] = relative_difference(sharded, single)
        results[f"forward_logits_sharded_{recipe}"] = len(sharded.sharding.device_set)
    q_kernel = model.blocks[0].attn.q.kernel[...]
    results["q_kernel_spec"] = [str(a) for a in q_kernel.sharding.spec]
    results["q_kernel_devices"] = len(q_kernel.sharding.device_set)
    return results, model


def quantize_codes_results(mesh) -> dict:
    """NVFP4 codes/scales/amax of a tensor sharded over all 8 devices equal the unsharded ones exactly."""
    x = jax.random.normal(jax.random.key(3), (64, 128), jnp.float32) * jnp.linspace(0.1, 8.0, 128)
    sharded_x = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.P(("data", "fsdp"), "tensor")))
    results = {}
    for name, kwargs in {"1x16": {}, "16x16": {"block": (16, 16)}, "rht": {"hadamard": True}}.items():
        quantize = jax.jit(lambda v, kw=kwargs: numerics.quantize(v, "nvfp4", **kw))
        a, b = quantize(x), quantize(sharded_x)
        results[f"codes_equal_{name}"] = bool(
            np.array_equal(a.codes(), b.codes())
            and np.array_equal(a.scale_bytes(), b.scale_bytes())
            and np.array_equal(a.amax, b.amax)
        )
    results["codes_input_devices"] = len(sharded_x.sharding.device_set)
    return results


def create_sharded_results(mesh, eager: Llama) -> dict:
    """create_sharded draws the same weights as eager construction, straight into their shardings."""
    policy = Policy.bf16(CFG.num_layers)
    model = create_sharded(lambda: Llama(CFG, VOCAB, policy, rngs=nnx.Rngs(0)), mesh)
    pairs = zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(eager)), strict=True)
    same = all(np.array_equal(a, b) for a, b in pairs)
    want = model_shardings(model, mesh)
    placed = all(
        a.sharding.is_equivalent_to(s, a.ndim)
        for a, s in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(want), strict=True)
    )
    return {"create_sharded_same_values": bool(same), "create_sharded_placed": bool(placed)}


def remat_results() -> dict:
    """Max |difference| of the gradients under each remat mode against "none".

    Recipe nvfp4_fwd_only: a quantized forward whose saved operands carry the "fp4lm_quantized" name
    that "save_quantized" keeps; its bf16 backward compiles several times faster than nvfp4's on CPU.
    """
    tokens_BT = jax.random.randint(jax.random.key(2), (2, 16), 0, VOCAB, dtype=jnp.int32)

    def grads(remat: str):
        cfg = dataclasses.replace(CFG, remat=remat)
        model = Llama(cfg, VOCAB, Policy("nvfp4_fwd_only", num_layers=1, backend="emulated"), rngs=nnx.Rngs(0))
        graphdef, params = nnx.split(model)

        @jax.jit
        def loss_grad(params):
            def loss(params):
                logits = nnx.merge(graphdef, params)(tokens_BT, quant_key=jax.random.key(5))
                return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens_BT[..., None], -1))

            return jax.grad(loss)(params)

        return jax.tree.leaves(loss_grad(params))

    reference = grads("none")
    out = {}
    for mode in ("full", "save_quantized", "save_matmul_operands"):
        out[f"remat_max_diff_{mode}"] = max(
            float(jnp.max(jnp.abs(a - b))) for a, b in zip(reference, grads(mode), strict=True)
        )
    out["grad_norm"] = float(jnp.sqrt(sum(jnp.sum(g * g) for g in reference)))
    return out


def main() -> None:
    assert jax.device_count() == 8, jax.devices()
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    results = {"mesh_shape": dict(mesh.shape)}
    results.update(quantize_codes_results(mesh))
    forward_results, eager_model = sharded_forward_results(mesh)
    results.update(forward_results)
    results.update(create_sharded_results(mesh, eager_model))
    results.update(remat_results())
    print(json.dumps(results))


if __name__ == "__main__":
    main()
