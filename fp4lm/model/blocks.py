"""One decoder block: RMSNorm -> grouped-query attention with RoPE -> residual, RMSNorm -> SwiGLU -> residual.

The seven projections (attn q, k, v, o and mlp gate, up, down) are QuantLinear layers built from
`fp4lm.linear_layers.block_linear_layers` (their one home, shapes included), whose matmul the precision
policy picks by path (`blocks.{i}.attn.q`, ...). The attention core (QKᵀ, mask, softmax, ·V) is
`fp4lm.model.attention.attend`: bfloat16 matmuls with float32 accumulation, softmax in float32; with the
policy's `attention="fp8"` (precision.attention) the two matmuls take per-tensor FP8 operands instead.

Document masking: given `segment_ids` [B, T] (one id per document in the row, fp4lm.data.pipeline), a
query attends to a key only when the key is not later (causal) AND belongs to the same document; given
`positions` [B, T], RoPE rotates by those positions (restarting at each document) instead of 0..T-1.
Without them the attention is the plain causal one over the whole row.

KV cache: given `cache` and `cache_position` (fp4lm.model.decode), the same block runs generation's prefill
and decode steps: attention writes the tokens' keys and values into the cache and reads the cache's, and the
call returns (x, the updated cache). The rest of the block is the training call's.
"""

from __future__ import annotations

from typing import overload

import jax
import jax.numpy as jnp
from flax import nnx

from fp4lm.config import ModelConfig
from fp4lm.linear_layers import LinearLayer, block_linear_layers
from fp4lm.model.attention import attend
from fp4lm.model.decode import KVCache, cached_masks
from fp4lm.model.layers import Llama3RopeScaling, RMSNorm, apply_rope, rope_angles, shared_weight_amax
from fp4lm.model.mlp import SwiGLU, quant_linear
from fp4lm.model.moe import MoE
from fp4lm.quant.policy import Policy
from fp4lm.sharding import batch_sharded


class Attention(nnx.Module):
    """Causal grouped-query attention: H query heads share K key/value heads in groups of G = H / K.
    Given segment ids, a query sees only keys of its own document (see the module doc).

    `layers` maps "q", "k", "v", "o" to their LinearLayer (fp4lm.linear_layers).
    """

    def __init__(self, cfg: ModelConfig, *, layers: dict[str, LinearLayer], policy: Policy, rngs: nnx.Rngs):
        assert cfg.num_heads % cfg.num_kv_heads == 0, (cfg.num_heads, cfg.num_kv_heads)
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.resolved_head_dim
        self.rope_theta = cfg.rope_theta
        self.rope_scaling = Llama3RopeScaling.from_config(cfg)  # None: plain RoPE
        self.implementation = cfg.attention  # fp4lm.model.attention: auto, xla or cudnn
        self.precision = policy.attention  # precision.attention: the core's QKᵀ and P·V in bf16 or fp8
        self.q = quant_linear(layers["q"], policy, rngs)
        self.k = quant_linear(layers["k"], policy, rngs)
        self.v = quant_linear(layers["v"], policy, rngs)
        self.o = quant_linear(layers["o"], policy, rngs)
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm:  # Qwen3: each head's q and k normalised over the head width, before RoPE
            self.q_norm = RMSNorm(self.head_dim, eps=cfg.norm_eps)
            self.k_norm = RMSNorm(self.head_dim, eps=cfg.norm_eps)

    @overload
    def __call__(
        self,
        x_BTD: jax.Array,
        *,
        quant_key: jax.Array | None = None,
        segment_ids_BT: jax.Array | None = None,
        positions_BT: jax.Array | None = None,
        cache: None = None,
        cache_position: None = None,
    ) -> jax.Array: ...
    @overload
    def __call__(
        self,
        x_BTD: jax.Array,
        *,
        quant_key: jax.Array | None = None,
        segment_ids_BT: jax.Array | None = None,
        positions_BT: jax.Array | None = None,
        cache: KVCache,
        cache_position: jax.Array,
    ) -> tuple[jax.Array, KVCache]: ...
    def __call__(
        self,
        x_BTD: jax.Array,
        *,
        quant_key: jax.Array | None = None,
        segment_ids_BT: jax.Array | None = None,
        positions_BT: jax.Array | None = None,
        cache: KVCache | None = None,
        cache_position: jax.Array | None = None,
    ) -> jax.Array | tuple[jax.Array, KVCache]:
        """The attention output [B, T, D]. With `cache` (fp4lm.model.decode): the T tokens are at positions
        cache_position, cache_position + 1, ...; their keys and values are written into the cache there and the
        queries attend to the cache; returns (output, the updated cache)."""
        batch, length, _ = x_BTD.shape
        if cache is None:
            positions = jnp.arange(length) if positions_BT is None else positions_BT
            q_BTHE, k_BSKE, v_BSKE = self.rotated_qkv(x_BTD, positions, quant_key=quant_key)
            masks = {"is_causal": True, "segment_ids_BT": segment_ids_BT}
        else:
            if segment_ids_BT is not None or positions_BT is not None or cache_position is None:
                raise ValueError("a cached call takes cache_position and no document layout (one text per row)")
            positions = cache_position + jnp.arange(length)
            q_BTHE, k_BTKE, v_BTKE = self.rotated_qkv(x_BTD, positions, quant_key=quant_key)
            cache = cache.write(k_BTKE, v_BTKE, cache_position)
            k_BSKE, v_BSKE = cache.keys, cache.values
            masks = cached_masks(batch, length, cache.length, cache_position)
        out_BTHE = attend(q_BTHE, k_BSKE, v_BSKE, implementation=self.implementation, precision=self.precision, **masks)
        out_BTD = self.o(out_BTHE.reshape(batch, length, -1), quant_key=quant_key)
        return out_BTD if cache is None else (out_BTD, cache)

    def rotated_qkv(self, x_BTD: jax.Array, positions: jax.Array, *, quant_key: jax.Array | None = None):
        """(q [B, T, H, E], k and v [B, T, K, E]) of the normed input, q and k rotated by RoPE at `positions`
        ([T], or [B, T] for per-row positions)."""
        batch, length, _ = x_BTD.shape
        H, K, E = self.num_heads, self.num_kv_heads, self.head_dim
        qkv_amax = shared_weight_amax([self.q, self.k, self.v])  # q/k/v read one activation: one fused group
        q_BTHE = self.q(x_BTD, quant_key=quant_key, weight_amax=qkv_amax).reshape(batch, length, H, E)
        k_BTKE = self.k(x_BTD, quant_key=quant_key, weight_amax=qkv_amax).reshape(batch, length, K, E)
        v_BTKE = self.v(x_BTD, quant_key=quant_key, weight_amax=qkv_amax).reshape(batch, length, K, E)
        if self.qk_norm:
            q_BTHE, k_BTKE = self.q_norm(q_BTHE), self.k_norm(k_BTKE)
        angles = rope_angles(positions, E, self.rope_theta, self.rope_scaling)  # [T, F] or [B, T, F]
        q_BTHE = apply_rope(q_BTHE, angles)
        k_BTKE = apply_rope(k_BTKE, angles)
        return q_BTHE, k_BTKE, v_BTKE


