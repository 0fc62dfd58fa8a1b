"""The run configuration: frozen nested dataclasses with defaults in code.

YAML files in configs/ hold overrides only, nested by section; the command line adds `section.key=value`
overrides on top. Each key declares its default, help text and rule with its field (`sections`, using
`fields.setting`); rules over several keys live in `combinations`; `loading` reads YAML and overrides and
validates the result. Every mistake (unknown key, wrong type, non-finite number, key given twice, impossible
combination) is a `UserError` whose one-line message names the key and the fix. `keys_help()` lists every key
with its default, type and help (`fp4lm train --help`).
"""

from fp4lm.config.combinations import check_attention_precision, check_micro_batches_per_host, validate
from fp4lm.config.fields import check_section_rules, split_precision_rule
from fp4lm.config.help_text import describe_error, keys_help
from fp4lm.config.loading import from_dict, load_config, parse_override
from fp4lm.config.sections import (
    BPE_MIN_VOCAB_SIZE,
    BYTE_VOCAB_SIZE,
    DEFAULT_BPE_VOCAB_SIZE,
    DEFAULT_VAL_FRACTION,
    SCAN_LAYERS_FROM,
    AttentionImplementation,
    AttentionPrecision,
    CheckpointConfig,
    Config,
    DataConfig,
    DataFormat,
    DataSource,
    DebugConfig,
    DistributedConfig,
    EvalConfig,
    GemmBackend,
    LossScaleConfig,
    MeshConfig,
    MetricsConfig,
    ModelConfig,
    NonfiniteTarget,
    OptimizerConfig,
    PrecisionConfig,
    ProfileConfig,
    ProgressDisplay,
    ProjectConfig,
    RematMode,
    RopeScaling,
    Schedule,
    TokenizerKind,
    TrainConfig,
)
from fp4lm.config.yaml_file import load_value, load_yaml

__all__ = [
    "BPE_MIN_VOCAB_SIZE",
    "BYTE_VOCAB_SIZE",
    "DEFAULT_BPE_VOCAB_SIZE",
    "DEFAULT_VAL_FRACTION",
    "SCAN_LAYERS_FROM",
    "AttentionImplementation",
    "AttentionPrecision",
    "CheckpointConfig",
    "Config",
    "DataConfig",
    "DataFormat",
    "DataSource",
    "DebugConfig",
    "DistributedConfig",
    "EvalConfig",
    "GemmBackend",
    "LossScaleConfig",
    "MeshConfig",
    "MetricsConfig",
    "ModelConfig",
    "NonfiniteTarget",
    "OptimizerConfig",
    "PrecisionConfig",
    "ProfileConfig",
    "ProgressDisplay",
    "ProjectConfig",
    "RematMode",
    "RopeScaling",
    "Schedule",
    "TokenizerKind",
    "TrainConfig",
    "check_attention_precision",
    "check_micro_batches_per_host",
    "check_section_rules",
    "describe_error",
    "from_dict",
    "keys_help",
    "load_config",
    "load_value",
    "load_yaml",
    "parse_override",
    "split_precision_rule",
    "validate",
]
