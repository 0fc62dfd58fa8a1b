"""The roofline model of one training step on one GPU, per precision recipe (docs/projection.md explains it:
what each term counts, what is not modelled, and how the efficiencies were fitted)."""

from __future__ import annotations

import dataclasses

from fp4lm.config import ModelConfig
from fp4lm.hardware import GPUSpec
from fp4lm.linear_layers import block_linear_layers, model_parameters


@dataclasses.dataclass(frozen=True)
class RecipeCost:
    """What a recipe costs the roofline: the GEMM's peak, operand size and the quantization traffic."""

    name: str
    gemm_format: str  # "bf16" | "fp8" | "fp4": which peak the quantized GEMMs run at
    block_scaled: bool  # needs block-scaled tensor cores (else emulated on GPUs without them)
    operand_bytes: float  # bytes per GEMM operand element, block scales included
    quantize_bytes: float  # HBM bytes per element of a tensor to produce all its quantized copies


RECIPE_COSTS: dict[str, RecipeCost] = {
    r.name: r
    for r in (
        RecipeCost("bf16", "bf16", False, 2.0, 0.0),
        # Per-tensor current scaling: amax read (2 B) + quantize read (2 B) + two 1-byte copies.
        RecipeCost("fp8", "fp8", False, 1.0, 2.0 + 2.0 + 2 * 1.0),
        # One E8M0 byte per 32 elements; local scales need no amax pass: read (2 B) + two copies.
        RecipeCost("mxfp8", "fp8", True, 1.0 + 1 / 32, 2.0 + 2 * (1.0 + 1 / 32)),
        # Half a byte per element + one E4M3 byte per 16: amax pass (incl. the post-RHT amax of the
        # columnwise copy, computed in the same read) + quantize read + rowwise and columnwise copies.
        RecipeCost("nvfp4", "fp4", True, 0.5 + 1 / 16, 2.0 + 2.0 + 2 * (0.5 + 1 / 16)),
        RecipeCost("mxfp4", "fp4", True, 0.5 + 1 / 32, 2.0 + 2 * (0.5 + 1 / 32)),
    )
}
DEFAULT_RECIPES = ("bf16", "fp8", "mxfp8", "nvfp4")


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Fractions of datasheet peak reached on average; ONE set for every model, GPU and recipe.

    How it was fitted: a ratio of step times does not change when every efficiency is scaled by the same
    factor, so the four published NVFP4/FP8 speedups (`PUBLISHED`) can fix only ratios. We fixed the bf16
    and fp8 GEMM efficiency at 0.70 and flash attention at 0.50 (priors: typical large-GEMM and cuDNN
    attention throughput on Blackwell), then grid-searched the FP4 GEMM efficiency (0.30..0.75, step 0.01)
    and the memory efficiency (0.30..0.90, step 0.02) for the smallest largest-relative-error over the four
    speedups. The best fit leaves about +-6%: the two Llama 3 8B points pull opposite ways (GB300, with 1.5x
    the FP4 peak of GB200, was published with the smaller speedup), so no single model does better on both.
    The absolute TFLOP/s figures are not fitted (see `calibration_report`).
    """

    gemm_efficiency_bf16: float
    gemm_efficiency_fp8: float
    gemm_efficiency_fp4: float
    attention_efficiency: float  # flash attention, of the bf16 peak
    memory_efficiency: float  # memory-bound kernels, of the HBM bandwidth


CALIBRATION = Calibration(
    gemm_efficiency_bf16=0.70,  # prior: large Blackwell GEMMs average ~70% of dense peak in a training step
    gemm_efficiency_fp8=0.70,  # prior, same as bf16
    gemm_efficiency_fp4=0.70,  # fitted (0.30..0.75 searched): no extra FP4 penalty was needed
    attention_efficiency=0.50,  # prior: cuDNN flash attention, forward + backward average
    memory_efficiency=0.42,  # fitted (0.30..0.90 searched); also absorbs remat, unfused ops, launch gaps
)

GROUPED_GEMM_EFFICIENCY = 0.85
"""The routed experts' grouped GEMMs reach this fraction of a dense GEMM's efficiency at the same shape: a prior,
not fitted (no published MoE step times with their layouts pin it down), for the per-group tile tails and
scheduling of a grouped GEMM at balanced routing. The small per-expert row counts are priced by the roofline
itself: each expert's weight is read for its few tokens, so such GEMMs turn memory-bound."""
ROUTER_PEAK_FRACTION = 0.5  # the float32 router GEMM runs on TF32 tensor cores, half the bf16 rate

