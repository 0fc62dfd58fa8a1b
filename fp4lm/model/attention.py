"""The attention core: scores, mask, softmax, weighted sum, behind one entry point `attend`.

Shapes (the letters of fp4lm.shapes): B batch, T queries, S keys, H query heads, K key/value heads (grouped-query
attention: H % K == 0, query head h = k * G + g uses key/value head k, G = H / K; K/V are never repeated to H
heads), E head width, C the queries of one chunk (the xla implementation's block of queries).

Masks: `is_causal` (query t sees keys s <= t; T == S), `segment_ids_BT` (T == S: a query sees only keys of
its own document; each document is one contiguous run of equal ids, as fp4lm.data.pipeline makes them),
`kv_lengths_B` (keys at positions >= the row's length are ignored: the valid part of a KV cache). A decode
step passes T=1 queries with is_causal=False and the cache's lengths.

Implementations (`model.attention`), in bf16 all through `jax.nn.dot_product_attention` or the cuDNN kernel behind it:
- "xla": XLA's attention, run over blocks of QUERY_BLOCK queries (a `lax.map`, each block rematerialised in
  the backward pass), so at most a QUERY_BLOCK x S block of scores exists at a time, never T x S.
- "cudnn": cuDNN's fused flash attention (NVIDIA GPUs, see CUDNN_REQUIREMENT). Causal and KV-length masks
  are cuDNN mask types; documents are cuDNN's packed ("ragged") layout, each run of a segment id one
  sequence given by its offset and length, so no T x S mask or bias is built either.
- "auto": cudnn where `cudnn_unsupported_reason` finds nothing against it, else xla.
- "reference": the plain form (the whole score matrix), kept for tests and the benchmark's baseline.

Numerics: QKᵀ takes bfloat16 inputs with float32 accumulation, the scores are scaled and masked in float32,
the softmax is float32, the probabilities are rounded to bfloat16 for P·V (float32 accumulation), and the
result is rounded to the inputs' dtype. cuDNN does the same inside its kernel (float32 scores, softmax and
accumulators; P in bfloat16 for the second tensor-core GEMM).

FP8 attention (`precision.attention=fp8`, the `precision` argument): QKᵀ and P·V go through fp4lm's quantized
dot_general with the `fp8` recipe (fp4lm.quant.dot), so all three GEMMs of each product, forward and backward,
take per-tensor current-scaled FP8 operands: Q, K, P and V in E4M3, the gradients dS and dO in E5M2, float32
accumulation. P is quantized straight from the float32 softmax. The mask, the scale 1/sqrt(E), the softmax with
its max and sum, and its backward stay float32. It runs on the XLA path only (`fp8_attention`, inside
`xla_attention`'s query blocks, so Q, P, dS and dO get one scale per block of QUERY_BLOCK queries, K and V one
per tensor). jax does expose cuDNN's FP8 attention (`fused_attention_stablehlo.dot_product_attention(use_fp8=True)`),
but it takes no document or KV-length masks, needs head width 128 with sequences a multiple of 128 for training,
and wants the scales of O, dP, dQ, dK and dV before the kernel runs (delayed scaling from an amax history), not
current scaling; so model.attention=cudnn with fp8 is refused (`check_attention_precision`, one line naming
model.attention=xla) and "auto" picks xla. Measured errors: docs/numerics.md §15.
"""

from __future__ import annotations

import math
import typing

import jax
import jax.numpy as jnp

from fp4lm.config import AttentionImplementation, AttentionPrecision, check_attention_precision
from fp4lm.errors import UserError
from fp4lm.quant.dot import dot_general

IMPLEMENTATIONS = (*typing.get_args(AttentionImplementation), "reference")  # the config's choices, and the test oracle
PRECISIONS = typing.get_args(AttentionPrecision)  # precision.attention's choices
QUERY_BLOCK = 256  # queries per block of the xla implementation
CUDNN_REQUIREMENT = (
    "an NVIDIA GPU of compute capability >= 8.0 (>= 9.0 with document masking) with cuDNN >= 9.0, "
    "bfloat16 or float16 q/k/v, and a head width that is a multiple of 8 and <= 128 (<= 256 from compute "
    "capability 9.0)"
)


