"""The cuDNN attention path, checked on a CPU: attention (forward + backward) lowered for CUDA.

`jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))` needs no GPU, but JAX asks the machine for its
cuDNN version and compute capability before choosing cuDNN's kernel; the fixture answers as a Hopper GPU
with cuDNN 9.10 would. With implementation "cudnn" the program holds cuDNN's fused attention custom calls
(`__cudnn$fmhaSoftmax` forward, `__cudnn$fmhaSoftmaxBackward`) and no [T, S] tensor; with "xla" it holds none.
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


def _lowered(implementation, *, documents=False, decode=False):
    length = 1 if decode else T
    q = jnp.zeros((B, length, N, H), jnp.bfloat16)
    kv = jnp.zeros((B, T, K, H), jnp.bfloat16)
    masks = {"is_causal": not decode}
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
