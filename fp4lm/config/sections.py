"""The config tree: one frozen dataclass per section, each key with its default, help text and rule.

The allowed values of each choice are declared once here as the fields' `Literal` types and read by the
modules that implement them (`typing.get_args(RematMode)` in fp4lm.model, `DataFormat` in fp4lm.data...).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from fp4lm.config.fields import (
    InRange,
    device_count,
    known_bundled_corpus,
    not_blank,
    positive,
    precision_rules,
    setting,
    source_weights,
    step_count,
)

RematMode = Literal["none", "full", "save_quantized", "save_matmul_operands"]  # fp4lm.model.remat_policy
DataFormat = Literal["auto", "text", "jsonl", "parquet", "npy", "tokens_uint16", "tokens_uint32"]
TokenizerKind = Literal["byte", "bpe"]  # data.tokenizer's keywords; any other value is a tokenizer file's path
Schedule = Literal["cosine", "wsd"]  # wsd: warmup, stable, decay
GemmBackend = Literal["auto", "emulated", "native"]
ProgressDisplay = Literal["auto", "rich", "plain"]
NonfiniteTarget = Literal["grads", "activations"]
RopeScaling = Literal["none", "llama3"]  # fp4lm.model.layers.rope_inverse_frequencies
AttentionImplementation = Literal["auto", "xla", "cudnn"]  # fp4lm.model.attention
AttentionPrecision = Literal["bf16", "fp8"]  # fp4lm.model.attention.PRECISIONS
RouterScore = Literal["softmax", "sigmoid"]  # fp4lm.model.routing.route

BYTE_VOCAB_SIZE = 256
BPE_MIN_VOCAB_SIZE = 260  # the 256 byte tokens and room for merges
DEFAULT_VAL_FRACTION = 0.02  # data.val_fraction and `fp4lm prepare --val-fraction` alike
DEFAULT_BPE_VOCAB_SIZE = 2048  # data.tokenizer=bpe learns this many tokens unless data.vocab_size says otherwise

# model.scan_layers=None turns the layer scan on from this many blocks: below it the unrolled loop compiles
# quickly anyway (and the tiny test models keep their programs), above it compile time grows with depth.
SCAN_LAYERS_FROM = 8

AT_LEAST_ZERO = InRange(0, fix="0 turns it off")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    num_layers: int = setting(4, "transformer blocks", positive)
    d_model: int = setting(256, "the residual stream's width", positive)
    num_heads: int = setting(4, "query heads", positive)
    num_kv_heads: int = setting(2, "key/value heads (grouped-query attention); divides num_heads", positive)
    head_dim: int | None = setting(None, "the attention head width; none: d_model / num_heads", positive)
    mlp_dim: int = setting(768, "the MLP's hidden width", positive)
    rope_theta: float = setting(10000.0, "RoPE's base frequency", positive)
    norm_eps: float = setting(1e-5, "RMSNorm's epsilon", positive)
    tie_embeddings: bool = setting(False, "the LM head reuses the embedding table")
    remat: RematMode = setting("none", "what the backward pass recomputes instead of keeping")
    init_std: float = setting(0.02, "the standard deviation of the initial weights", positive)
    attention: AttentionImplementation = setting("auto", "auto: cuDNN flash attention where it runs, else XLA")
    rope_scaling: RopeScaling = setting("none", "llama3: Llama 3.1's long-context frequency scaling (rope_* keys)")
    rope_scaling_factor: float = setting(8.0, "llama3: low frequencies are divided by this")
    rope_low_freq_factor: float = setting(1.0, "llama3: wavelengths above original_max_positions / this are scaled")
    rope_high_freq_factor: float = setting(4.0, "llama3: wavelengths below original_max_positions / this are kept")
    rope_original_max_positions: int = setting(8192, "llama3: the context length the model was trained at")
    scan_layers: bool | None = setting(
        None, f"blocks in a lax.scan (fp4lm.model.scan); none: on from {SCAN_LAYERS_FROM} blocks"
    )
    qk_norm: bool = setting(False, "RMSNorm of each query and key head before RoPE (Qwen3)")
    # Mixture of experts (fp4lm.model.moe): num_experts > 0 replaces the MLP of every block after the first
    # first_dense_layers by routed SwiGLU experts.
    num_experts: int = setting(0, "routed experts per MoE block; 0: a dense model", AT_LEAST_ZERO)
    experts_per_token: int = setting(2, "top-k: the experts each token is sent to", positive)
    moe_mlp_dim: int | None = setting(None, "each expert's hidden width; none: mlp_dim", positive)
    num_shared_experts: int = setting(0, "always-on experts of width moe_mlp_dim (DeepSeek, Qwen2-MoE)", AT_LEAST_ZERO)
    first_dense_layers: int = setting(0, "the first blocks keep a dense MLP (DeepSeek's first_k_dense)", AT_LEAST_ZERO)
    router_score: RouterScore = setting("softmax", "softmax (Mixtral, Qwen3) or sigmoid (DeepSeek-V3) router scores")
    router_renormalize: bool = setting(True, "the top-k weights are rescaled to sum to 1 (Mixtral, Qwen3, DeepSeek-V3)")
    load_balance_loss: float = setting(
        0.01,
        "coefficient of the load-balancing loss (Switch), over the global batch (per micro-batch when accumulating)",
        InRange(0.0, fix="e.g. 0.01"),
    )
    router_bias_update: float = setting(
        0.0, "DeepSeek-V3's loss-free balancing: the selection bias moves by this per step; 0: off", AT_LEAST_ZERO
    )
    router_z_loss: float = setting(0.0, "coefficient of the router z-loss (ST-MoE); 0: off", AT_LEAST_ZERO)
    capacity_factor: float | None = setting(
        None, "tokens an expert takes, as a multiple of its even share; none: dropless", positive
    )

    @property
    def resolved_head_dim(self) -> int:
        """The attention head width: `head_dim`, or d_model / num_heads when that is None."""
        return self.head_dim or self.d_model // self.num_heads

    @property
    def resolved_moe_mlp_dim(self) -> int:
        """Each routed expert's hidden width: `moe_mlp_dim`, or mlp_dim when that is None."""
        return self.moe_mlp_dim or self.mlp_dim

    def is_moe_block(self, index: int) -> bool:
        """Whether block `index` has routed experts (a MoE model's blocks from first_dense_layers on)."""
        return self.num_experts > 0 and index >= self.first_dense_layers

    def moe_block_count(self, blocks: range | None = None) -> int:
        """How many of `blocks` (a step-1 range; default every block) have routed experts, in closed form:
        sizes are checked before anything is built, for models of any depth."""
        blocks = range(self.num_layers) if blocks is None else blocks
        return len(range(max(blocks.start, self.first_dense_layers), blocks.stop)) if self.num_experts else 0

    @property
    def resolved_scan_layers(self) -> bool:
        """`scan_layers`, or when None: on for models of at least SCAN_LAYERS_FROM blocks."""
        return self.num_layers >= SCAN_LAYERS_FROM if self.scan_layers is None else self.scan_layers


