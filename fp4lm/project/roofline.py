"""The roofline model of one training step on one GPU, per precision recipe (docs/projection.md explains it:
what each term counts, what is not modelled, and how the efficiencies were fitted)."""

from __future__ import annotations

import dataclasses

from fp4lm.config import ModelConfig
from fp4lm.errors import UserError
from fp4lm.flops import training_flops_per_step
from fp4lm.hardware import GPUSpec, get_gpu
from fp4lm.linear_layers import block_linear_layers


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

    @property
    def tokens(self) -> int:
        return self.batch_per_gpu * self.seq_len

    @property
    def quantized_blocks(self) -> int:
        return max(0, self.model.num_layers - self.bf16_first_layers - self.bf16_last_layers)


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


def _runs_natively(gpu: GPUSpec, cost: RecipeCost) -> bool:
    if cost.gemm_format == "fp4" and gpu.fp4_tflops is None:
        return False
    return gpu.block_scaled_gemm or not cost.block_scaled


def step_components(work: Workload, gpu: GPUSpec, cost: RecipeCost, cal: Calibration = CALIBRATION) -> dict:
    """Seconds per step on one GPU: gemm, quantization, attention, lm_head, elementwise, optimizer."""
    m, tokens, layers = work.model, work.tokens, work.model.num_layers
    bandwidth = gpu.hbm_tb_per_s * 1e12 * cal.memory_efficiency
    bf16_peak = _peak_flops(gpu, "bf16", cal)
    shapes = [(layer.reads, layer.in_features, layer.out_features) for layer in block_linear_layers(m, 0)]
    quantized = work.quantized_blocks if cost.name != "bf16" else 0
    native = _runs_natively(gpu, cost)

    bf16_block = sum(_linear_seconds(tokens, k, n, bf16_peak, 2.0, bandwidth) for _, k, n in shapes)
    if native:
        q_peak, q_bytes = _peak_flops(gpu, cost.gemm_format, cal), cost.operand_bytes
    else:  # emulated: dequantize both operands of each GEMM to bf16, then a bf16 GEMM
        q_peak, q_bytes = bf16_peak, 2.0
    quant_block = sum(_linear_seconds(tokens, k, n, q_peak, q_bytes, bandwidth) for _, k, n in shapes)
    gemm = quant_block * quantized + bf16_block * (layers - quantized)

    inputs = {reads: tokens * k for reads, k, _ in shapes}  # q/k/v and gate/up share an input
    grads = sum(tokens * n for _, _, n in shapes)
    weights = sum(k * n for _, k, n in shapes)
    quant_bytes = cost.quantize_bytes * (sum(inputs.values()) + grads + weights)
    if not native:  # each GEMM reads its two quantized operands and writes them back as bf16
        operands = sum(2 * (tokens * k + tokens * n + k * n) for _, k, n in shapes)
        quant_bytes += (cost.operand_bytes + 2.0) * operands
    quantization = quant_bytes * quantized / bandwidth

    hd = m.resolved_head_dim
    attn_fwd_flops = 2.0 * tokens * work.seq_len * m.num_heads * hd  # causal: half of 4*T*S*H*hd
    attn_bytes = 3.5 * 2.0 * tokens * (2 * m.num_heads + 2 * m.num_kv_heads) * hd
    attention = layers * max(
        3.5 * attn_fwd_flops / (gpu.bf16_tflops * 1e12 * cal.attention_efficiency), attn_bytes / bandwidth
    )

    lm_head = _linear_seconds(tokens, m.d_model, work.vocab_size, bf16_peak, 2.0, bandwidth)
    per_token_block = 10 * m.d_model + 2 * (m.num_heads + m.num_kv_heads) * hd + 3 * m.mlp_dim
    elementwise_bytes = (
        3 * 2.0 * per_token_block * tokens * layers + 6.0 * tokens * work.vocab_size + 6.0 * tokens * m.d_model
    )
    elementwise = elementwise_bytes / bandwidth
    params = workload_params(work)
    optimizer = OPTIMIZER_BYTES_PER_PARAM * params / work.optimizer_shards / bandwidth
    return {
        "gemm": gemm,
        "quantization": quantization,
        "attention": attention,
        "lm_head": lm_head,
        "elementwise": elementwise,
        "optimizer": optimizer,
    }


@dataclasses.dataclass(frozen=True)
class RecipeProjection:
    recipe: str
    step_time_s: float
    tflops_per_gpu: float  # MaxText accounting (fp4lm.flops) / projected step time
    tokens_per_sec: float  # per GPU
    speedup_vs_fp8: float
    speedup_vs_bf16: float
    components: dict  # seconds: gemm, quantization, attention, lm_head, elementwise, optimizer

    @property
    def breakdown(self) -> dict[str, float]:
        """Seconds in GEMM, quantization, attention and everything else; they sum to step_time_s."""
        c = self.components
        return {
            "gemm": c["gemm"],
            "quantization": c["quantization"],
            "attention": c["attention"],
            "other": c["lm_head"] + c["elementwise"] + c["optimizer"],
        }


