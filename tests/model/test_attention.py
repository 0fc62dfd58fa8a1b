"""The attention core (fp4lm.model.attention): the xla implementation against the plain reference on CPU,
its masks (causal, documents, KV-cache lengths), its memory, and the refusal of cudnn where it cannot run.

Tolerance (xla vs reference): both compute float32 scores, a float32 softmax, bf16 probabilities and a
float32-accumulated P·V rounded to bf16. They differ only in the scale (x * (1/sqrt(H)) vs x / sqrt(H): one
float32 ulp of a score for H = 8) and the masking constant (both give probability exactly 0), so an output
can move by one bf16 rounding step at most: relative 2^-7 (bf16 keeps 8 significant bits). The gradients
go through bf16 matmuls too, where one rounding step of a large entry shifts the sums: they are held to one
bf16 step of their largest entry (measured on these inputs: up to 0.7 of that).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4lm.errors import UserError
from fp4lm.model.attention import (
    attend,
    check_attention_setting,
    document_runs,
    reference_attention,
    xla_attention,
)

pytestmark = pytest.mark.slow

BF16_STEP = 2.0**-7  # one bf16 rounding step, relative
jit_attend = jax.jit(attend, static_argnames=("implementation", "is_causal"))
jit_xla = jax.jit(xla_attention, static_argnames=("is_causal", "query_block"))
jit_reference = jax.jit(reference_attention, static_argnames=("is_causal",))


def _qkv(batch, length, heads, kv_heads, width, *, kv_length=None, seed=0):
    keys = jax.random.split(jax.random.key(seed), 3)
    kv_length = length if kv_length is None else kv_length
    q = jax.random.normal(keys[0], (batch, length, heads, width)).astype(jnp.bfloat16)
    k = jax.random.normal(keys[1], (batch, kv_length, kv_heads, width)).astype(jnp.bfloat16)
    v = jax.random.normal(keys[2], (batch, kv_length, kv_heads, width)).astype(jnp.bfloat16)
    return q, k, v


def _close(actual, expected):
    actual, expected = np.asarray(actual, np.float32), np.asarray(expected, np.float32)
    bound = BF16_STEP * max(float(np.abs(expected).max()), 1e-30)
    np.testing.assert_allclose(actual, expected, rtol=BF16_STEP, atol=bound)


def _segments(batch, length, seed=0):
    """Random document layouts: ids 1, 2, ... in contiguous runs of random lengths."""
    rng = np.random.default_rng(seed)
    starts = rng.random((batch, length)) < 0.15
    starts[:, 0] = True
    return jnp.asarray(np.cumsum(starts, axis=1), jnp.int32)


@pytest.mark.parametrize(
    "length, block, documents",
    [(32, 256, False), (32, 256, True), (40, 16, False), (40, 16, True)],  # one block; three, the last padded
)
def test_xla_matches_reference_forward_and_backward(length, block, documents):
    q, k, v = _qkv(2, length, 4, 2, 8)  # grouped-query: 2 query heads per key/value head
    segments = _segments(2, length) if documents else None

    def loss(attention, q, k, v):
        out = attention(q, k, v, is_causal=True, segment_ids_BT=segments)
        return (out.astype(jnp.float32) * jnp.cos(jnp.arange(out.size).reshape(out.shape))).sum(), out

    fused = lambda q, k, v, **masks: xla_attention(q, k, v, query_block=block, **masks)  # noqa: E731
    (_, out), grads = jax.jit(jax.value_and_grad(lambda *a: loss(fused, *a), argnums=(0, 1, 2), has_aux=True))(q, k, v)
    (_, ref_out), ref_grads = jax.jit(
        jax.value_and_grad(lambda *a: loss(reference_attention, *a), argnums=(0, 1, 2), has_aux=True)
    )(q, k, v)
    assert out.dtype == jnp.bfloat16 and out.shape == q.shape
    _close(out, ref_out)
    for grad, ref_grad in zip(grads, ref_grads, strict=True):
        _close(grad, ref_grad)


def test_documents_do_not_see_each_other():
    """With documents, each document's output is that of the document alone (an independent check)."""
    q, k, v = _qkv(1, 24, 2, 1, 8)
    segments = jnp.asarray([[1] * 10 + [2] * 14], jnp.int32)
    out = jit_xla(q, k, v, is_causal=True, segment_ids_BT=segments, query_block=16)
    first = jit_xla(q[:, :10], k[:, :10], v[:, :10], is_causal=True)
    second = jit_xla(q[:, 10:], k[:, 10:], v[:, 10:], is_causal=True)
    _close(out[:, :10], first)
    _close(out[:, 10:], second)