@dataclasses.dataclass(frozen=True)
class DataSource:
    """One source of a mixture (data.sources): a file, a directory or a prepared directory, and its weight."""

    path: str = setting(dataclasses.MISSING, "a file, a directory, a prepared directory, or bundled:NAME")
    weight: float = setting(1.0, "its relative sampling rate; 0 leaves it out (data.sources checks them together)")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    path: str = setting(
        "bundled:shakespeare",
        "a file, a directory, a prepared directory, or a corpus shipped in the package",
        known_bundled_corpus,
    )
    format: DataFormat = setting("auto", "the source's format; auto: by each file's suffix")
    text_field: str = setting("text", "the JSONL field or Parquet column that holds a document's text", not_blank)
    tokenizer: str = setting(
        "bpe", "byte, bpe, or the path of a tokenizer.json / SentencePiece .model (fp4lm.tokenizer)", not_blank
    )
    vocab_size: int | None = setting(
        None, f"bpe: the tokens it learns (none: {DEFAULT_BPE_VOCAB_SIZE}); else a larger model vocabulary", positive
    )
    vocab_multiple: int = setting(
        128, "the model's vocabulary is the tokenizer's rounded up to a multiple of this", positive
    )
    seq_len: int = setting(256, "tokens per training sequence", InRange(1, fix="set a positive length, e.g. 256"))
    val_fraction: float = setting(
        DEFAULT_VAL_FRACTION,
        "the share of each source held out for validation",
        InRange(0.0, 1.0, "e.g. 0.02", low_open=True, high_open=True),
    )
    sources: tuple[DataSource, ...] = setting(
        (), "a mixture [{path, weight}, ...] (PATH:WEIGHT,... on the command line)", source_weights
    )
    val_path: str | None = setting(None, "a separate validation source; none: each source's held-out part")
    document_masking: bool = setting(True, "attention stays inside each document (raw and prepared sources alike)")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    batch_size: int = setting(16, "sequences per step, over all devices", positive)
    steps: int = setting(600, "optimizer steps", step_count)
    seed: int = setting(0, "the random seed of the initial weights, the data order and stochastic rounding")
    run_dir: str = setting("runs/default", "where checkpoints, metrics and the run's config are written")
    compilation_cache_dir: str | None = setting(None, "JAX's persistent compilation cache (reused across runs)")
    overwrite: bool = setting(
        False, "start over in a run_dir that holds something: its contents move to RUN_DIR.old-<time>"
    )
    allow_recipe_change: bool = setting(False, "resume with another precision.recipe (recorded in metrics.jsonl)")
    check_memory: bool = setting(True, "refuse a run the memory estimate says cannot fit (fp4lm.train.memory)")
    grad_accum_steps: int = setting(
        1, "split each batch of train.batch_size sequences into this many micro-batches", positive
    )
    init_from: str | None = setting(None, "a Hugging Face Llama directory: its shape, tokenizer and weights at step 0")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    lr: float = setting(3e-3, "the peak learning rate", positive)
    min_lr_ratio: float = setting(0.1, "the final learning rate as a fraction of lr", InRange(0.0, 1.0, "e.g. 0.1"))
    warmup_steps: int = setting(50, "steps of linear warmup", InRange(0, fix="e.g. 50"))
    schedule: Schedule = setting("cosine", "the learning rate after warmup: cosine, or wsd (warmup, stable, decay)")
    decay_fraction: float = setting(
        0.2, "wsd: final fraction of steps spent decaying", InRange(0.0, 1.0, "e.g. 0.2", low_open=True)
    )
    b1: float = setting(0.9, "Adam's first-moment decay", InRange(0.0, 1.0, "e.g. 0.9", low_open=True, high_open=True))
    b2: float = setting(
        0.95, "Adam's second-moment decay", InRange(0.0, 1.0, "e.g. 0.95", low_open=True, high_open=True)
    )
    eps: float = setting(1e-8, "Adam's epsilon", positive)
    weight_decay: float = setting(0.1, "decoupled weight decay", InRange(0.0, fix="e.g. 0.1"))
    grad_clip: float = setting(1.0, "the global gradient norm is clipped to this", positive)
    decay_norms_and_embeddings: bool = setting(False, "weight decay applies to norms and embeddings too")