def attend(
    q_BTHE: jax.Array,
    k_BSKE: jax.Array,
    v_BSKE: jax.Array,
    *,
    implementation: str,
    is_causal: bool,
    segment_ids_BT: jax.Array | None = None,
    kv_lengths_B: jax.Array | None = None,
    precision: str = "bf16",
) -> jax.Array:
    """softmax(q kᵀ / sqrt(E) masked) v per head: [B, T, H, E] in q's dtype (see the module doc).

    `precision` (precision.attention): "bf16", or "fp8" for QKᵀ and P·V in per-tensor FP8 (XLA path only)."""
    _check_shapes(q_BTHE, k_BSKE, v_BSKE, is_causal=is_causal, segment_ids_BT=segment_ids_BT)
    if precision not in PRECISIONS:
        raise ValueError(f"unknown attention precision {precision!r}; expected one of {PRECISIONS}")
    check_attention_precision(implementation, precision)
    masks = {"is_causal": is_causal, "segment_ids_BT": segment_ids_BT, "kv_lengths_B": kv_lengths_B}
    if implementation == "auto" and precision == "fp8":
        implementation = "xla"  # cuDNN has no current-scaled FP8 attention (module doc)
    if implementation == "auto":
        reason = cudnn_unsupported_reason(
            head_dim=q_BTHE.shape[-1], dtype=q_BTHE.dtype, document_masking=segment_ids_BT is not None
        )
        implementation = "xla" if reason else "cudnn"
    if implementation == "xla":
        return xla_attention(q_BTHE, k_BSKE, v_BSKE, **masks, precision=precision)
    if implementation == "cudnn":
        return cudnn_attention(q_BTHE, k_BSKE, v_BSKE, **masks)
    if implementation == "reference" and precision == "fp8":
        allowed_BTS = allowed_keys(q_BTHE.shape[1], k_BSKE.shape[1], **masks)
        return fp8_attention(q_BTHE, k_BSKE, v_BSKE, allowed_BTS)
    if implementation == "reference":
        return reference_attention(q_BTHE, k_BSKE, v_BSKE, **masks)
    raise ValueError(f"unknown attention implementation {implementation!r}; expected one of {IMPLEMENTATIONS}")


def _check_shapes(
    q_BTHE: jax.Array, k_BSKE: jax.Array, v_BSKE: jax.Array, *, is_causal: bool, segment_ids_BT: jax.Array | None
) -> None:
    batch, length, heads, width = q_BTHE.shape
    kv_batch, kv_length, kv_heads, kv_width = k_BSKE.shape
    if v_BSKE.shape != k_BSKE.shape or (kv_batch, kv_width) != (batch, width) or heads % kv_heads:
        raise ValueError(f"attention shapes q {q_BTHE.shape}, k {k_BSKE.shape}, v {v_BSKE.shape} do not fit")
    if (is_causal or segment_ids_BT is not None) and kv_length != length:
        raise ValueError(f"causal or segment masks need as many keys as queries, got T={length}, S={kv_length}")


def _allowed(
    query_positions_T: jax.Array,
    kv_length: int,
    *,
    is_causal: bool,
    query_segments_BT: jax.Array | None,
    key_segments_BS: jax.Array | None,
    kv_lengths_B: jax.Array | None,
) -> jax.Array:
    """bool [1 or B, T, S]: may the query at each of `query_positions_T` see each key (module doc)."""
    keys_S = jnp.arange(kv_length)
    allowed = jnp.ones((1, query_positions_T.shape[0], kv_length), dtype=bool)
    if is_causal:
        allowed = allowed & (keys_S[None, None, :] <= query_positions_T[None, :, None])
    if query_segments_BT is not None and key_segments_BS is not None:
        allowed = allowed & (query_segments_BT[:, :, None] == key_segments_BS[:, None, :])
    if kv_lengths_B is not None:
        allowed = allowed & (keys_S[None, None, :] < kv_lengths_B[:, None, None])
    return allowed


