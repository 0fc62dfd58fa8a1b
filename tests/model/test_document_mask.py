"""Document masking: attention stays inside each document (segment ids) and RoPE takes per-row positions.

Checked under the bf16 policy. Under NVFP4 the per-tensor amax spans every position of the batch, so one
document's values can move another's quantization scale (as in any per-tensor recipe), though not its
attention.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from fp4lm.model.attention import allowed_keys
from fp4lm.model.layers import apply_rope, rope_angles
from fp4lm.quant.policy import Policy
from tests.model.helpers import TINY, VOCAB, tiny_model, tokens

LENGTH = 16
FIRST = 7  # row layout: document 1 is tokens [0, 7), document 2 is [7, 16)
SEGMENTS = jnp.asarray([[1] * FIRST + [2] * (LENGTH - FIRST)] * 2, jnp.int32)
POSITIONS = jnp.asarray([list(range(FIRST)) + list(range(LENGTH - FIRST))] * 2, jnp.int32)


@nnx.jit
def _logits(model, toks, segment_ids=None, positions=None):
    """The model's logits, with or without a document layout."""
    return model(toks, segment_ids_BT=segment_ids, positions_BT=positions)


def attention_mask(length: int, segment_ids_BT=None) -> jax.Array:
    """Which keys each query may attend to: bool [T, S] (causal), or [B, T, S] (causal AND same segment)."""
    allowed = allowed_keys(length, length, is_causal=True, segment_ids_BT=segment_ids_BT)
    return allowed[0] if segment_ids_BT is None else allowed


def _model():
    return tiny_model(Policy.bf16(TINY.num_layers))


def test_attention_mask_is_causal_and_stays_inside_each_document():
    segments = np.array([[1, 1, 1, 2, 2, 3, 3, 3], [1, 2, 2, 2, 2, 2, 3, 4]], np.int32)
    mask = np.asarray(attention_mask(8, jnp.asarray(segments)))
    assert mask.shape == (2, 8, 8)
    for b in range(2):
        for t in range(8):
            for s in range(8):
                assert mask[b, t, s] == (s <= t and segments[b, t] == segments[b, s]), (b, t, s)
    np.testing.assert_array_equal(np.asarray(attention_mask(8)), np.tril(np.ones((8, 8), bool)))


def test_an_earlier_document_cannot_change_a_later_documents_logits():
    model, toks = _model(), tokens(length=LENGTH)
    changed = toks.at[:, :FIRST].set((toks[:, :FIRST] + 5) % VOCAB)
    masked = [np.asarray(_logits(model, t, SEGMENTS, POSITIONS)) for t in (toks, changed)]
    np.testing.assert_array_equal(masked[0][:, FIRST:], masked[1][:, FIRST:])
    assert not np.array_equal(masked[0][:, :FIRST], masked[1][:, :FIRST])
    unmasked = [np.asarray(_logits(model, t)) for t in (toks, changed)]
    assert not np.array_equal(unmasked[0][:, FIRST:], unmasked[1][:, FIRST:])


def test_one_document_with_positions_from_zero_is_the_plain_causal_model():
    model, toks = _model(), tokens(length=LENGTH)
    ones = jnp.ones((2, LENGTH), jnp.int32)
    arange = jnp.broadcast_to(jnp.arange(LENGTH, dtype=jnp.int32), (2, LENGTH))
    np.testing.assert_array_equal(np.asarray(_logits(model, toks, ones, arange)), np.asarray(_logits(model, toks)))


def test_a_document_after_another_reads_as_if_it_began_the_row():
    """Positions restart at the document start, so document 2's logits are those of the same tokens at
    the start of a row (up to float32 summation order over the longer masked row)."""
    model, toks = _model(), tokens(length=LENGTH)
    second = toks[:, FIRST:]
    alone = np.asarray(_logits(model, second))
    packed = np.asarray(_logits(model, toks, SEGMENTS, POSITIONS))[:, FIRST:]
    np.testing.assert_allclose(packed, alone, rtol=0, atol=1e-5)
    shifted = np.asarray(_logits(model, toks, SEGMENTS, POSITIONS + 3))[:, FIRST:]
    assert not np.array_equal(shifted, packed)  # the positions reach RoPE


def test_rope_takes_one_row_of_positions_per_sequence():
    x = jax.random.normal(jax.random.key(0), (2, 5, 3, 8), jnp.float32)
    positions = jnp.asarray([[0, 1, 2, 0, 1], [4, 5, 0, 1, 2]])
    both = apply_rope(x, rope_angles(positions, 8, 10000.0))
    for b in range(2):
        row = apply_rope(x[b : b + 1], rope_angles(positions[b], 8, 10000.0))
        np.testing.assert_array_equal(np.asarray(both[b : b + 1]), np.asarray(row))
