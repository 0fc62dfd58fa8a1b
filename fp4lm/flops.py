"""Analytic training FLOPs of a Llama-style decoder, counted the way MaxText counts them.

The trainer divides `total` by the step time for TFLOP/s and MFU; `fp4lm project` uses the same count,
so its TFLOP/s per GPU are comparable with MaxText's logs and NVIDIA's published MaxText numbers.

The accounting follows MaxText's `calculate_tflops_training_per_device`
(AI-Hypercomputer/maxtext, src/maxtext/utils/maxtext_utils.py), dense decoder case. In our words:

- Every matmul with a learnable weight costs 2·tokens·in·out FLOPs in the forward pass, and the backward pass
  costs twice the forward (one GEMM for the input gradient, one for the weight gradient), so a weight matmul
  contributes 3 · 2 · tokens · in · out = 6 · tokens · in · out per training step.
  - q, k, v:  2·tokens·d_model·(num_heads + 2·num_kv_heads)·head_dim   (forward)
  - o:        2·tokens·d_model·num_heads·head_dim
  - SwiGLU:   2·tokens·d_model·mlp_dim·2 (gate and up, MaxText's `len(mlp_activations)` = 2)
              + 2·tokens·d_model·mlp_dim (down)
  - LM head:  2·tokens·d_model·vocab ("embedding_flops" in MaxText: only the unembedding projection; the
              input embedding is a gather and is counted as zero, tied or not)
- Attention scores and values (QKᵀ and P·V): the non-causal forward is 4·batch·seq²·num_heads·head_dim;
  MaxText halves it for the causal mask (following Megatron-LM and NeMo) and multiplies by 3 for
  forward + backward, so attention = 6·batch·seq²·num_heads·head_dim per layer per step.
  (Real flash-attention backward recomputes QKᵀ and costs ~2.5x its forward; MaxText still counts 3x,
  and so do we, so numbers stay comparable. `fp4lm.project` models the real cost separately.)
- Norms, RoPE, softmax, activations, the optimizer: not counted.

`linear` is the part our precision recipes quantize (q/k/v/o/gate/up/down in every block).
"""

from __future__ import annotations

import dataclasses
from typing import Any

# The quantizable linear layers of one block; full policy paths are `blocks.<i>.<name>` (fp4lm.quant.policy).
LINEAR_LAYER_NAMES = ("attn.q", "attn.k", "attn.v", "attn.o", "mlp.gate", "mlp.up", "mlp.down")


@dataclasses.dataclass(frozen=True)
class FlopsBreakdown:
    """FLOPs of one training step (forward + backward), MaxText accounting. All values in FLOPs."""

    linear: float  # the quantizable q/k/v/o/gate/up/down GEMMs of every block
    attention: float  # QKᵀ and P·V, causal-halved
    lm_head: float  # the unembedding projection
    embedding: float  # the input embedding lookup: a gather, 0 by MaxText's convention
    total: float

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def head_dim_of(model_cfg: Any) -> int:
    """The attention head width: `model.head_dim`, or d_model / num_heads when that is None."""
    head_dim = getattr(model_cfg, "head_dim", None)
    return int(head_dim) if head_dim else model_cfg.d_model // model_cfg.num_heads


def linear_layer_shapes(model_cfg: Any) -> tuple[tuple[str, int, int], ...]:
    """(name, in_features, out_features) of each quantizable linear layer of ONE block."""
    d, mlp, hd = model_cfg.d_model, model_cfg.mlp_dim, head_dim_of(model_cfg)
    q_width, kv_width = model_cfg.num_heads * hd, model_cfg.num_kv_heads * hd
    return (
        ("attn.q", d, q_width),
        ("attn.k", d, kv_width),
        ("attn.v", d, kv_width),
        ("attn.o", q_width, d),
        ("mlp.gate", d, mlp),
        ("mlp.up", d, mlp),
        ("mlp.down", mlp, d),
    )


def linear_params_per_block(model_cfg: Any) -> int:
    return sum(k * n for _, k, n in linear_layer_shapes(model_cfg))


def training_flops_per_step(model_cfg: Any, vocab_size: int, seq_len: int, batch_size: int) -> FlopsBreakdown:
    """FLOPs of one training step on `batch_size` sequences of `seq_len` tokens (MaxText accounting).

    `model_cfg` needs num_layers, d_model, num_heads, num_kv_heads, mlp_dim and optionally head_dim
    (fp4lm.config.ModelConfig or any object with those attributes). Pass the per-device batch to get
    per-device FLOPs, as MaxText does, or the global batch for the whole step.
    """
    tokens = batch_size * seq_len
    layers = model_cfg.num_layers
    forward_weight_flops_per_token = 2 * linear_params_per_block(model_cfg)
    linear = 3 * forward_weight_flops_per_token * tokens * layers
    causal_forward = 4 * batch_size * seq_len**2 * model_cfg.num_heads * head_dim_of(model_cfg) / 2
    attention = 3 * causal_forward * layers
    lm_head = 3 * 2 * tokens * model_cfg.d_model * vocab_size
    embedding = 0.0
    return FlopsBreakdown(
        linear=float(linear),
        attention=float(attention),
        lm_head=float(lm_head),
        embedding=embedding,
        total=float(linear + attention + lm_head + embedding),
    )
