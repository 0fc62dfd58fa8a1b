"""The cuDNN attention path, checked on a CPU: attention (forward + backward) lowered for CUDA.

`jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))` needs no GPU, but JAX asks the machine for its
cuDNN version and compute capability before choosing cuDNN's kernel; the fixture answers as a Hopper GPU
with cuDNN 9.10 would. With implementation "cudnn" the program holds cuDNN's fused attention custom calls
(`__cudnn$fmhaSoftmax` forward, `__cudnn$fmhaSoftmaxBackward`) and no [T, S] tensor; with "xla" it holds none.

FP8 attention (precision.attention=fp8) runs on the XLA path: its six GEMMs (QKᵀ, P·V and their dgrad and
wgrad) take per-tensor FP8 operands, converted to f8E4M3FN (Q, K, P, V) and f8E5M2 (dS, dO) in the program,
then widened exactly to bf16 for dots with float32 results (fp4lm's emulated GEMM for per-tensor FP8,
fp4lm.quant.gemm). jax's own cuDNN FP8 attention is checked too, for why fp4lm does not use it.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

from fp4lm.model.attention import attend

FORWARD, BACKWARD = "__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward"
B, T, N, K, H = 2, 128, 4, 2, 64  # grouped-query: 2 query heads per key/value head


@pytest.fixture
def hopper_with_cudnn(monkeypatch):
    from jax._src.cudnn import fused_attention_stablehlo as cudnn

    monkeypatch.setattr(cudnn, "check_cudnn_version", lambda: 91000)
    monkeypatch.setattr(cudnn, "check_compute_capability", lambda capability: float(capability) <= 9.0)


def _lowered(implementation, *, documents=False, decode=False, precision="bf16"):
    length = 1 if decode else T
    q = jnp.zeros((B, length, N, H), jnp.bfloat16)
    kv = jnp.zeros((B, T, K, H), jnp.bfloat16)
    masks = {"is_causal": not decode, "precision": precision}
    if documents:
        masks["segment_ids_BT"] = jnp.asarray([[1] * 50 + [2] * 78, [1] * 128], jnp.int32)
    if decode:
        masks["kv_lengths_B"] = jnp.asarray([5, 100], jnp.int32)

    def forward_backward(q, k, v):  # a decode step is inference: forward only
        if decode:
            return attend(q, k, v, implementation=implementation, **masks)
        out, vjp = jax.vjp(lambda q, k, v: attend(q, k, v, implementation=implementation, **masks), q, k, v)
        return out, vjp(out)

    return jax.jit(forward_backward).trace(q, kv, kv).lower(lowering_platforms=("cuda",)).as_text()


def _custom_calls(text):
    return re.findall(r"stablehlo\.custom_call @([\w$]+)", text)


def _has_score_matrix(text):
    """Any tensor with a [T, S] = [128, 128] trailing pair: a score matrix, mask or bias."""
    return re.search(rf"tensor<(\d+x)*{T}x{T}x(f32|bf16|i1)>", text) is not None


@pytest.mark.parametrize("documents", [False, True], ids=["causal", "causal+documents"])
def test_cudnn_lowers_to_cudnn_flash_attention_without_a_score_matrix(hopper_with_cudnn, documents):
    text = _lowered("cudnn", documents=documents)
    calls = _custom_calls(text)
    assert calls.count(FORWARD) == 1 and calls.count(BACKWARD) == 1, calls
    assert not _has_score_matrix(text)


def test_cudnn_decode_step_passes_the_cache_lengths(hopper_with_cudnn):
    text = _lowered("cudnn", decode=True)
    assert _custom_calls(text).count(FORWARD) == 1, _custom_calls(text)
    assert re.search(r"tensor<2xi32>", text)  # the lengths [5, 100] reach the kernel as the KV sequence lengths


def test_xla_has_no_cudnn_call(hopper_with_cudnn):
    text = _lowered("xla", documents=True)
    assert not [call for call in _custom_calls(text) if call.startswith("__cudnn$fmha")]
    assert _has_score_matrix(text)  # T = 128 <= one block of queries: XLA's attention holds the block's scores
    assert "f8E" not in text  # bf16 attention (the default) has no FP8 anywhere


def _fp8_converts(text, dtype):
    """The shapes of the tensors converted to FP8 `dtype`: the GEMMs' quantized operands."""
    return set(re.findall(rf"stablehlo\.convert .* -> tensor<([0-9x]+)x{dtype}>", text))


