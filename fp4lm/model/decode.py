"""The KV cache: every attention layer's rotated keys and values, so that generation computes each position once.

The model's own call takes it (Llama.__call__(tokens_BT, cache=..., cache_position=...), the same blocks,
projections, precision and LM head as training): each attention layer writes its new tokens' keys and values into
its cache from `cache_position` on, attends to the cache, and the call returns the logits with the updated cache.
Two kinds of cached call (`cached_masks`), both what fp4lm.model.generate runs:

- prefill: the whole window (T = S tokens, cache_position 0), causally: the plain call's logits, and a cache
  holding the window's keys and values. The keys of any padding after the prompt are in the cache too but never
  read: each later step overwrites the position it adds before attending, and attends only to positions up to its
  own.
- decode: one token per row (T = 1) at cache_position (the same for every row): it attends to the cache's first
  cache_position + 1 entries (attend(..., is_causal=False, kv_lengths_B)).

Quantized projections see one token's activations at a time in a decode step (their per-tensor scale is that
token's), so its logits can differ in the last bits from those of a full window holding the same text.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

CACHE_DTYPE = jnp.bfloat16  # the keys and values as attention reads them (the blocks compute in bfloat16)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
    """One attention layer's rotated keys and values, [B, S, K, E] each; for a scanned group of L layers
    (fp4lm.model.scan) the group's caches stacked, [L, B, S, K, E]."""

    keys: jax.Array
    values: jax.Array

    @classmethod
    def empty(cls, batch: int, length: int, kv_heads: int, head_dim: int, *, layers: int | None = None) -> KVCache:
        """A cache of zeros for `batch` rows of `length` positions (stacked [layers, ...] unless layers is None)."""
        shape = (batch, length, kv_heads, head_dim) if layers is None else (layers, batch, length, kv_heads, head_dim)
        return cls(jnp.zeros(shape, CACHE_DTYPE), jnp.zeros(shape, CACHE_DTYPE))

    @property
    def length(self) -> int:
        """S: the positions the cache holds."""
        return self.keys.shape[-3]

    def write(self, k_BTKE: jax.Array, v_BTKE: jax.Array, position: jax.Array) -> KVCache:
        """The cache with T new positions' keys and values at `position`, `position` + 1, ... (one layer's)."""
        keys = jax.lax.dynamic_update_slice_in_dim(self.keys, k_BTKE.astype(self.keys.dtype), position, axis=1)
        values = jax.lax.dynamic_update_slice_in_dim(self.values, v_BTKE.astype(self.values.dtype), position, axis=1)
        return KVCache(keys, values)


def cached_masks(batch: int, length: int, cache_length: int, position: jax.Array) -> dict:
    """attend's masks for T = `length` new tokens at `position` against a cache of S = `cache_length` positions:
    the prefill's causal mask (T = S) or a decode step's valid length (T = 1), see the module doc."""
    if length == cache_length:
        return {"is_causal": True}
    if length == 1:
        return {"is_causal": False, "kv_lengths_B": jnp.full((batch,), position + 1, jnp.int32)}
    raise ValueError(
        f"a cached call takes the whole window (T = S = {cache_length} tokens) or one token per row, got T={length}"
    )