OPTIMIZER_BYTES_PER_PARAM = 30  # fp32 AdamW: read p, g, m, v (16 B); write p, m, v (12 B); bf16 copy (2 B)
OPTIMIZER_SHARDS = 8  # FSDP degree over which the optimizer state is split (one NVLink node)


@dataclasses.dataclass(frozen=True)
class Workload:
    """One GPU's share of a training step: the model shape and the tokens this GPU processes."""

    model: ModelConfig
    vocab_size: int
    seq_len: int
    batch_per_gpu: int  # sequences per GPU per step (MaxText's per_device_batch_size)
    bf16_first_layers: int = 0
    bf16_last_layers: int = 0
    optimizer_shards: int = OPTIMIZER_SHARDS
    expert_parallel: int = 1  # GPUs the experts are split over (mesh.expert): the all-to-all's group
    tensor_parallel: int = 1  # GPUs each dense layer's weight is split over (Megatron TP, sequence parallel)
    context_parallel: int = 1  # GPUs each sequence is split over (ring attention)

    @property
    def tokens(self) -> int:
        """Tokens this GPU's GEMMs run over: its sequences' share under context parallelism."""
        return self.batch_per_gpu * self.seq_len // self.context_parallel

    @property
    def local_tokens(self) -> int:
        """Tokens this GPU holds between its tensor-parallel layers (sequence parallel: a 1/TP share)."""
        return self.tokens // self.tensor_parallel

    @property
    def quantized_range(self) -> range:
        return range(self.bf16_first_layers, max(self.bf16_first_layers, self.model.num_layers - self.bf16_last_layers))

    @property
    def quantized_blocks(self) -> int:
        return len(self.quantized_range)

    def block_counts(self, quantized: bool) -> tuple[int, int]:
        """(dense blocks, MoE blocks) among the quantized blocks, or among all blocks."""
        blocks = self.quantized_range if quantized else range(self.model.num_layers)
        moe = self.model.moe_block_count(blocks)
        return len(blocks) - moe, moe

    def all_to_all_bytes(self) -> float:
        """Bytes each GPU sends per step in the experts' dispatch and combine: every MoE block sends each of its
        tokens' k bf16 rows to their experts' GPUs and gets them back, forward and backward (4 transfers), the
        share (EP-1)/EP leaving the GPU at balanced routing. 0 without expert parallelism."""
        m, ep = self.model, self.expert_parallel
        if ep <= 1 or not m.num_experts:
            return 0.0
        rows = self.local_tokens * m.experts_per_token
        return 4 * 2.0 * rows * m.d_model * (ep - 1) / ep * m.moe_block_count()


def _gemm_seconds(
    m: int, k: int, n: int, peak_flops: float, operand_bytes: float, out_bytes: float, bandwidth: float
) -> float:
    flops = 2.0 * m * k * n
    moved = operand_bytes * (m * k + k * n) + out_bytes * m * n
    return max(flops / peak_flops, moved / bandwidth)


def _linear_seconds(tokens: int, k: int, n: int, peak_flops: float, operand_bytes: float, bandwidth: float) -> float:
    """fprop (M,K,N) and dgrad (M,N,K) write bf16; wgrad (K,M,N) writes the fp32 weight gradient."""
    return (
        _gemm_seconds(tokens, k, n, peak_flops, operand_bytes, 2, bandwidth)
        + _gemm_seconds(tokens, n, k, peak_flops, operand_bytes, 2, bandwidth)
        + _gemm_seconds(k, tokens, n, peak_flops, operand_bytes, 4, bandwidth)
    )


def _peak_flops(gpu: GPUSpec, gemm_format: str, cal: Calibration) -> float:
    peak, eff = {
        "bf16": (gpu.bf16_tflops, cal.gemm_efficiency_bf16),
        "fp8": (gpu.fp8_tflops, cal.gemm_efficiency_fp8),
        "fp4": (gpu.fp4_tflops, cal.gemm_efficiency_fp4),
    }[gemm_format]
    return peak * 1e12 * eff


def runs_natively(gpu: GPUSpec, cost: RecipeCost) -> bool:
    if cost.gemm_format == "fp4" and gpu.fp4_tflops is None:
        return False
    return gpu.block_scaled_gemm or not cost.block_scaled