@dataclasses.dataclass(frozen=True)
class PrecisionConfig:
    recipe: str = setting("nvfp4", "the quantization recipe of the linear layers (fp4lm.quant.recipes)")
    bf16_first_layers: int = setting(
        0, "this many of the first blocks stay in bf16 (both: at most num_layers)", InRange(0, fix="count blocks")
    )
    bf16_last_layers: int = setting(
        0, "this many of the last blocks stay in bf16 (both: at most num_layers)", InRange(0, fix="count blocks")
    )
    bf16_after: float | None = setting(
        None,
        "fraction of train.steps after which quantized layers run in bf16",
        InRange(0.0, 1.0, "give a fraction of training, e.g. 0.8"),
    )
    backend: GemmBackend = setting(
        "auto", "the quantized GEMM: emulated (dequantize, then matmul), native (FP4 tensor cores), or auto"
    )
    rules: tuple[str, ...] = setting(
        (), '"REGEX=RECIPE" over layer paths, first match wins, before bf16_first/last_layers', precision_rules
    )
    shared_weight_scale: bool = setting(False, "q/k/v share one NVFP4 weight amax, gate/up another (as served, fused)")
    attention: AttentionPrecision = setting(
        "bf16", "fp8: attention's QKᵀ and P·V in per-tensor FP8 (E4M3, E5M2 gradients) on XLA; softmax stays float32"
    )
    fp4_param_gather: bool = setting(
        False, "under FSDP, gather each weight's NVFP4 codes and tile scales (4 bits) instead of its bf16 values"
    )


@dataclasses.dataclass(frozen=True)
class LossScaleConfig:
    enabled: bool | None = setting(None, "none: on for quantized recipes, off for bf16")
    initial_scale: float = setting(2.0**15, "the loss scale of the first step", positive)
    growth_interval: int = setting(200, "finite steps before the scale grows", positive)
    growth_factor: float = setting(
        2.0, "the scale grows by this after growth_interval finite steps", InRange(1.0, fix="e.g. 2.0")
    )
    backoff_factor: float = setting(
        0.5,
        "the scale shrinks by this after a non-finite step",
        InRange(0.0, 1.0, "e.g. 0.5", low_open=True, high_open=True),
    )
    min_scale: float = setting(1.0, "the scale never falls below this", positive)
    max_scale: float = setting(2.0**24, "the scale never grows above this", positive)
    max_consecutive_skips: int = setting(10, "this many non-finite steps in a row stop the run (exit code 3)", positive)


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    every: int = setting(200, "steps between checkpoints", positive)
    keep: int = setting(3, "the newest checkpoints kept", positive)
    enabled: bool = setting(True, "save checkpoints")
    async_save: bool = setting(True, "write in the background while training continues")