def allowed_keys(
    length: int,
    kv_length: int,
    *,
    is_causal: bool,
    segment_ids_BT: jax.Array | None = None,
    kv_lengths_B: jax.Array | None = None,
) -> jax.Array:
    """Which keys each query may attend to: bool broadcastable to [B, T, S] (see the module doc for the masks)."""
    return _allowed(
        jnp.arange(length),
        kv_length,
        is_causal=is_causal,
        query_segments_BT=segment_ids_BT,
        key_segments_BS=segment_ids_BT,
        kv_lengths_B=kv_lengths_B,
    )


def reference_attention(
    q_BTHE: jax.Array,
    k_BSKE: jax.Array,
    v_BSKE: jax.Array,
    *,
    is_causal: bool,
    segment_ids_BT: jax.Array | None = None,
    kv_lengths_B: jax.Array | None = None,
) -> jax.Array:
    """The plain form: the whole [B, K, G, T, S] score matrix in float32, masked with float32's minimum."""
    batch, length, heads, width = q_BTHE.shape
    kv_length, kv_heads = k_BSKE.shape[1], k_BSKE.shape[2]
    q_BTKGE = q_BTHE.reshape(batch, length, kv_heads, heads // kv_heads, width)
    scores_BKGTS = jnp.einsum("btkge,bske->bkgts", q_BTKGE, k_BSKE, preferred_element_type=jnp.float32)
    scores_BKGTS = scores_BKGTS / math.sqrt(width)
    allowed_BTS = allowed_keys(
        length, kv_length, is_causal=is_causal, segment_ids_BT=segment_ids_BT, kv_lengths_B=kv_lengths_B
    )
    scores_BKGTS = jnp.where(allowed_BTS[:, None, None], scores_BKGTS, jnp.finfo(jnp.float32).min)
    probs_BKGTS = jax.nn.softmax(scores_BKGTS, axis=-1).astype(q_BTHE.dtype)
    out_BTKGE = jnp.einsum("bkgts,bske->btkge", probs_BKGTS, v_BSKE, preferred_element_type=jnp.float32)
    return out_BTKGE.astype(q_BTHE.dtype).reshape(batch, length, heads, width)


# QKᵀ and P·V in per-tensor current-scaled FP8 (the `fp8` recipe: E4M3 operands, E5M2 gradients); the names
# appear in the quantized dot's errors.
_FP8_SCORES = dot_general("fp8", name="attention QKᵀ")
_FP8_VALUES = dot_general("fp8", name="attention P·V")


def fp8_attention(q_BTHE: jax.Array, k_BSKE: jax.Array, v_BSKE: jax.Array, allowed_BTS: jax.Array) -> jax.Array:
    """The reference form with QKᵀ and P·V in FP8 (module doc): [B, T, H, E] in q's dtype.

    `allowed_BTS`: bool, broadcastable to [B, T, S] (`allowed_keys`). The two products run through the quantized
    dot_general with grouped-query batch dimensions (B, K), whose custom VJP quantizes the backward GEMMs too;
    the mask, the scale and the softmax are float32, and P is quantized from float32, not bfloat16.
    """
    batch, length, heads, width = q_BTHE.shape
    kv_heads = k_BSKE.shape[2]
    q_BTKGE = q_BTHE.reshape(batch, length, kv_heads, heads // kv_heads, width)
    # [B, T, K, G, E] x [B, S, K, E] -> [B, K, T, G, S]: batch B and K, contract E
    scores_BKTGS = _FP8_SCORES(q_BTKGE, k_BSKE, (((4,), (3,)), ((0, 2), (0, 2))), preferred_element_type=jnp.float32)
    scores_BKTGS = scores_BKTGS / math.sqrt(width)
    allowed_BKTGS = allowed_BTS[:, None, :, None, :]
    scores_BKTGS = jnp.where(allowed_BKTGS, scores_BKTGS, jnp.finfo(jnp.float32).min)
    probs_BKTGS = jax.nn.softmax(scores_BKTGS, axis=-1)
    # [B, K, T, G, S] x [B, S, K, E] -> [B, K, T, G, E]: batch B and K, contract S
    out_BKTGE = _FP8_VALUES(probs_BKTGS, v_BSKE, (((4,), (1,)), ((0, 1), (0, 2))), preferred_element_type=jnp.float32)
    return out_BKTGE.swapaxes(1, 2).reshape(batch, length, heads, width).astype(q_BTHE.dtype)


def xla_attention(
    q_BTHE: jax.Array,
    k_BSKE: jax.Array,
    v_BSKE: jax.Array,
    *,
    is_causal: bool,
    segment_ids_BT: jax.Array | None = None,
    kv_lengths_B: jax.Array | None = None,
    query_block: int = QUERY_BLOCK,
    precision: str = "bf16",
) -> jax.Array:
    """`jax.nn.dot_product_attention(implementation="xla")` over blocks of `query_block` queries.

    Each block sees all S keys, so its softmax is exact (no running maximum across blocks); the blocks run
    one after another in a `lax.map` under `jax.checkpoint`, so neither pass holds more than one block's
    [B, H, C, S] scores (C = query_block). The last block is padded with queries whose output is dropped.
    With `precision="fp8"` each block runs `fp8_attention` instead (the same blocks, masks and padding).
    """
    batch, length, heads, width = q_BTHE.shape
    kv_length = k_BSKE.shape[1]
    block = min(query_block, length)
    blocks = -(-length // block)
    padding = blocks * block - length
    q_BTHE = jnp.pad(q_BTHE, ((0, 0), (0, padding), (0, 0), (0, 0)))
    lengths_B = None if kv_lengths_B is None else kv_lengths_B.astype(jnp.int32)
    # K and V enter the blocks in float32 (exactly, and are rounded back inside), so the backward pass sums
    # the blocks' dK and dV contributions in float32, not bfloat16.
    k_dtype, k_BSKE, v_BSKE = k_BSKE.dtype, k_BSKE.astype(jnp.float32), v_BSKE.astype(jnp.float32)

    def one_block(start: jax.Array, q_BCHE: jax.Array, segments_BC: jax.Array | None) -> jax.Array:
        allowed_BCS = _allowed(
            start + jnp.arange(block),
            kv_length,
            is_causal=is_causal,
            query_segments_BT=segments_BC,
            key_segments_BS=segment_ids_BT,
            kv_lengths_B=lengths_B,
        )
        k_BSKE_, v_BSKE_ = k_BSKE.astype(k_dtype), v_BSKE.astype(k_dtype)
        if precision == "fp8":
            return fp8_attention(q_BCHE, k_BSKE_, v_BSKE_, allowed_BCS)
        return jax.nn.dot_product_attention(q_BCHE, k_BSKE_, v_BSKE_, mask=allowed_BCS[:, None], implementation="xla")

    if blocks == 1:
        out_BTHE = jax.checkpoint(one_block)(jnp.int32(0), q_BTHE, segment_ids_BT)
        return out_BTHE[:, :length]
    # the chunks lead (lax.map's axis): q [chunks, B, C, H, E], segment ids [chunks, B, C]
    q_chunks = q_BTHE.reshape(batch, blocks, block, heads, width).swapaxes(0, 1)
    segment_chunks = None
    if segment_ids_BT is not None:  # padded queries get id -1: no key matches, their (dropped) output is finite
        padded_BT = jnp.pad(segment_ids_BT, ((0, 0), (0, padding)), constant_values=-1)
        segment_chunks = padded_BT.reshape(batch, blocks, block).swapaxes(0, 1)
    chunk_starts = jnp.arange(blocks, dtype=jnp.int32) * block
    out_chunks = jax.lax.map(lambda xs: jax.checkpoint(one_block)(*xs), (chunk_starts, q_chunks, segment_chunks))
    return out_chunks.swapaxes(0, 1).reshape(batch, blocks * block, heads, width)[:, :length]


def document_runs(segment_ids_BT: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cuDNN's packed layout of the documents in each row: (lengths [B, T], offsets [B, T + 1]), int32.

    Row b's documents (runs of equal ids) start at offsets[b, :n] and last lengths[b, :n] tokens; the
    remaining entries are -1 (cuDNN's padding). T entries hold any row, since a row has at most T runs.
    """
    batch, length = segment_ids_BT.shape
    starts_run_BT = jnp.concatenate(
        [jnp.ones((batch, 1), bool), segment_ids_BT[:, 1:] != segment_ids_BT[:, :-1]], axis=1
    )
    starts_BT = jnp.sort(jnp.where(starts_run_BT, jnp.arange(length), length), axis=1).astype(jnp.int32)
    ends_BT = jnp.concatenate([starts_BT[:, 1:], jnp.full((batch, 1), length, jnp.int32)], axis=1)
    is_run_BT = starts_BT < length
    lengths_BT = jnp.where(is_run_BT, ends_BT - starts_BT, -1)
    offsets_BT = jnp.concatenate([jnp.where(is_run_BT, starts_BT, -1), jnp.full((batch, 1), -1, jnp.int32)], axis=1)
    return lengths_BT, offsets_BT


def cudnn_attention(
    q_BTHE: jax.Array,
    k_BSKE: jax.Array,
    v_BSKE: jax.Array,
    *,
    is_causal: bool,
    segment_ids_BT: jax.Array | None = None,
    kv_lengths_B: jax.Array | None = None,
) -> jax.Array:
    """cuDNN flash attention: causal and KV lengths as cuDNN mask types, documents as its packed layout."""
    if segment_ids_BT is None:
        lengths_B = None if kv_lengths_B is None else kv_lengths_B.astype(jnp.int32)
        return jax.nn.dot_product_attention(
            q_BTHE, k_BSKE, v_BSKE, is_causal=is_causal, key_value_seq_lengths=lengths_B, implementation="cudnn"
        )
    if kv_lengths_B is not None:
        raise ValueError("cudnn attention takes segment ids or KV lengths, not both")
    # jax.nn.dot_product_attention takes documents only as a mask (a [B, 1, T, S] bias for cuDNN); the packed
    # layout is the function behind it, which takes each document's offset and length instead.
    from jax._src.cudnn import fused_attention_stablehlo as cudnn

    lengths_BT, offsets_BT = document_runs(segment_ids_BT)
    mask_type = cudnn.MaskType.PADDING_CAUSAL if is_causal else cudnn.MaskType.PADDING
    out_BTHE = cudnn.dot_product_attention(
        q_BTHE,
        k_BSKE,
        v_BSKE,
        q_seqlen=lengths_BT,
        kv_seqlen=lengths_BT,
        q_offsets=offsets_BT,
        kv_offsets=offsets_BT,
        scale=1.0 / math.sqrt(q_BTHE.shape[-1]),
        mask_type=mask_type,
    )
    assert isinstance(out_BTHE, jax.Array)  # the output alone (no residuals or fp8 statistics were asked for)
    return out_BTHE


def cudnn_unsupported_reason(
    *, head_dim: int, dtype=jnp.bfloat16, document_masking: bool = False, device=None
) -> str | None:
    """Why cuDNN flash attention cannot run here (None: it can), against CUDNN_REQUIREMENT."""
    device = jax.devices()[0] if device is None else device
    if device.platform != "gpu" or "cuda" not in getattr(device.client, "platform_version", "").lower():
        return f"this machine computes on {device.platform}, not an NVIDIA GPU"
    capability = float(getattr(device, "compute_capability", 0.0))
    if capability < 8.0 or (document_masking and capability < 9.0):
        return f"the GPU's compute capability is {capability}" + (" with document masking" if document_masking else "")
    from jax._src.cudnn.fused_attention_stablehlo import check_cudnn_version

    try:
        version = check_cudnn_version()
    except RuntimeError:
        return "cuDNN is not found"
    if version < 90000:
        return f"cuDNN is version {version}"
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"q/k/v are {jnp.dtype(dtype).name}"
    if head_dim % 8 or head_dim > (256 if capability >= 9.0 else 128):
        return f"the head width is {head_dim}"
    return None


def check_attention_setting(setting: str, *, head_dim: int) -> None:
    """Refuses model.attention=cudnn where cuDNN flash attention cannot run (one line naming the requirement)."""
    if setting != "cudnn":
        return
    reason = cudnn_unsupported_reason(head_dim=head_dim)
    if reason is not None:
        raise UserError(
            f"model.attention=cudnn needs {CUDNN_REQUIREMENT}, but {reason}; "
            "set model.attention=auto (cuDNN where it runs, XLA elsewhere) or model.attention=xla",
            settings=("model.attention",),
        )