@dataclasses.dataclass(frozen=True)
class GemmShape:
    """`count` GEMMs of one linear layer in a block: `rows` tokens (per expert for routed experts) by K -> N."""

    reads: str  # the activation it reads (q/k/v share one, gate/up another)
    rows: int
    k: int
    n: int
    count: int = 1  # routed experts: one grouped GEMM of `count` groups
    efficiency: float = 1.0  # of the dense GEMM efficiency (GROUPED_GEMM_EFFICIENCY for routed experts)


def block_gemms(work: Workload, index: int) -> list[GemmShape]:
    """The linear layers of block `index` as GEMM shapes on one GPU. Routed experts at balanced routing, with
    expert parallelism EP: the GPU holds X / EP experts and runs each over the tokens the EP GPUs route to it,
    EP · tokens · k / X rows (the same tokens · k rows in all as without it, over 1/EP of the weights).

    Tensor parallelism TP splits every other layer's weight Megatron's way: the layers reading the residual
    stream by their output features, the others (o, down) by their input features. Routed experts are not
    split (expert tensor parallelism 1, Megatron's default for MoE); they route the GPU's sequence-parallel
    share of the tokens."""
    m, tokens, ep, tp = work.model, work.tokens, work.expert_parallel, work.tensor_parallel
    shapes = []
    for layer in block_linear_layers(m, index):
        if layer.experts:
            rows = max(1, ep * work.local_tokens * layer.experts_per_token // layer.experts)
            shape = GemmShape(layer.reads, rows, layer.in_features, layer.out_features, layer.experts // ep)
            shapes.append(dataclasses.replace(shape, efficiency=GROUPED_GEMM_EFFICIENCY))
        elif layer.reads.endswith("_norm"):  # column-parallel: q/k/v, gate/up
            shapes.append(GemmShape(layer.reads, tokens, layer.in_features, layer.out_features // tp))
        else:  # row-parallel: o, down
            shapes.append(GemmShape(layer.reads, tokens, layer.in_features // tp, layer.out_features))
    return shapes


def _block_gemm_seconds(shapes: list[GemmShape], peak: float, operand_bytes: float, bandwidth: float) -> float:
    return sum(
        s.count * _linear_seconds(s.rows, s.k, s.n, peak * s.efficiency, operand_bytes, bandwidth) for s in shapes
    )


def _quantization_bytes(shapes: list[GemmShape], cost: RecipeCost, native: bool, weight_passes: float) -> float:
    """HBM bytes of one block's quantization passes: each input once (q/k/v, gate/up share one), each output
    gradient, each weight `weight_passes` times; emulated, each GEMM also rereads its operands and writes them
    back as bf16."""
    inputs = {s.reads: s.rows * s.count * s.k for s in shapes}
    grads = sum(s.rows * s.count * s.n for s in shapes)
    weights = sum(s.count * s.k * s.n for s in shapes)
    total = cost.quantize_bytes * (sum(inputs.values()) + grads + weight_passes * weights)
    if not native:
        operands = sum(2 * s.count * (s.rows * s.k + s.rows * s.n + s.k * s.n) for s in shapes)
        total += (cost.operand_bytes + 2.0) * operands
    return total


def step_components(
    work: Workload, gpu: GPUSpec, cost: RecipeCost, cal: Calibration = CALIBRATION, weight_passes: float = 1.0
) -> dict:
    """Seconds per step on one GPU: gemm, quantization, attention, elementwise, lm_head, optimizer.

    `weight_passes`: how many times this quantizes the weights; a microbatch of a step that shares one
    quantized copy of each weight over its microbatches (TransformerEngine quantizes on the first) passes
    1 / microbatches.

    A mixture of experts adds its blocks' routed GEMMs (`block_gemms`), the float32 router and the dispatch's
    gathers and scatters; the all-to-all of expert parallelism is assumed overlapped, as all communication
    is here (`Workload.all_to_all_bytes` gives its volume)."""
    m, tokens, layers = work.model, work.tokens, work.model.num_layers
    bandwidth = gpu.hbm_tb_per_s * 1e12 * cal.memory_efficiency
    bf16_peak = _peak_flops(gpu, "bf16", cal)
    native = runs_natively(gpu, cost)
    if native:
        q_peak, q_bytes = _peak_flops(gpu, cost.gemm_format, cal), cost.operand_bytes
    else:  # emulated: dequantize both operands of each GEMM to bf16, then a bf16 GEMM
        q_peak, q_bytes = bf16_peak, 2.0
    all_dense, all_moe = work.block_counts(quantized=False)
    quant_dense, quant_moe = work.block_counts(quantized=True) if cost.name != "bf16" else (0, 0)
    blocks = {False: (all_dense, quant_dense), True: (all_moe, quant_moe)}

    gemm = quantization = 0.0
    for is_moe, shapes in block_kinds(work).items():
        total, quantized = blocks[is_moe]
        bf16_block = _block_gemm_seconds(shapes, bf16_peak, 2.0, bandwidth)
        quant_block = _block_gemm_seconds(shapes, q_peak, q_bytes, bandwidth)
        gemm += quant_block * quantized + bf16_block * (total - quantized)
        quantization += _quantization_bytes(shapes, cost, native, weight_passes) * quantized / bandwidth
    if all_moe:
        router = _linear_seconds(
            work.local_tokens, m.d_model, m.num_experts, bf16_peak * ROUTER_PEAK_FRACTION, 4.0, bandwidth
        )
        gemm += router * all_moe

    # tensor parallelism splits the heads (key/value heads fewer than TP are replicated)
    tp = work.tensor_parallel
    hd, heads, kv_heads = m.resolved_head_dim, m.num_heads // tp, -(-m.num_kv_heads // tp)
    attn_fwd_flops = 2.0 * tokens * work.seq_len * heads * hd  # causal: half of 4*T*S*H*hd
    attn_bytes = 3.5 * 2.0 * tokens * (2 * heads + 2 * kv_heads) * hd
    attention = layers * max(
        3.5 * attn_fwd_flops / (gpu.bf16_tflops * 1e12 * cal.attention_efficiency), attn_bytes / bandwidth
    )

    # the LM head is split over its vocabulary, the loss over the same shards
    vocab = work.vocab_size // tp
    head_bytes = 6.0 * tokens * vocab + 6.0 * work.local_tokens * m.d_model  # cross-entropy, embedding
    lm_head = _linear_seconds(tokens, m.d_model, vocab, bf16_peak, 2.0, bandwidth) + head_bytes / bandwidth
    attention_width = 10 * m.d_model + 2 * (m.num_heads + m.num_kv_heads) * hd
    moe_width = 3 * (m.experts_per_token + m.num_shared_experts) * m.resolved_moe_mlp_dim  # the experts' SwiGLU
    per_token = attention_width * layers + 3 * m.mlp_dim * all_dense + moe_width * all_moe
    # dispatch: each (token, expert) row gathered in and scattered out, forward and backward (8 bf16 moves)
    dispatch_bytes = 8 * 2.0 * m.experts_per_token * m.d_model * tokens * all_moe
    # sequence parallelism splits every elementwise pass over the tensor-parallel GPUs
    elementwise = (3 * 2.0 * per_token * tokens + dispatch_bytes) / tp / bandwidth
    # AdamW updates this GPU's shard: the routed experts are split over the expert-parallel group, the rest
    # over the FSDP shards
    experts = routed_expert_params(work)
    held = experts / work.expert_parallel + (workload_params(work) - experts) / work.optimizer_shards
    optimizer = OPTIMIZER_BYTES_PER_PARAM * held / bandwidth
    return {
        "gemm": gemm,
        "quantization": quantization,
        "attention": attention,
        "elementwise": elementwise,
        "lm_head": lm_head,
        "optimizer": optimizer,
    }


def workload_params(work: Workload) -> int:
    """Parameters of the projected model (what the optimizer term counts): fp4lm.linear_layers.model_parameters,
    the count the trainer and its dry run use."""
    return model_parameters(work.model, work.vocab_size).held


def active_params(work: Workload) -> int:
    """Parameters a token uses: its k routed experts' of each MoE block and every other parameter (the same
    function's count)."""
    return model_parameters(work.model, work.vocab_size).active


def routed_expert_params(work: Workload) -> int:
    """Parameters of the routed experts, every MoE block's (0 for a dense model)."""
    m = work.model
    _, moe = work.block_counts(quantized=False)
    if not moe:
        return 0
    return moe * sum(layer.params for layer in block_linear_layers(m, _block_of_kind(m, True)) if layer.experts)


def _block_of_kind(m: ModelConfig, moe: bool) -> int:
    """A block index of that kind: dense blocks come first (model.first_dense_layers), MoE blocks last."""
    return m.num_layers - 1 if moe else 0


def block_kinds(work: Workload) -> dict[bool, list[GemmShape]]:
    """{is MoE: that kind of block's GEMMs}, for the kinds the model has."""
    dense, moe = work.block_counts(quantized=False)
    kinds = {False: dense, True: moe}
    return {kind: block_gemms(work, _block_of_kind(work.model, kind)) for kind, count in kinds.items() if count}
