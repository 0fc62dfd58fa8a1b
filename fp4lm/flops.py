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

Mixture-of-experts blocks (MaxText's `calculate_routed_and_shared_ffn_tflops_per_device`, the DeepSeek
case: dense first blocks, shared and routed experts) count the ACTIVE parameters, the weights a token
multiplies:
  - routed experts: experts_per_token SwiGLUs of width moe_mlp_dim per token (of the num_experts held);
  - shared experts: num_shared_experts SwiGLUs of width moe_mlp_dim, as one SwiGLU of their summed width;
  - the router: 2·tokens·d_model·num_experts forward ("gate_flops"), also times 3; counted in `router`,
    not `linear` (it is float32, never quantized);
  - the first `first_dense_layers` blocks: their dense SwiGLU of width mlp_dim.
Each block is counted from its own projections, so a model of dense and MoE blocks is counted block by
block. Dispatch (the sort, the gathers and scatters) and dropped pairs are not counted (MaxText neither).

`linear` is the part our precision recipes quantize (q/k/v/o/gate/up/down, and the experts' projections, in
every block): the sum over the projections of `fp4lm.linear_layers`, the model's one list of them, of
their active parameters.
"""

from __future__ import annotations

import dataclasses

from fp4lm.config import ModelConfig
from fp4lm.linear_layers import linear_layers


@dataclasses.dataclass(frozen=True)
class FlopsBreakdown:
    """FLOPs of one training step (forward + backward), MaxText accounting. All values in FLOPs."""

    linear: float  # the quantizable q/k/v/o/gate/up/down GEMMs of every block (a MoE block's active ones)
    attention: float  # QKᵀ and P·V, causal-halved
    lm_head: float  # the unembedding projection
    embedding: float  # the input embedding lookup: a gather, 0 by MaxText's convention
    total: float
    router: float = 0.0  # the MoE blocks' float32 routers, D -> num_experts (0 for a dense model)

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def training_flops_per_step(model_cfg: ModelConfig, vocab_size: int, seq_len: int, batch_size: int) -> FlopsBreakdown:
    """FLOPs of one training step on `batch_size` sequences of `seq_len` tokens (MaxText accounting).

    Pass the per-device batch to get per-device FLOPs, as MaxText does, or the global batch for the whole step.
    """
    tokens = batch_size * seq_len
    layers = model_cfg.num_layers
    forward_weight_flops_per_token = 2 * sum(layer.active_params for layer in linear_layers(model_cfg))
    linear = 3 * forward_weight_flops_per_token * tokens
    moe_blocks = model_cfg.moe_block_count()
    router = 3 * 2 * tokens * model_cfg.d_model * model_cfg.num_experts * moe_blocks
    causal_forward = 4 * batch_size * seq_len**2 * model_cfg.num_heads * model_cfg.resolved_head_dim / 2
    attention = 3 * causal_forward * layers
    lm_head = 3 * 2 * tokens * model_cfg.d_model * vocab_size
    embedding = 0.0
    return FlopsBreakdown(
        linear=float(linear),
        attention=float(attention),
        lm_head=float(lm_head),
        embedding=embedding,
        total=float(linear + router + attention + lm_head + embedding),
        router=float(router),
    )
