"""Benchmark: temporary memory of one MoE layer against the dense MLP of the same active width (issue 22).

    .venv/bin/python bench/moe_memory.py            # the CPU MoE default's layer, bf16 and nvfp4
    .venv/bin/python bench/moe_memory.py --json out.json

Dropless routing never builds a [tokens x experts x d_model] tensor: the (token, expert) pairs are sorted by
expert and the grouped GEMM runs on [tokens * k, d_model] rows. This measures it as XLA sees it: the
temporary buffer size (`compiled.memory_analysis().temp_size_in_bytes`: everything the program allocates
besides its inputs and outputs) of a jitted forward + backward (gradients of the parameters and the input)
of the MoE layer (router, k of X routed SwiGLU experts, the shared experts) and of a dense SwiGLU whose
width is the layer's active width, (k + shared) * moe_mlp_dim, on the same tokens. A [tokens, experts,
d_model] bf16 tensor's size is printed beside them. Memory is a compile-time figure: no load average needed.
tests/model/test_moe_memory.py checks the shapes themselves (no intermediate that large).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys

import jax
import jax.numpy as jnp
from flax import nnx

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from moe_step import moe_config  # noqa: E402

from fp4lm.config import ModelConfig, load_config  # noqa: E402
from fp4lm.linear_layers import block_linear_layers  # noqa: E402
from fp4lm.model.mlp import SwiGLU  # noqa: E402
from fp4lm.model.moe import MoE  # noqa: E402
from fp4lm.quant import Policy  # noqa: E402


def mlp_layer(cfg: ModelConfig, recipe: str) -> nnx.Module:
    """Block 0's MLP of ``cfg`` (an MoE when cfg has experts and no dense first blocks), under ``recipe``."""
    layers = {}
    for layer in block_linear_layers(cfg, 0):
        module, projection = layer.name.split(".", 1)
        if module == "mlp":
            layers[projection] = layer
    policy = Policy(recipe, num_layers=cfg.num_layers)
    if cfg.is_moe_block(0):
        return MoE(cfg, layers=layers, policy=policy, rngs=nnx.Rngs(0))
    return SwiGLU(layers=layers, policy=policy, rngs=nnx.Rngs(0))


def forward_backward_temp_bytes(module: nnx.Module, x_BTD: jax.Array) -> int:
    """XLA's temporary bytes of jit(grad of sum(module(x)²) with respect to the parameters and x)."""
    graphdef, params = nnx.split(module, nnx.Param)

    def loss(params, x_BTD, key):
        y = nnx.merge(graphdef, params)(x_BTD, quant_key=key)
        return jnp.sum(jnp.square(y.astype(jnp.float32)))

    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, x_BTD, jax.random.key(0)).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def measure(cfg: ModelConfig, batch: int, seq_len: int, recipe: str) -> dict:
    moe_cfg = dataclasses.replace(cfg, first_dense_layers=0)
    active = (cfg.experts_per_token + cfg.num_shared_experts) * cfg.resolved_moe_mlp_dim
    dense_cfg = dataclasses.replace(cfg, num_experts=0, mlp_dim=active, first_dense_layers=0)
    x = jax.random.normal(jax.random.key(1), (batch, seq_len, cfg.d_model), jnp.bfloat16)
    moe_bytes = forward_backward_temp_bytes(mlp_layer(moe_cfg, recipe), x)
    dense_bytes = forward_backward_temp_bytes(mlp_layer(dense_cfg, recipe), x)
    return {
        "recipe": recipe,
        "moe_temp_bytes": moe_bytes,
        "dense_temp_bytes": dense_bytes,
        "ratio": moe_bytes / dense_bytes,
        "active_width": active,
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipes", default="bf16,nvfp4")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    name, overrides = moe_config()
    config = load_config(ROOT / "configs" / f"{name}.yaml", list(overrides))
    cfg, batch, seq_len = config.model, config.train.batch_size, config.data.seq_len
    tokens = batch * seq_len
    dense_dispatch = tokens * cfg.num_experts * cfg.d_model * 2
    rows = [measure(cfg, batch, seq_len, recipe) for recipe in args.recipes.split(",") if recipe]
    device = jax.devices()[0]
    result = {
        "benchmark": "MoE layer vs dense SwiGLU of the same active width: XLA temporary memory, forward + backward",
        "config": f"configs/{name}.yaml" + (f" with {' '.join(overrides)}" if overrides else ""),
        "tokens": tokens,
        "d_model": cfg.d_model,
        "experts": cfg.num_experts,
        "experts_per_token": cfg.experts_per_token,
        "tokens_x_experts_x_d_model_bf16_bytes": dense_dispatch,
        "device": f"{device.platform}:{device.device_kind}",
        "rows": rows,
    }
    print(
        f"MoE layer vs dense SwiGLU of width (k + shared) * moe_mlp_dim = {rows[0]['active_width']}, forward + "
        f"backward, {tokens} tokens, d_model {cfg.d_model}, {cfg.num_experts} experts top-{cfg.experts_per_token}, "
        f"{result['device']}\n(one [tokens, experts, d_model] bf16 tensor would be {dense_dispatch / 2**20:.1f} MiB)"
    )
    print("| recipe | MoE temp MiB | dense temp MiB | MoE / dense |")
    print("|---|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['recipe']} | {row['moe_temp_bytes'] / 2**20:.2f} | {row['dense_temp_bytes'] / 2**20:.2f} "
            f"| {row['ratio']:.2f}x |"
        )
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