def _dots(text):
    """(lhs, rhs, result) tensor types of every dot_general, in program order."""
    pattern = r"stablehlo\.dot_general .*: \(tensor<([0-9a-zA-Z]+)>, tensor<([0-9a-zA-Z]+)>\) -> tensor<([0-9a-zA-Z]+)>"
    return re.findall(pattern, text)


@pytest.mark.parametrize("documents", [False, True], ids=["causal", "causal+documents"])
def test_fp8_attention_runs_all_six_gemms_on_fp8_operands(hopper_with_cudnn, documents):
    """Each GEMM is [batch, rows, contraction] x [batch, columns, contraction] with batch = B*K (key/value heads)
    and rows = T*G (the G query heads of a key/value head, each with T queries). Seven dots: QKᵀ, P·V, QKᵀ again
    (the query block is recomputed for the backward pass), then dP = dO·Vᵀ, dV = Pᵀ·dO, dQ = dS·K, dK = dSᵀ·Q."""
    text = _lowered("xla", documents=documents, precision="fp8")
    bk, rows, keys = B * K, T * (N // K), T

    def shape(*dims):
        return "x".join(str(d) for d in (bk, *dims))

    # E4M3: Q, K, P, and V as [BK, H, S]; E5M2: dS, dO and their transposes (each its own per-tensor scale).
    assert _fp8_converts(text, "f8E4M3FN") == {shape(rows, H), shape(keys, H), shape(rows, keys), shape(H, keys)}
    assert _fp8_converts(text, "f8E5M2") == {shape(rows, keys), shape(keys, rows), shape(rows, H), shape(H, rows)}

    def gemm(lhs, rhs, out):
        return (f"{lhs}xbf16", f"{rhs}xbf16", f"{out}xf32")

    q, k, p, v_t = shape(rows, H), shape(keys, H), shape(rows, keys), shape(H, keys)
    d_out, d_scores = shape(rows, H), shape(rows, keys)
    assert _dots(text) == [
        gemm(q, k, p),  # S = QKᵀ
        gemm(p, v_t, d_out),  # O = P·V
        gemm(q, k, p),  # S again (recomputed)
        gemm(d_out, shape(keys, H), d_scores),  # dP = dO·Vᵀ
        gemm(shape(H, rows), shape(keys, rows), shape(H, keys)),  # dVᵀ = dOᵀ·P
        gemm(d_scores, shape(H, keys), shape(rows, H)),  # dQ = dS·K
        gemm(shape(keys, rows), shape(H, rows), shape(keys, H)),  # dK = dSᵀ·Q
    ]
    assert not [call for call in _custom_calls(text) if call.startswith("__cudnn$fmha")]


def test_jax_cudnn_fp8_attention_takes_no_document_masks(hopper_with_cudnn):
    """Why model.attention=cudnn refuses precision.attention=fp8 (fp4lm.model.attention's doc): jax's cuDNN FP8
    attention exists (its own custom calls, lowered here with the head width 128 its training path needs), but
    takes only the causal mask, and every scale (of P, O, dP, dQ, dK, dV) is an input set before the kernel runs."""
    from jax._src.cudnn import fused_attention_stablehlo as cudnn

    q = jnp.zeros((B, T, N, 128), jnp.float8_e4m3fn)
    scales = {name: jnp.ones((1, 1, 1, 1), jnp.float32) for name in cudnn.fp8_params_keys}

    def fp8_attention(q, k, v, scales, mask_type=cudnn.MaskType.CAUSAL, **lengths):
        return cudnn.dot_product_attention(
            q, k, v, fp8_params=scales, scale=0.1, mask_type=mask_type, use_fp8=True, **lengths
        )[0]

    def forward_backward(q, k, v, scales):
        out, vjp = jax.vjp(lambda q, k, v: fp8_attention(q, k, v, scales), q, k, v)
        return out, vjp(out)

    text = jax.jit(forward_backward).trace(q, q, q, scales).lower(lowering_platforms=("cuda",)).as_text()
    assert _custom_calls(text) == ["__cudnn$fmhaSoftmaxF8", "__cudnn$fmhaSoftmaxBackwardF8"]
    lengths = {"q_seqlen": jnp.full((B,), T, jnp.int32), "kv_seqlen": jnp.full((B,), T, jnp.int32)}
    with pytest.raises(ValueError, match="Only NO_MASK or CAUSAL"):
        fp8_attention(q, q, q, scales, cudnn.MaskType.PADDING_CAUSAL, **lengths)