@dataclasses.dataclass(frozen=True)
class MetricsConfig:
    log_every: int = setting(10, "steps between logged metrics", positive)
    quant_stats_every: int = setting(100, "steps between quantization statistics", positive)
    tensorboard: bool = setting(True, "also write TensorBoard event files")
    peak_tflops: float | None = setting(None, "peak TFLOP/s of one device, for MFU; none: known GPUs only", positive)
    progress: ProgressDisplay = setting("auto", "rich: a progress bar; plain: lines; auto: rich on a terminal")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    every: int = setting(100, "steps between evaluations", positive)
    batches: int = setting(8, "validation batches per evaluation; 0 turns evaluation off", AT_LEAST_ZERO)
    sample_prompt: str = setting("ROMEO:", "the end-of-run sample starts from this text")
    sample_tokens: int = setting(64, "0: no sample at the end of training", AT_LEAST_ZERO)
    sample_temperature: float = setting(0.8, "0: greedy", InRange(0.0, fix="e.g. 0.8 (0: greedy)"))
    sample_top_k: int = setting(40, "0: no top-k filter", AT_LEAST_ZERO)
    sample_top_p: float = setting(
        1.0,
        "nucleus sampling: the fewest likeliest tokens whose probabilities reach it; 1: off",
        InRange(0.0, 1.0, "e.g. 0.9 (1: no filter)", low_open=True),
    )


@dataclasses.dataclass(frozen=True)
class ProfileConfig:
    """A jax.profiler trace of a window of training steps, written to RUN_DIR/profile/."""

    start_step: int = setting(2, "the first traced step (1-based); step 1 compiles", positive)
    steps: int = setting(0, "steps traced; 0: no profile", InRange(0, fix="0 turns profiling off"))


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    data: int = setting(1, "data-parallel devices", device_count)
    fsdp: int = setting(-1, "devices the parameters are sharded over; -1: the rest of the devices", device_count)
    expert: int = setting(
        1,
        "devices a mixture-of-experts model's experts are split over (the batch too, elsewhere); divides "
        "model.num_experts; 1 for a dense model",
        positive,
    )
    tensor: int = setting(1, "tensor-parallel devices", device_count)


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    coordinator_address: str | None = setting(None, '"host:port" of process 0')
    num_processes: int | None = setting(None, "processes of a multi-host run", positive)
    process_id: int | None = setting(None, "this process's index in [0, num_processes)", InRange(0))
    auto_detect: bool = setting(False, "let JAX read a Slurm / Open MPI / TPU / Kubernetes environment")
    timeout_s: int = setting(300, "seconds to wait for the other processes to connect", positive)


@dataclasses.dataclass(frozen=True)
class DebugConfig:
    inject_nonfinite_at: int | None = setting(None, "make this step's gradients non-finite", positive)
    inject_nonfinite_steps: int = setting(1, "how many consecutive steps from inject_nonfinite_at", positive)
    inject_nonfinite_into: NonfiniteTarget = setting("grads", "where the injected non-finite values go")


@dataclasses.dataclass(frozen=True)
class ProjectConfig:
    """`fp4lm project` only (the trainer's train.batch_size is the global batch)."""

    batch_per_device: int = setting(
        1, "sequences per GPU per step, MaxText's per_device_batch_size; --batch overrides", positive
    )


@dataclasses.dataclass(frozen=True)
class Config:
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    precision: PrecisionConfig = PrecisionConfig()
    loss_scale: LossScaleConfig = LossScaleConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    metrics: MetricsConfig = MetricsConfig()
    eval: EvalConfig = EvalConfig()
    mesh: MeshConfig = MeshConfig()
    distributed: DistributedConfig = DistributedConfig()
    debug: DebugConfig = DebugConfig()
    project: ProjectConfig = ProjectConfig()
    profile: ProfileConfig = ProfileConfig()

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(dataclasses.asdict(self))


def _to_plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_plain(v) for v in value]
    return value
