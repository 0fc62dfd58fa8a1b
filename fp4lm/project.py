"""`fp4lm project`: a roofline projection of one training step per precision recipe on a datacenter GPU.

We cannot run FP4 tensor cores here, so this model answers "what would NVFP4 buy on a Blackwell GPU?" from
datasheet peaks, a byte count of every memory-bound pass, and a few efficiency constants fitted once
against NVIDIA's published MaxText NVFP4-vs-FP8 measurements (`calibration_report()`).

One step on ONE GPU, for `tokens = batch_per_gpu * seq_len` tokens (data/FSDP parallelism: every GPU runs
every layer on its own tokens), is the sum of:
- gemm: the three GEMMs of every linear layer (q/k/v/o/gate/up/down): fprop Y=X·W (M,K,N), dgrad dX=dY·Wᵀ
  (M,N,K), wgrad dW=Xᵀ·dY (K,M,N). Each is a roofline, max(FLOPs / (peak of its format * GEMM
  efficiency), bytes / usable HBM bandwidth), with operands at the format's bytes per element (scales
  included), bf16 outputs and an fp32 weight gradient. Layers kept in bf16 (precision.bf16_first_layers /
  bf16_last_layers) run at the bf16 peak and are not quantized.
- quantization: memory-bound passes at usable HBM bandwidth. Per quantized tensor (every distinct linear
  input X, every output gradient dY, every weight W) the recipe's `quantize_bytes` per element: bf16 reads
  (an amax pass when the format has a per-tensor scale, then the quantize pass) plus the writes of BOTH
  quantized copies (rowwise for fprop/dgrad, columnwise, Hadamard-transformed for NVFP4, for wgrad).
  Weights are quantized after the FSDP all-gather, so every GPU quantizes every layer's full weights each
  step. On a GPU without the format's tensor cores (Hopper: no FP4, no block-scaled MX GEMMs) the GEMM
  runs emulated: each operand is dequantized to bf16 (another pass) and multiplied at the bf16 peak.
- attention: the flash-attention core in bf16 for every recipe, causal, with the real backward cost
  (2.5x its forward, as it recomputes QKᵀ), at the bf16 peak * attention efficiency (or HBM-bound).
- other: the LM head (three bf16 GEMMs), elementwise work (RMSNorms, residual adds, RoPE, SwiGLU, forward
  and ~2x again backward; cross-entropy over the logits; the embedding gather and its scatter-add), and the
  fp32 AdamW update (30 bytes per parameter) of this GPU's 1/`optimizer_shards` slice of the parameters.

Not modelled: communication (FSDP all-gathers and reduce-scatters are assumed hidden behind compute, as
MaxText overlaps them), pipeline bubbles, remat recomputation, kernel launch gaps. The fitted efficiency
constants absorb what these cost on average, which is why they are fitted on measured runs.

TFLOP/s per GPU use MaxText's accounting (fp4lm.flops), so they are comparable with MaxText's logs.

Assumptions (a typical MaxText GPU run; NVIDIA's blog does not give its batch or mesh):
- tokens per GPU per step = `--batch` (default: the config's project.batch_per_device, MaxText's
  per_device_batch_size; not train.batch_size, the trainer's global batch) x `--seq` (default data.seq_len).
  Presets: Llama 3 8B 2 x 8192 = 16,384 tokens, Llama 3 70B and 3.1 405B 1 x 8192 = 8,192 tokens per GPU,
  FSDP over the data axis.
- the optimizer state is sharded over `OPTIMIZER_SHARDS` = 8 GPUs (negligible either way at these sizes).
- bf16 blocks: MaxText scans the decoder with one quantization for every block, so the presets keep none
  in bf16, matching the measured runs. The paper's recipe keeps ~16% of blocks in bf16 (first 2 and last
  8 of 62); project it with precision.bf16_first_layers / bf16_last_layers in the config or `overrides`.
  They apply to every quantized recipe alike (the paper's FP8 baseline also kept its first and last blocks).
- fp8 = per-tensor current scaling (E4M3/E5M2), as fp4lm's fp8 recipe; mxfp8/mxfp4/nvfp4 as in
  `RECIPE_COSTS`. All seven linear layers of a block are quantized (MaxText passes the quantizer to
  q/k/v/o as well as the MLP); the attention core (QKᵀ, softmax, P·V) stays bf16.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

from fp4lm.config import ModelConfig
from fp4lm.errors import UserError
from fp4lm.flops import training_flops_per_step
from fp4lm.linear_layers import block_linear_layers


@dataclasses.dataclass(frozen=True)
class GPUSpec:
    """Dense (not 2:4-sparse) tensor-core peaks per GPU in TFLOP/s, HBM bandwidth in TB/s."""

    name: str
    bf16_tflops: float
    fp8_tflops: float
    fp4_tflops: float | None  # None: no FP4 tensor cores
    hbm_tb_per_s: float
    block_scaled_gemm: bool  # tensor cores that consume MXFP8 / MXFP4 / NVFP4 block scales (Blackwell)
    source: str


GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in (
        GPUSpec(
            "h100",
            989,
            1979,
            None,
            3.35,
            False,
            "H100 SXM datasheet: FP8 3,958 / BF16 1,979 TFLOPS with sparsity (half dense); HBM3 3.35 TB/s",
        ),
        GPUSpec(
            "h200", 989, 1979, None, 4.8, False, "H200 SXM datasheet: same tensor cores as H100 SXM; HBM3e 4.8 TB/s"
        ),
        GPUSpec(
            "b200",
            2250,
            4500,
            9000,
            8.0,
            True,
            "NVIDIA NVFP4 blog fig. 1 (9 PF FP4 dense, 18 sparse); DGX B200: 64 TB/s HBM3e over 8 GPUs",
        ),
        GPUSpec(
            "gb200",
            2500,
            5000,
            10000,
            8.0,
            True,
            "GB200 NVL72: 1,440 PF FP4 sparse / 72 GPUs / 2; 576 TB/s HBM3e / 72 GPUs",
        ),
        GPUSpec(
            "gb300",
            2500,
            5000,
            15000,
            8.0,
            True,
            "GB300 NVL72 (Blackwell Ultra): 1,080 PF FP4 dense / 72 GPUs; HBM3e 8 TB/s per GPU",
        ),
    )
}


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


def get_gpu(name: str) -> GPUSpec:
    key = name.strip().lower()
    if key not in GPUS:
        raise UserError(f"unknown GPU {name!r}; valid GPUs: {', '.join(GPUS)}")
    return GPUS[key]


def parse_recipes(recipes) -> tuple[str, ...]:
    names = [r.strip().lower() for r in (recipes.split(",") if isinstance(recipes, str) else recipes)]
    names = [n for n in names if n]
    unknown = [n for n in names if n not in RECIPE_COSTS]
    if unknown or not names:
        raise UserError(
            f"unknown recipe(s) {', '.join(unknown) or '(none given)'}; valid for projection: {', '.join(RECIPE_COSTS)}"
        )
    return tuple(dict.fromkeys(names))


def _config_dirs() -> list[pathlib.Path]:
    import fp4lm

    return [pathlib.Path(fp4lm.__file__).resolve().parent.parent / "configs", pathlib.Path.cwd() / "configs"]


def resolve_model(model: str, overrides=()):
    """A preset name (configs/<name>.yaml beside the package, else ./configs) or a YAML path, plus
    `section.key=value` overrides -> (Config, label)."""
    from fp4lm.config import load_config

    path = pathlib.Path(model)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        return load_config(path, list(overrides)), path.stem
    for folder in _config_dirs():
        if (folder / f"{model}.yaml").is_file():
            return load_config(folder / f"{model}.yaml", list(overrides)), model
    presets = sorted({p.stem for folder in _config_dirs() if folder.is_dir() for p in folder.glob("*.yaml")})
    raise UserError(
        f"unknown model preset {model!r}; valid presets: {', '.join(presets) or '(none found)'}; "
        "or pass a YAML config path"
    )


# What the projection can speak for. Its efficiencies were fitted on 8k-token sequences of 8B..405B models
# with 8k..16k tokens per GPU; far beyond these a step's activations fit on no GPU in `GPUS` and the
# printed times would be arithmetic, not a projection.
MAX_SEQ_LEN = 1 << 20  # 1,048,576 tokens (the attention scores grow with its square)
MAX_TOKENS_PER_GPU = 1 << 22  # --batch x --seq: 4,194,304 tokens per GPU per step
MAX_PARAMS = 10**13  # 10 trillion parameters, 25x the largest calibrated model


def workload_from_config(config, *, seq: int | None = None, batch: int | None = None) -> Workload:
    """--seq defaults to data.seq_len; --batch (sequences per GPU) to project.batch_per_device."""
    for flag, value in (("--seq", seq), ("--batch", batch)):
        if value is not None and value <= 0:
            raise UserError(f"{flag} must be a positive integer, got {value}")
    from fp4lm.data.tokenizer import planned_model_vocab_size  # here: the data package imports jax and grain

    work = Workload(
        model=config.model,
        vocab_size=planned_model_vocab_size(config.data),
        seq_len=seq or config.data.seq_len,
        batch_per_gpu=batch or config.project.batch_per_device,
        bf16_first_layers=config.precision.bf16_first_layers,
        bf16_last_layers=config.precision.bf16_last_layers,
    )
    check_projectable(work)
    return work


def check_projectable(work: Workload) -> None:
    """Refuses a workload outside what the projection represents (`MAX_SEQ_LEN`, `MAX_TOKENS_PER_GPU`,
    `MAX_PARAMS`), naming the limit and the flag or key to change."""
    if work.seq_len > MAX_SEQ_LEN:
        raise UserError(
            f"--seq {work.seq_len:,} is longer than {MAX_SEQ_LEN:,} tokens, the longest sequence the "
            "projection represents; pass a smaller --seq (or data.seq_len)"
        )
    if work.tokens > MAX_TOKENS_PER_GPU:
        raise UserError(
            f"--batch x --seq = {work.batch_per_gpu:,} x {work.seq_len:,} = {work.tokens:,} tokens per GPU "
            f"per step, more than the {MAX_TOKENS_PER_GPU:,} the projection represents; pass a smaller "
            "--batch or --seq (or project.batch_per_device)"
        )
    params = workload_params(work)
    if params > MAX_PARAMS:
        raise UserError(
            f"the model has {params:,} parameters, more than the {MAX_PARAMS:,} the projection "
            "represents; reduce model.num_layers, model.d_model, model.mlp_dim or data.vocab_size"
        )


def workload_params(work: Workload) -> int:
    """Parameters of the projected model: its linear layers and embeddings (what the optimizer term counts)."""
    m = work.model
    weights = sum(layer.in_features * layer.out_features for layer in block_linear_layers(m, 0))
    return m.num_layers * weights + work.vocab_size * m.d_model * (1 if m.tie_embeddings else 2)


def main_project(
    model: str,
    gpu: str,
    seq: int | None = None,
    batch: int | None = None,
    recipes=DEFAULT_RECIPES,
    as_json: bool = False,
    overrides=(),
) -> str:
    """What `fp4lm project` prints: the table, or with as_json the per-recipe JSON.

    `overrides` are config `section.key=value` strings, e.g. ["precision.bf16_last_layers=4"] to project
    the paper's recipe with its last blocks kept in bf16 (the presets keep none, like MaxText's runs).
    """
    gpu_spec = get_gpu(gpu)
    recipe_names = parse_recipes(recipes or DEFAULT_RECIPES)
    config, label = resolve_model(model, overrides)
    result = project(workload_from_config(config, seq=seq, batch=batch), gpu_spec, recipe_names, label=label)
    return json.dumps(result.as_json(), indent=2) if as_json else result.table()


def run_project(args=None, **kwargs) -> str:
    """Entry for the CLI: an argparse namespace (model, gpu, seq, batch, recipes, json) or keyword arguments."""
    values = {**(vars(args) if args is not None else {}), **kwargs}
    return main_project(
        model=values["model"],
        gpu=values["gpu"],
        seq=values.get("seq"),
        batch=values.get("batch"),
        recipes=values.get("recipes") or DEFAULT_RECIPES,
        as_json=bool(values.get("json", values.get("as_json", False))),
        overrides=values.get("overrides") or (),
    )


# NVIDIA, "Train Models Faster with JAX and MaxText Using NVFP4 on NVIDIA Blackwell" (2026-06), seq 8192,
# same batch and parallelism for both recipes: (preset, gpu, NVFP4/FP8 speedup, FP8 and NVFP4 TFLOP/s/GPU).
# The speedups are the blog's; the absolute TFLOP/s come from secondary summaries (docs/numerics.md §14).
PUBLISHED = (
    ("llama3-8b", "gb200", 1.35, 149.7, 201.7),
    ("llama3-8b", "gb300", 1.31, 175.9, 230.1),
    ("llama3.1-405b", "gb200", 1.43, 155.7, 222.4),
    ("llama3.1-405b", "gb300", 1.73, 210.3, 363.3),
)


@dataclasses.dataclass(frozen=True)
class CalibrationRow:
    model: str
    gpu: str
    quantity: str
    published: float
    projected: float
    fitted: bool  # False: shown for comparison only

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.projected - self.published) / self.published


def calibration_report(calibration: Calibration = CALIBRATION) -> list[CalibrationRow]:
    """Published vs projected for every point in `PUBLISHED`, with the presets' per-GPU batch.

    Only the four speedups are fitted. The absolute TFLOP/s are listed but not fitted: they would put the
    FP8 GEMMs under 5% of peak (Llama 3 8B, GB200: 149.7 TFLOP/s is 344 us per token, and a 1.35x speedup
    needs >= 89 us of it saved, which only the quantized GEMMs can give and by at most half their time on
    GB200, so FP8 GEMMs would take >= 178 us for 41.9 GFLOP per token, <= 235 TFLOP/s), which no physical
    model reconciles with GEMMs being the part NVFP4 speeds up. They look like a unit or transcription slip.
    """
    rows = []
    for preset, gpu, speedup, fp8_tflops, nvfp4_tflops in PUBLISHED:
        config, _ = resolve_model(preset)
        result = project(workload_from_config(config), gpu, ("fp8", "nvfp4"), calibration=calibration)
        fp8, nvfp4 = result.rows
        rows += [
            CalibrationRow(preset, gpu, "nvfp4/fp8 speedup", speedup, nvfp4.speedup_vs_fp8, True),
            CalibrationRow(preset, gpu, "fp8 TFLOP/s/GPU", fp8_tflops, fp8.tflops_per_gpu, False),
            CalibrationRow(preset, gpu, "nvfp4 TFLOP/s/GPU", nvfp4_tflops, nvfp4.tflops_per_gpu, False),
        ]
    return rows
