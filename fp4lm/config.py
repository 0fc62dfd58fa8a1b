"""The run configuration: frozen nested dataclasses with defaults in code.

YAML files in configs/ hold overrides only, nested by section; the command line adds `section.key=value`
overrides on top. A path the run reads (`data.path`) given in a YAML file is relative to that file's directory,
one given on the command line to the current directory; either way the config holds it absolute (or as
`bundled:<name>`, a corpus shipped in the package, see fp4lm.resources). Every mistake (unknown key, wrong
type, non-finite number, key given twice, impossible combination) is a `UserError` whose one-line message
names the key and the fix. `keys_help()` lists every key with its type and default (`fp4lm train --help`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import types
import typing
from typing import Any, Literal

import yaml

from fp4lm import resources
from fp4lm.errors import UserError

# The allowed values of each choice: declared once here as the fields' types, checked by `validate()` and read
# by the modules that implement them (`typing.get_args(RematMode)` in fp4lm.model, `DataFormat` in fp4lm.data...).
RematMode = Literal["none", "full", "save_quantized", "save_matmul_operands"]  # fp4lm.model.remat_policy
DataFormat = Literal["auto", "text", "jsonl", "parquet", "npy", "tokens_uint16", "tokens_uint32"]
TokenizerKind = Literal["byte", "bpe"]  # data.tokenizer's keywords; any other value is a tokenizer file's path
Schedule = Literal["cosine", "wsd"]  # wsd: warmup, stable, decay
GemmBackend = Literal["auto", "emulated", "native"]
ProgressDisplay = Literal["auto", "rich", "plain"]
NonfiniteTarget = Literal["grads", "activations"]
RopeScaling = Literal["none", "llama3"]  # fp4lm.model.layers.rope_inverse_frequencies
AttentionImplementation = Literal["auto", "xla", "cudnn"]  # fp4lm.model.attention

BYTE_VOCAB_SIZE = 256
BPE_MIN_VOCAB_SIZE = 260  # the 256 byte tokens and room for merges
DEFAULT_BPE_VOCAB_SIZE = 2048  # data.tokenizer=bpe learns this many tokens unless data.vocab_size says otherwise


# model.scan_layers=None turns the layer scan on from this many blocks: below it the unrolled loop compiles
# quickly anyway (and the tiny test models keep their programs), above it compile time grows with depth.
SCAN_LAYERS_FROM = 8


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    num_layers: int = 4
    d_model: int = 256
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int | None = None  # None: d_model // num_heads
    mlp_dim: int = 768
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    remat: RematMode = "none"
    init_std: float = 0.02
    attention: AttentionImplementation = "auto"  # auto: cuDNN flash attention where it runs, else XLA
    rope_scaling: RopeScaling = "none"  # "llama3": Llama 3.1's long-context frequency scaling, the keys below
    rope_scaling_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_positions: int = 8192
    scan_layers: bool | None = None  # blocks in a lax.scan (fp4lm.model.scan); None: on from SCAN_LAYERS_FROM blocks

    @property
    def resolved_head_dim(self) -> int:
        """The attention head width: `head_dim`, or d_model / num_heads when that is None."""
        return self.head_dim or self.d_model // self.num_heads

    @property
    def resolved_scan_layers(self) -> bool:
        """`scan_layers`, or when None: on for models of at least SCAN_LAYERS_FROM blocks."""
        return self.num_layers >= SCAN_LAYERS_FROM if self.scan_layers is None else self.scan_layers


@dataclasses.dataclass(frozen=True)
class DataSource:
    """One source of a mixture (data.sources): a file, a directory or a prepared directory, and its weight."""

    path: str
    weight: float = 1.0


@dataclasses.dataclass(frozen=True)
class DataConfig:
    path: str = "bundled:shakespeare"  # a file, a directory, a prepared directory, or a corpus shipped in the package
    format: DataFormat = "auto"
    text_field: str = "text"  # the JSONL field or Parquet column that holds a document's text
    tokenizer: str = "bpe"  # byte, bpe, or the path of a tokenizer.json / SentencePiece .model (fp4lm.data.tokenizer)
    vocab_size: int | None = None  # bpe: the tokens it learns (None: 2048); else a larger model vocabulary
    vocab_multiple: int = 128  # the model's vocabulary is the tokenizer's rounded up to a multiple of this
    seq_len: int = 256
    val_fraction: float = 0.02
    sources: tuple[DataSource, ...] = ()  # a mixture [{path, weight}, ...] (PATH:WEIGHT,... on the command line)
    val_path: str | None = None  # a separate validation source; none: each source's held-out part
    document_masking: bool = True  # attention stays inside each document (raw and prepared sources alike)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    batch_size: int = 16
    steps: int = 600
    seed: int = 0
    run_dir: str = "runs/default"
    compilation_cache_dir: str | None = None  # JAX's persistent compilation cache (reused across runs)
    overwrite: bool = False  # start over in a run_dir that holds something: its contents move to RUN_DIR.old-<time>
    allow_recipe_change: bool = False  # resume with another precision.recipe (recorded in metrics.jsonl)
    check_memory: bool = True  # refuse a run the memory estimate says cannot fit (fp4lm.train.memory)
    grad_accum_steps: int = 1  # split each batch of train.batch_size sequences into this many micro-batches
    init_from: str | None = None  # a Hugging Face Llama directory: its shape, tokenizer and weights at step 0


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    schedule: Schedule = "cosine"
    decay_fraction: float = 0.2  # wsd: final fraction of steps spent decaying
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    decay_norms_and_embeddings: bool = False


@dataclasses.dataclass(frozen=True)
class PrecisionConfig:
    recipe: str = "nvfp4"
    bf16_first_layers: int = 0
    bf16_last_layers: int = 0
    bf16_after: float | None = None  # fraction of train.steps after which quantized layers run in bf16
    backend: GemmBackend = "auto"
    rules: tuple[str, ...] = ()  # "REGEX=RECIPE", first match wins, before the sugar above
    shared_weight_scale: bool = False  # q/k/v share one NVFP4 weight amax, gate/up another (as served, fused)


@dataclasses.dataclass(frozen=True)
class LossScaleConfig:
    enabled: bool | None = None  # None: on for quantized recipes, off for bf16
    initial_scale: float = 2.0**15
    growth_interval: int = 200
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    min_scale: float = 1.0
    max_scale: float = 2.0**24
    max_consecutive_skips: int = 10  # this many non-finite steps in a row stop the run (exit code 3)


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    every: int = 200
    keep: int = 3
    enabled: bool = True
    async_save: bool = True  # write in the background while training continues


@dataclasses.dataclass(frozen=True)
class MetricsConfig:
    log_every: int = 10
    quant_stats_every: int = 100
    tensorboard: bool = True
    peak_tflops: float | None = None  # peak TFLOP/s of one device, for MFU; None: known GPUs only
    progress: ProgressDisplay = "auto"


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    every: int = 100
    batches: int = 8  # validation batches per evaluation; 0 turns evaluation off
    sample_prompt: str = "ROMEO:"  # the end-of-run sample starts from this text
    sample_tokens: int = 64  # 0: no sample at the end of training
    sample_temperature: float = 0.8  # 0: greedy
    sample_top_k: int = 40  # 0: no top-k filter
    sample_top_p: float = 1.0  # nucleus sampling: the fewest likeliest tokens whose probabilities reach it; 1: off


@dataclasses.dataclass(frozen=True)
class ProfileConfig:
    """A jax.profiler trace of a window of training steps, written to RUN_DIR/profile/."""

    start_step: int = 2  # the first traced step (1-based); step 1 compiles
    steps: int = 0  # steps traced; 0: no profile


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    data: int = 1
    fsdp: int = -1  # -1: the rest of the devices
    tensor: int = 1


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    coordinator_address: str | None = None  # "host:port" of process 0
    num_processes: int | None = None
    process_id: int | None = None
    auto_detect: bool = False  # let JAX read a Slurm / Open MPI / TPU / Kubernetes environment
    timeout_s: int = 300


@dataclasses.dataclass(frozen=True)
class DebugConfig:
    inject_nonfinite_at: int | None = None  # make this step's gradients non-finite
    inject_nonfinite_steps: int = 1  # how many consecutive steps from inject_nonfinite_at
    inject_nonfinite_into: NonfiniteTarget = "grads"


@dataclasses.dataclass(frozen=True)
class ProjectConfig:
    """`fp4lm project` only (the trainer's train.batch_size is the global batch)."""

    batch_per_device: int = 1  # sequences per GPU per step, MaxText's per_device_batch_size; --batch overrides


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


def _coerce(key: str, raw: Any, annotation: Any) -> Any:
    """Converts a YAML/CLI value to the field's type, or raises a UserError naming the key."""
    args = typing.get_args(annotation)
    is_optional = isinstance(annotation, types.UnionType) and type(None) in args
    if is_optional:
        if raw is None or (isinstance(raw, str) and raw.lower() in ("none", "null", "")):
            return None
        annotation = next(a for a in args if a is not type(None))
    if typing.get_origin(annotation) is Literal:  # one of the declared choices: checked by validate()
        annotation = str
    if annotation == tuple[DataSource, ...]:
        return _coerce_sources(key, raw)
    if typing.get_origin(annotation) is tuple:
        if isinstance(raw, str):
            raw = [part for part in raw.split(",") if part]
        if not isinstance(raw, (list, tuple)):
            raise UserError(f"{key}: expected a list, got {raw!r}; write e.g. {key}=a,b")
        return tuple(str(v) for v in raw)
    if annotation is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in ("true", "false", "1", "0", "yes", "no"):
            return raw.lower() in ("true", "1", "yes")
        raise UserError(f"{key}: expected true or false, got {raw!r}; write {key}=true or {key}=false")
    if annotation is int:
        if isinstance(raw, bool):
            raise UserError(f"{key}: expected an integer, got {raw!r}; write a whole number, e.g. {key}=8")
        if isinstance(raw, int):
            return raw
        if isinstance(raw, float) and raw.is_integer():
            return int(raw)
        if isinstance(raw, str):
            try:
                return int(raw.replace("_", ""))
            except ValueError:
                pass
        raise UserError(f"{key}: expected an integer, got {raw!r}; write a whole number, e.g. {key}=8")
    if annotation is float:
        expected_a_number = UserError(f"{key}: expected a number, got {raw!r}; write e.g. {key}=0.001")
        if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
            raise expected_a_number
        try:
            value = float(raw)
        except ValueError:
            raise expected_a_number from None
        if not math.isfinite(value):
            raise UserError(f"{key}: expected a finite number, got {raw!r}; write e.g. {key}=0.001")
        return value
    if annotation is str:
        if isinstance(raw, (dict, list)):
            raise UserError(f"{key}: expected a string, got {raw!r}; write a single value, e.g. {key}=text")
        return str(raw)
    raise AssertionError(f"unhandled annotation {annotation} for {key}")


def _coerce_sources(key: str, raw: Any) -> tuple[DataSource, ...]:
    """A mixture: a list of {path, weight} mappings, or "PATH:WEIGHT,PATH:WEIGHT" (the weight defaults to 1)."""
    if isinstance(raw, str):
        raw = [part for part in raw.split(",") if part]
    if not isinstance(raw, (list, tuple)):
        raise UserError(f"{key}: expected a list of {{path, weight}}, got {raw!r}; write e.g. {key}=a.txt:3,b.txt:1")
    sources = []
    for entry in raw:
        if isinstance(entry, str):
            path, _, weight = entry.rpartition(":")
            try:
                entry = {"path": path, "weight": float(weight)} if path else {"path": entry}
            except ValueError:
                entry = {"path": entry}
        if isinstance(entry, DataSource):
            entry = dataclasses.asdict(entry)
        if not isinstance(entry, dict) or set(entry) - {"path", "weight"} or not entry.get("path"):
            raise UserError(
                f"{key}: each source is {{path, weight}}, got {entry!r}; write e.g. {key}=a.txt:3,b.txt:1 "
                f"or in YAML `sources: [{{path: a.txt, weight: 3}}]`"
            )
        weight = _coerce(f"{key}[{len(sources)}].weight", entry.get("weight", 1.0), float)
        sources.append(DataSource(path=str(entry["path"]), weight=weight))
    return tuple(sources)


def _check_choice(key: str, value: Any, annotation: Any) -> None:
    """`value` must be one of the field's `Literal[...]` choices."""
    choices = typing.get_args(annotation)
    if value not in choices:
        raise UserError(f"{key}={value!r} is not one of: {', '.join(choices)}; pick one, e.g. {key}={choices[0]}")


def _section_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _apply(config: Config, section: str, key: str, raw: Any) -> Config:
    sections = _section_types(Config)
    if section not in sections:
        raise UserError(f"unknown config section {section!r}; valid sections: {', '.join(sections)}")
    section_cls = sections[section]
    fields = _section_types(section_cls)
    if key not in fields:
        raise UserError(f"unknown config key {section}.{key}; valid keys in {section}: {', '.join(fields)}")
    value = _coerce(f"{section}.{key}", raw, fields[key])
    new_section = dataclasses.replace(getattr(config, section), **{key: value})
    return dataclasses.replace(config, **{section: new_section})


def from_dict(tree: dict[str, Any], base: Config | None = None, *, source: str = "config") -> Config:
    """Applies a nested {section: {key: value}} dict of overrides to `base` (default: the defaults)."""
    config = base or Config()
    if tree is None:
        return config
    if not isinstance(tree, dict):
        raise UserError(
            f"{source}: expected a mapping of sections (model:, data:, ...), got {type(tree).__name__}; "
            "write it as `section: {key: value}` lines, like configs/default.yaml"
        )
    for section, values in tree.items():
        if not isinstance(values, dict):
            raise UserError(
                f"{source}: section {section!r} must be a mapping of key: value; write e.g. `{section}: {{key: value}}`"
            )
        for key, raw in values.items():
            config = _apply(config, str(section), str(key), raw)
    return config


def parse_override(text: str) -> tuple[str, str, str]:
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise UserError(f"bad override {text!r}; write section.key=value, e.g. train.steps=100")
    dotted, value = text.split("=", 1)
    section, key = dotted.split(".", 1)
    return section.strip(), key.strip(), value.strip()


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, first_line: int, second_line: int):
        super().__init__(f"key {key!r} is given twice (lines {first_line} and {second_line})")
        self.key, self.first_line, self.second_line = key, first_line, second_line