def test_decode_step_sees_only_the_valid_part_of_the_cache():
    """T=1 queries against a 16-slot cache holding 5 and 11 entries: slots past the length change nothing."""
    q, k, v = _qkv(2, 1, 4, 2, 8, kv_length=16)
    lengths = jnp.asarray([5, 11], jnp.int32)
    out = jit_attend(q, k, v, implementation="xla", is_causal=False, kv_lengths_B=lengths)
    garbage = jnp.where(jnp.arange(16)[None, :, None, None] < lengths[:, None, None, None], k, 1e4)
    out_with_garbage = jit_attend(
        q, garbage.astype(k.dtype), v, implementation="xla", is_causal=False, kv_lengths_B=lengths
    )
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(out_with_garbage, np.float32))
    for row, length in enumerate([5, 11]):
        alone = jit_reference(q[row : row + 1], k[row : row + 1, :length], v[row : row + 1, :length], is_causal=False)
        _close(out[row : row + 1], alone)


def test_auto_is_xla_on_a_cpu():
    q, k, v = _qkv(2, 16, 4, 2, 8)
    auto = jit_attend(q, k, v, implementation="auto", is_causal=True)
    xla = jit_attend(q, k, v, implementation="xla", is_causal=True)
    np.testing.assert_array_equal(np.asarray(auto, np.float32), np.asarray(xla, np.float32))


def test_document_runs_give_each_documents_offset_and_length():
    segments = _segments(3, 32, seed=1)
    lengths, offsets = (np.asarray(a) for a in document_runs(segments))
    assert lengths.shape == (3, 32) and offsets.shape == (3, 33)
    for b, row in enumerate(np.asarray(segments)):
        ids, counts = np.unique(row, return_counts=True)  # ids ascend in contiguous runs
        n = len(ids)
        np.testing.assert_array_equal(lengths[b, :n], counts)
        np.testing.assert_array_equal(offsets[b, :n], np.concatenate([[0], np.cumsum(counts)[:-1]]))
        assert (lengths[b, n:] == -1).all() and (offsets[b, n:] == -1).all()


def _temp_bytes(attention, length):
    q, k, v = _qkv(1, length, 2, 2, 16)

    def loss(q, k, v):
        return attention(q, k, v, is_causal=True).astype(jnp.float32).sum()

    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_xla_never_holds_the_whole_score_matrix():
    """Forward + backward at T = S = 1024: the reference's temporaries hold several [N, T, S] float32 matrices
    (8 MiB each); blocks of 128 queries hold a few [N, 128, S] blocks (1 MiB each) at a time."""
    length = 1024
    whole_scores = 2 * length * length * 4  # N x T x S float32
    reference = _temp_bytes(reference_attention, length)
    blocked = _temp_bytes(lambda *a, **m: xla_attention(*a, query_block=128, **m), length)
    assert reference >= 2 * whole_scores  # scores and probabilities, at least
    assert blocked < whole_scores, (blocked, reference)  # all of its temporaries together: less than one


def test_cudnn_is_refused_on_a_cpu_naming_the_requirement():
    with pytest.raises(UserError) as raised:
        check_attention_setting("cudnn", head_dim=64)
    message = str(raised.value)
    assert "\n" not in message
    for words in ("model.attention=cudnn", "NVIDIA GPU", "compute capability >= 8.0", "cuDNN >= 9.0", "head width"):
        assert words in message
    assert "model.attention=auto" in message
    check_attention_setting("xla", head_dim=64)
    check_attention_setting("auto", head_dim=64)