class Block(nnx.Module):
    """Pre-norm residual block: x + attn(norm(x)), then + mlp(norm(x)); the MLP is routed experts (MoE) in the
    blocks `cfg.is_moe_block` names."""

    def __init__(self, cfg: ModelConfig, index: int, *, policy: Policy, rngs: nnx.Rngs):
        by_module: dict[str, dict[str, LinearLayer]] = {"attn": {}, "mlp": {}}
        for layer in block_linear_layers(cfg, index):
            module, projection = layer.name.split(".", 1)
            by_module[module][projection] = layer
        self.attn_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = Attention(cfg, layers=by_module["attn"], policy=policy, rngs=rngs)
        self.mlp_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        if cfg.is_moe_block(index):
            self.mlp = MoE(cfg, layers=by_module["mlp"], policy=policy, rngs=rngs)
        else:
            self.mlp = SwiGLU(layers=by_module["mlp"], policy=policy, rngs=rngs)

    @overload
    def __call__(
        self,
        x_BTD: jax.Array,
        *,
        quant_key: jax.Array | None = None,
        segment_ids_BT: jax.Array | None = None,
        positions_BT: jax.Array | None = None,
        cache: None = None,
        cache_position: None = None,
    ) -> jax.Array: ...
    @overload
    def __call__(
        self,
        x_BTD: jax.Array,
        *,
        quant_key: jax.Array | None = None,
        segment_ids_BT: jax.Array | None = None,
        positions_BT: jax.Array | None = None,
        cache: KVCache,
        cache_position: jax.Array,
    ) -> tuple[jax.Array, KVCache]: ...
    def __call__(
        self,
        x_BTD: jax.Array,
        *,
        quant_key: jax.Array | None = None,
        segment_ids_BT: jax.Array | None = None,
        positions_BT: jax.Array | None = None,
        cache: KVCache | None = None,
        cache_position: jax.Array | None = None,
    ) -> jax.Array | tuple[jax.Array, KVCache]:
        """`segment_ids_BT`, `positions_BT`: the document layout for Attention (None: one causal row).
        `cache`, `cache_position`: this block's KV cache and where the tokens go in it; then (x, the updated
        cache) is returned (module doc)."""
        x_BTD = batch_sharded(x_BTD)  # each device runs its own rows (fp4lm.sharding)
        normed_BTD = self.attn_norm(x_BTD)
        if cache is None:
            x_BTD = x_BTD + self.attn(
                normed_BTD, quant_key=quant_key, segment_ids_BT=segment_ids_BT, positions_BT=positions_BT
            )
        else:
            if cache_position is None:
                raise ValueError("a cached call needs the cache_position its tokens start at")
            attended_BTD, cache = self.attn(
                normed_BTD,
                quant_key=quant_key,
                segment_ids_BT=segment_ids_BT,
                positions_BT=positions_BT,
                cache=cache,
                cache_position=cache_position,
            )
            x_BTD = x_BTD + attended_BTD
        x_BTD = x_BTD + self.mlp(self.mlp_norm(x_BTD), quant_key=quant_key)
        return x_BTD if cache is None else (x_BTD, cache)
