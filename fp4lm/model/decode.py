"""The model's forward pass with a KV cache, for generation: prefill the prompt once, then one token per step.

The cache holds every block's rotated keys and values, [B, S, K, E] per block (bfloat16, as attention reads
them), for S = the cache length (the training context, data.seq_len). Two functions use it:

- `prefill(model, window_BS)`: the ordinary causal forward pass over a full window (the prompt, right-padded to
  S), which also returns each block's keys and values. Its logits are the model's own (the same operations as
  Llama.__call__); the keys of the padding positions are in the cache too but never read: each later step
  overwrites the position it adds before attending, and attends only to positions below its own.
- `decode_step(model, cache, tokens_B1, position)`: the token at `position` (the same for every row) attends to
  the cache's first position + 1 entries (attend(..., is_causal=False, kv_lengths_B)) after its own keys and
  values are written there; it returns the next-token logits and the updated cache.

Both run the blocks' own modules (norms, projections under the precision policy, MLP), so the cache changes
only where attention reads its keys from. Quantized projections see one token's activations at a time in a
decode step (their per-tensor scale is that token's), so the logits can differ from the full window's in the
last bits; greedy text from a trained model is the same (tests/train/test_sample_cache.py).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from fp4lm.model.attention import attend
from fp4lm.model.blocks import Block
from fp4lm.model.layers import COMPUTE_DTYPE
from fp4lm.model.llama import Llama


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
    """Per block: keys and values [B, S, K, E], rotated by their positions (bfloat16)."""

    keys: list[jax.Array]
    values: list[jax.Array]

    @property
    def length(self) -> int:
        return self.keys[0].shape[1]


def _attention_inputs(block: Block, x_BTD: jax.Array, positions_T: jax.Array):
    """(normed x, q [B, T, H, E], k and v [B, T, K, E]) of `block` for tokens at `positions_T` (as Attention)."""
    return block.attn.rotated_qkv(block.attn_norm(x_BTD), positions_T)


def _finish_block(block: Block, x_BTD: jax.Array, attended_BTHE: jax.Array) -> jax.Array:
    """The residual adds after attention: x + o(attention), then + mlp(norm(x))."""
    batch, length = attended_BTHE.shape[:2]
    x_BTD = x_BTD + block.attn.o(attended_BTHE.reshape(batch, length, -1))
    return x_BTD + block.mlp(block.mlp_norm(x_BTD))


def _logits(model: Llama, x_BTD: jax.Array) -> jax.Array:
    x_BTD = model.final_norm(x_BTD)
    if model.cfg.tie_embeddings:
        return model.embed.attend(x_BTD)
    head_DV = model.lm_head[...].astype(COMPUTE_DTYPE)
    return jnp.einsum("btd,dv->btv", x_BTD, head_DV, preferred_element_type=jnp.float32)


def prefill(model: Llama, window_BS: jax.Array) -> tuple[jax.Array, KVCache]:
    """(logits [B, S, V] float32, the cache of the window's keys and values): the causal pass over the window."""
    length = window_BS.shape[1]
    x_BTD = model.embed(window_BS).astype(COMPUTE_DTYPE)
    keys, values = [], []
    for block in model.blocks:
        q_BTHE, k_BTKE, v_BTKE = _attention_inputs(block, x_BTD, jnp.arange(length))
        attended = attend(
            q_BTHE,
            k_BTKE,
            v_BTKE,
            implementation=block.attn.implementation,
            is_causal=True,
            precision=block.attn.precision,
        )
        x_BTD = _finish_block(block, x_BTD, attended)
        keys.append(k_BTKE)
        values.append(v_BTKE)
    return _logits(model, x_BTD), KVCache(keys, values)


def decode_step(model: Llama, cache: KVCache, tokens_B1: jax.Array, position: jax.Array) -> tuple[jax.Array, KVCache]:
    """(logits [B, V] float32 of the token after `tokens_B1`, the cache with its keys and values at `position`)."""
    batch = tokens_B1.shape[0]
    x_BTD = model.embed(tokens_B1).astype(COMPUTE_DTYPE)
    lengths_B = jnp.full((batch,), position + 1, jnp.int32)
    keys, values = [], []
    for block, k_BSKE, v_BSKE in zip(model.blocks, cache.keys, cache.values, strict=True):
        q_BTHE, k_BTKE, v_BTKE = _attention_inputs(block, x_BTD, position[None])
        k_BSKE = jax.lax.dynamic_update_slice_in_dim(k_BSKE, k_BTKE.astype(k_BSKE.dtype), position, axis=1)
        v_BSKE = jax.lax.dynamic_update_slice_in_dim(v_BSKE, v_BTKE.astype(v_BSKE.dtype), position, axis=1)
        attended = attend(
            q_BTHE,
            k_BSKE,
            v_BSKE,
            implementation=block.attn.implementation,
            is_causal=False,
            kv_lengths_B=lengths_B,
            precision=block.attn.precision,
        )
        x_BTD = _finish_block(block, x_BTD, attended)
        keys.append(k_BSKE)
        values.append(v_BSKE)
    return _logits(model, x_BTD)[:, 0], KVCache(keys, values)


def make_decoder(graphdef: nnx.GraphDef):
    """(prefill(params, window_BS), decode_step(params, cache, tokens_B1, position)) jitted, on pure-dict params;
    the cache is donated to the decode step so it is updated in place."""

    def prefill_fn(params, window_BS):
        return prefill(nnx.merge(graphdef, params), window_BS)

    def decode_fn(params, cache, tokens_B1, position):
        return decode_step(nnx.merge(graphdef, params), cache, tokens_B1, position)

    return jax.jit(prefill_fn), jax.jit(decode_fn, donate_argnums=1)