class _ConfigLoader(yaml.SafeLoader):
    """yaml's safe loader that refuses a key given twice in one mapping (yaml itself keeps the last one)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in first_lines:
                    raise _DuplicateKey(key, first_lines[key], line)
                first_lines[key] = line
            except TypeError:  # an unhashable key: yaml reports it itself
                pass
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: str | pathlib.Path) -> dict[str, Any]:
    path = pathlib.Path(path)
    if not path.exists():
        raise UserError(f"config file {path} not found; pass an existing YAML file (see configs/)")
    if not path.is_file():  # a directory, FIFO or device: reading it could hang or never end
        raise UserError(f"config file {path} is not a regular file; pass a YAML file (see configs/)")
    try:
        tree = yaml.load(path.read_text(), Loader=_ConfigLoader)  # a SafeLoader subclass
    except _DuplicateKey as e:
        raise UserError(f"config file {path}: {e}; keep one of them") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"config file {path} is not valid YAML ({reason}); fix the syntax") from None
    return tree or {}


# Paths the run reads: relative to the config file that names them, or to the current directory on the command line.
_INPUT_PATHS = (
    ("data", "path"),
    ("data", "val_path"),
    ("data", "sources"),
    ("data", "tokenizer"),
    ("train", "init_from"),
)


def _absolute(value: str, base_dir: pathlib.Path) -> str:
    if not value or resources.is_bundled(value):
        return value
    return os.path.abspath(os.path.join(base_dir, os.path.expanduser(value)))


def _absolute_path(config: Config, section: str, key: str, base_dir: pathlib.Path) -> Config:
    value = getattr(getattr(config, section), key)
    if key == "sources":
        value = tuple(dataclasses.replace(s, path=_absolute(s.path, base_dir)) for s in value)
        return dataclasses.replace(config, data=dataclasses.replace(config.data, sources=value))
    if not value or resources.is_bundled(value):
        return config
    if (section, key) == ("data", "tokenizer") and value in typing.get_args(TokenizerKind):
        return config  # a keyword, not a path
    absolute = os.path.abspath(os.path.join(base_dir, os.path.expanduser(value)))
    return dataclasses.replace(config, **{section: dataclasses.replace(getattr(config, section), **{key: absolute})})


def load_config(
    path: str | pathlib.Path | None = None, overrides: list[str] | tuple[str, ...] = (), base: Config | None = None
) -> Config:
    """Defaults (or `base`) <- YAML file (optional) <- `section.key=value` overrides, then validation."""
    config = base or Config()
    if path is not None:
        config = from_dict(load_yaml(path), config, source=str(path))
        for section, key in _INPUT_PATHS:
            config = _absolute_path(config, section, key, pathlib.Path(path).parent)
    for text in overrides:
        section, key, value = parse_override(text)
        config = _apply(config, section, key, yaml.safe_load(value) if value else value)
        if (section, key) in _INPUT_PATHS:
            config = _absolute_path(config, section, key, pathlib.Path.cwd())
    validate(config)
    return config


def _positive(config: Config, *keys: str) -> None:
    for dotted in keys:
        section, key = dotted.split(".")
        value = getattr(getattr(config, section), key)
        if value is not None and value <= 0:
            raise UserError(f"{dotted} must be positive, got {value}; set {dotted}=<a positive number>")


def validate(config: Config) -> None:
    """Checks values and combinations that cannot work, naming the key and the fix."""
    for section, section_cls in _section_types(Config).items():  # also for configs built in code
        for key, annotation in _section_types(section_cls).items():
            if typing.get_origin(annotation) is Literal:
                _check_choice(f"{section}.{key}", getattr(getattr(config, section), key), annotation)
    # fmt: off
    _positive(
        config,
        "model.num_layers", "model.d_model", "model.num_heads", "model.num_kv_heads", "model.mlp_dim",
        "model.head_dim", "model.rope_theta", "model.norm_eps", "model.init_std",
        "data.vocab_size", "data.vocab_multiple", "data.seq_len", "train.batch_size", "train.steps",
        "optimizer.lr", "optimizer.b1", "optimizer.b2", "optimizer.eps", "optimizer.grad_clip",
        "loss_scale.initial_scale", "loss_scale.growth_interval", "loss_scale.growth_factor",
        "loss_scale.backoff_factor", "loss_scale.min_scale", "loss_scale.max_consecutive_skips",
        "checkpoint.every", "checkpoint.keep", "metrics.log_every", "metrics.quant_stats_every",
        "metrics.peak_tflops", "eval.every", "debug.inject_nonfinite_steps",
        "loss_scale.max_scale", "distributed.num_processes", "distributed.timeout_s", "debug.inject_nonfinite_at",
        "project.batch_per_device", "train.grad_accum_steps", "profile.start_step",
    )
    # fmt: on
    m = config.model
    if m.head_dim is None and m.d_model % m.num_heads:
        raise UserError(
            f"model.num_heads={m.num_heads} does not divide model.d_model={m.d_model}; "
            "choose num_heads that divides d_model (or set model.head_dim)"
        )
    if m.num_heads % m.num_kv_heads:
        raise UserError(
            f"model.num_kv_heads={m.num_kv_heads} must divide model.num_heads={m.num_heads} (grouped-query attention)"
        )
    if m.resolved_head_dim % 2:
        raise UserError(
            f"head dimension {m.resolved_head_dim} must be even for RoPE; change model.d_model or model.num_heads"
        )
    if m.attention == "cudnn":  # needs the device: JAX is imported for this setting only
        from fp4lm.model.attention import check_attention_setting

        check_attention_setting(m.attention, head_dim=m.resolved_head_dim)
    if resources.is_bundled(config.data.path):
        resources.check_bundled_name(config.data.path)
    _validate_sources(config.data.sources)
    if not 0.0 < config.data.val_fraction < 1.0:
        raise UserError(f"data.val_fraction={config.data.val_fraction} must be in (0, 1), e.g. 0.02")
    if not config.data.tokenizer.strip():
        raise UserError("data.tokenizer is empty; set data.tokenizer=byte, bpe, or the path of a tokenizer.json")
    vocab_size = config.data.vocab_size
    if config.data.tokenizer == "byte" and vocab_size is not None and vocab_size < BYTE_VOCAB_SIZE:
        raise UserError(
            f"data.tokenizer=byte needs data.vocab_size >= {BYTE_VOCAB_SIZE}; "
            "leave data.vocab_size unset (the model's vocabulary follows the tokenizer)"
        )
    if config.data.tokenizer == "bpe" and vocab_size is not None and vocab_size < BPE_MIN_VOCAB_SIZE:
        raise UserError(
            f"data.vocab_size={config.data.vocab_size} is too small for BPE; "
            f"use at least {BPE_MIN_VOCAB_SIZE} (e.g. 2048)"
        )
    if not 0.0 <= config.optimizer.min_lr_ratio <= 1.0:
        raise UserError("optimizer.min_lr_ratio must be in [0, 1]")
    if config.optimizer.warmup_steps < 0:
        raise UserError("optimizer.warmup_steps must be >= 0")
    if not 0.0 < config.optimizer.decay_fraction <= 1.0:
        raise UserError("optimizer.decay_fraction must be in (0, 1]")
    if config.optimizer.weight_decay < 0:
        raise UserError("optimizer.weight_decay must be >= 0")
    p = config.precision
    for key in ("bf16_first_layers", "bf16_last_layers"):
        value = getattr(p, key)
        if not 0 <= value <= m.num_layers:
            raise UserError(f"precision.{key}={value} must be between 0 and model.num_layers={m.num_layers}")
    if p.bf16_after is not None and not 0.0 <= p.bf16_after <= 1.0:
        raise UserError(f"precision.bf16_after={p.bf16_after} must be a fraction of training in [0, 1], e.g. 0.8")
    for rule in p.rules:
        if "=" not in rule:
            raise UserError(f"precision.rules entry {rule!r} must be REGEX=RECIPE, e.g. 'blocks\\.0\\..*=bf16'")
    for key in ("data", "fsdp", "tensor"):
        value = getattr(config.mesh, key)
        if value == 0 or value < -1:
            raise UserError(f"mesh.{key}={value} must be a positive device count or -1 (the rest of the devices)")
    if sum(getattr(config.mesh, k) == -1 for k in ("data", "fsdp", "tensor")) > 1:
        raise UserError("only one of mesh.data, mesh.fsdp, mesh.tensor may be -1")
    if config.checkpoint.keep < 1:
        raise UserError("checkpoint.keep must be >= 1")
    _validate_accumulation_and_profile(config)
    _validate_more(config)


def _validate_sources(sources: tuple[DataSource, ...]) -> None:
    """Mixture weights are relative sampling rates: none negative, not all zero."""
    for source in sources:
        if source.weight < 0:
            raise UserError(
                f"data.sources: {source.path} has weight {source.weight:g}; weights must be >= 0 (0 leaves it out)"
            )
    if sources and not any(source.weight > 0 for source in sources):
        raise UserError(
            "data.sources: every weight is 0, so nothing can be sampled; give at least one a positive weight"
        )
    for source in sources:
        if resources.is_bundled(source.path):
            resources.check_bundled_name(source.path)


def _validate_more(config: Config) -> None:
    ls = config.loss_scale
    if ls.min_scale > ls.max_scale:
        raise UserError(f"loss_scale.min_scale={ls.min_scale} exceeds loss_scale.max_scale={ls.max_scale}; lower it")
    if ls.growth_factor < 1.0:
        raise UserError(f"loss_scale.growth_factor={ls.growth_factor} must be >= 1, e.g. 2.0")
    if ls.backoff_factor >= 1.0:
        raise UserError(f"loss_scale.backoff_factor={ls.backoff_factor} must be below 1, e.g. 0.5")
    if not 0.0 <= config.optimizer.b1 < 1.0 or not 0.0 <= config.optimizer.b2 < 1.0:
        raise UserError("optimizer.b1 and optimizer.b2 must be in [0, 1), e.g. 0.9 and 0.95")
    e = config.eval
    for key in ("batches", "sample_tokens", "sample_top_k"):
        if getattr(e, key) < 0:
            raise UserError(f"eval.{key}={getattr(e, key)} must be >= 0 (0 turns it off)")
    if e.sample_temperature < 0:
        raise UserError(f"eval.sample_temperature={e.sample_temperature} must be >= 0 (0: greedy)")
    if not 0.0 < e.sample_top_p <= 1.0:
        raise UserError(f"eval.sample_top_p={e.sample_top_p} must be in (0, 1]; e.g. 0.9 (1: no filter)")
    d = config.distributed
    out_of_range = d.process_id is not None and (
        d.process_id < 0 or (d.num_processes is not None and d.process_id >= d.num_processes)
    )
    if out_of_range:
        raise UserError(
            f"distributed.process_id={d.process_id} must be in [0, distributed.num_processes={d.num_processes})"
        )


def _validate_accumulation_and_profile(config: Config) -> None:
    t, prof = config.train, config.profile
    if t.batch_size % t.grad_accum_steps:
        raise UserError(
            f"train.grad_accum_steps={t.grad_accum_steps} does not divide train.batch_size={t.batch_size}; "
            "choose a number of micro-batches that divides the batch"
        )
    if prof.steps < 0:
        raise UserError(f"profile.steps={prof.steps} must be >= 0 (0 turns profiling off)")
    last = prof.start_step + prof.steps - 1
    if prof.steps and last > t.steps:
        raise UserError(
            f"profile window steps {prof.start_step}-{last} (profile.start_step={prof.start_step}, "
            f"profile.steps={prof.steps}) ends beyond train.steps={t.steps}; move profile.start_step earlier or "
            "trace fewer profile.steps"
        )


def _type_name(annotation: Any) -> str:
    args = typing.get_args(annotation)
    if isinstance(annotation, types.UnionType) and type(None) in args:
        return " | ".join(_type_name(a) for a in args if a is not type(None)) + " | none"
    if typing.get_origin(annotation) is Literal:
        return "|".join(str(a) for a in args)
    if typing.get_origin(annotation) is tuple:
        return "list"
    return getattr(annotation, "__name__", str(annotation))


def _default_text(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value) or "(empty)"
    return str(value)


def keys_help() -> str:
    """Every config section with its keys, types and defaults, read from the dataclasses (for `--help`)."""
    lines = []
    for section, section_cls in _section_types(Config).items():
        hints = _section_types(section_cls)
        rows = [
            (f"{section}.{field.name}", _type_name(hints[field.name]), _default_text(field.default))
            for field in dataclasses.fields(section_cls)
        ]
        key_width = max(len(key) for key, _, _ in rows)
        default_width = max(len(default) for _, _, default in rows)
        lines.append(f"{section}:")
        lines += [f"  {key:<{key_width}}  {default:<{default_width}}  ({kind})" for key, kind, default in rows]
    return "\n".join(lines)


# How the parameters that library code names in `UserError.settings` are spelled as config keys.
_SETTING_KEYS = {
    **{f.name: f"data.{f.name}" for f in dataclasses.fields(DataConfig)},
    "run_dir": "train.run_dir",
    "batch_size": "train.batch_size",
    "seed": "train.seed",
}


def describe_error(error: UserError) -> str:
    """The one line a user sees for `error`: its message, then the config keys of the settings it names."""
    keys = [_SETTING_KEYS.get(name, name) for name in error.settings]
    return f"{error} ({', '.join(keys)})" if keys else str(error)