@dataclasses.dataclass(frozen=True)
class Projection:
    label: str
    gpu: GPUSpec
    workload: Workload
    rows: tuple[RecipeProjection, ...]

    def as_json(self) -> dict[str, dict]:
        return {
            r.recipe: {
                "step_time_s": r.step_time_s,
                "tflops_per_gpu": r.tflops_per_gpu,
                "tokens_per_sec": r.tokens_per_sec,
                "speedup_vs_fp8": r.speedup_vs_fp8,
                "speedup_vs_bf16": r.speedup_vs_bf16,
                "breakdown": r.breakdown,
            }
            for r in self.rows
        }

    def table(self) -> str:
        w = self.workload
        bf16_layers = w.model.num_layers - w.quantized_blocks
        lines = [
            f"projected training step: {self.label} on one {self.gpu.name.upper()} "
            f"({w.batch_per_gpu} x {w.seq_len} = {w.tokens:,} tokens per GPU per step)",
            f"  {bf16_layers} of {w.model.num_layers} blocks kept in bf16; embeddings, LM head and attention "
            "core in bf16; communication assumed overlapped",
            "  calibrated on NVIDIA's MaxText NVFP4/FP8 speedups (Llama 3 8B, 3.1 405B; GB200, GB300) to within 6%",
            "",
            f"{'recipe':<7} {'step':>10} {'TFLOP/s/GPU':>12} {'tokens/s/GPU':>13} {'vs fp8':>7} {'vs bf16':>8}"
            f"  {'GEMM':>5} {'quant':>5} {'attn':>5} {'other':>5}",
        ]
        in_ms = max(r.step_time_s for r in self.rows) < 1.0
        for r in self.rows:
            shares = [100 * v / r.step_time_s for v in r.breakdown.values()]
            lines.append(
                f"{r.recipe:<7} {_format_seconds(r.step_time_s, in_ms):>10} {r.tflops_per_gpu:>12,.0f} "
                f"{r.tokens_per_sec:>13,.0f} {r.speedup_vs_fp8:>6.2f}x {r.speedup_vs_bf16:>7.2f}x  "
                + " ".join(f"{s:>4.0f}%" for s in shares)
            )
        native = [r.recipe for r in self.rows if not _runs_natively(self.gpu, RECIPE_COSTS[r.recipe])]
        if native:
            lines.append(
                f"  {', '.join(native)}: no tensor cores for this format on {self.gpu.name}; "
                "projected as dequantize + bf16 GEMM"
            )
        return "\n".join(lines)


def _format_seconds(seconds: float, in_ms: bool) -> str:
    return f"{seconds * 1e3:.1f} ms" if in_ms else f"{seconds:.3f} s"


def parse_recipes(recipes) -> tuple[str, ...]:
    names = [r.strip().lower() for r in (recipes.split(",") if isinstance(recipes, str) else recipes)]
    names = [n for n in names if n]
    unknown = [n for n in names if n not in RECIPE_COSTS]
    if unknown or not names:
        raise UserError(
            f"unknown recipe(s) {', '.join(unknown) or '(none given)'}; valid for projection: {', '.join(RECIPE_COSTS)}"
        )
    return tuple(dict.fromkeys(names))


def project(
    work: Workload,
    gpu: GPUSpec | str,
    recipes=DEFAULT_RECIPES,
    *,
    label: str = "model",
    calibration: Calibration = CALIBRATION,
) -> Projection:
    """Projects one training step per recipe; speedups are against fp8 and bf16 on the same workload."""
    gpu = get_gpu(gpu) if isinstance(gpu, str) else gpu
    recipes = parse_recipes(recipes)
    flops = training_flops_per_step(work.model, work.vocab_size, work.seq_len, work.batch_per_gpu).total
    times = {}
    for name in dict.fromkeys((*recipes, "fp8", "bf16")):
        times[name] = step_components(work, gpu, RECIPE_COSTS[name], calibration)
    rows = []
    for name in recipes:
        step = sum(times[name].values())
        rows.append(
            RecipeProjection(
                recipe=name,
                step_time_s=step,
                tflops_per_gpu=flops / step / 1e12,
                tokens_per_sec=work.tokens / step,
                speedup_vs_fp8=sum(times["fp8"].values()) / step,
                speedup_vs_bf16=sum(times["bf16"].values()) / step,
                components=times[name],
            )
        )
    return Projection(label, gpu, work, tuple(rows))


def workload_params(work: Workload) -> int:
    """Parameters of the projected model: its linear layers and embeddings (what the optimizer term counts)."""
    m = work.model
    weights = sum(layer.in_features * layer.out_features for layer in block_linear_layers(m, 0))
    return m.num_layers * weights + work.vocab_size * m.d_model * (1 if m.tie_embeddings else 2)
