"""The attention core: scores, mask, softmax, weighted sum, behind one entry point `attend`.

Shapes: B batch, T queries, S keys, N query heads, K key/value heads (grouped-query attention: N % K == 0,
query head n = k * G + g uses key/value head k, G = N / K; K/V are never repeated to N heads), H head width.

Masks: `is_causal` (query t sees keys s <= t; T == S), `segment_ids_BT` (T == S: a query sees only keys of
its own document), `kv_lengths_B` (keys at positions >= the row's length are ignored: the valid part of a KV
cache). A decode step passes T=1 queries with is_causal=False and the cache's lengths.

Numerics: QKᵀ and P·V take bfloat16 inputs with float32 accumulation; the softmax is float32; the result
is rounded to the inputs' dtype.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def attend(
    q_BTNH: jax.Array,
    k_BSKH: jax.Array,
    v_BSKH: jax.Array,
    *,
    implementation: str,
    is_causal: bool,
    segment_ids_BT: jax.Array | None = None,
    kv_lengths_B: jax.Array | None = None,
) -> jax.Array:
    """softmax(q kᵀ / sqrt(H) masked) v per head: [B, T, N, H] in q's dtype (see the module doc)."""
    _check_shapes(q_BTNH, k_BSKH, v_BSKH, is_causal=is_causal, segment_ids_BT=segment_ids_BT)
    del implementation  # one implementation so far: the reference one
    return reference_attention(
        q_BTNH, k_BSKH, v_BSKH, is_causal=is_causal, segment_ids_BT=segment_ids_BT, kv_lengths_B=kv_lengths_B
    )


def _check_shapes(
    q_BTNH: jax.Array, k_BSKH: jax.Array, v_BSKH: jax.Array, *, is_causal: bool, segment_ids_BT: jax.Array | None
) -> None:
    batch, length, heads, width = q_BTNH.shape
    kv_batch, kv_length, kv_heads, kv_width = k_BSKH.shape
    if v_BSKH.shape != k_BSKH.shape or (kv_batch, kv_width) != (batch, width) or heads % kv_heads:
        raise ValueError(f"attention shapes q {q_BTNH.shape}, k {k_BSKH.shape}, v {v_BSKH.shape} do not fit")
    if (is_causal or segment_ids_BT is not None) and kv_length != length:
        raise ValueError(f"causal or segment masks need as many keys as queries, got T={length}, S={kv_length}")


def allowed_keys(
    length: int,
    kv_length: int,
    *,
    is_causal: bool,
    segment_ids_BT: jax.Array | None = None,
    kv_lengths_B: jax.Array | None = None,
) -> jax.Array:
    """Which keys each query may attend to: bool broadcastable to [B, T, S] (see the module doc for the masks)."""
    allowed = jnp.ones((1, length, kv_length), dtype=bool)
    if is_causal:
        allowed = allowed & jnp.tril(jnp.ones((length, kv_length), dtype=bool))[None]
    if segment_ids_BT is not None:
        allowed = allowed & (segment_ids_BT[:, :, None] == segment_ids_BT[:, None, :])
    if kv_lengths_B is not None:
        allowed = allowed & (jnp.arange(kv_length)[None, None, :] < kv_lengths_B[:, None, None])
    return allowed


def reference_attention(
    q_BTNH: jax.Array,
    k_BSKH: jax.Array,
    v_BSKH: jax.Array,
    *,
    is_causal: bool,
    segment_ids_BT: jax.Array | None = None,
    kv_lengths_B: jax.Array | None = None,
) -> jax.Array:
    """The plain form: the whole [B, K, G, T, S] score matrix in float32, masked with float32's minimum."""
    batch, length, heads, width = q_BTNH.shape
    kv_length, kv_heads = k_BSKH.shape[1], k_BSKH.shape[2]
    q_BTKGH = q_BTNH.reshape(batch, length, kv_heads, heads // kv_heads, width)
    scores_BKGTS = jnp.einsum("btkgh,bskh->bkgts", q_BTKGH, k_BSKH, preferred_element_type=jnp.float32)
    scores_BKGTS = scores_BKGTS / math.sqrt(width)
    allowed_BTS = allowed_keys(
        length, kv_length, is_causal=is_causal, segment_ids_BT=segment_ids_BT, kv_lengths_B=kv_lengths_B
    )
    scores_BKGTS = jnp.where(allowed_BTS[:, None, None], scores_BKGTS, jnp.finfo(jnp.float32).min)
    probs_BKGTS = jax.nn.softmax(scores_BKGTS, axis=-1).astype(q_BTNH.dtype)
    out_BTKGH = jnp.einsum("bkgts,bskh->btkgh", probs_BKGTS, v_BSKH, preferred_element_type=jnp.float32)
    return out_BTKGH.astype(q_BTNH.dtype).reshape(batch, length, heads, width)
