"""`train.init_from=HF_DIR`: continued pretraining from a Hugging Face Llama, Mixtral, Qwen3-MoE or Qwen2-MoE
checkpoint.

The checkpoint decides the model's shape (`model.*`) and the tokenizer (its tokenizer.json becomes
`data.tokenizer`, and its vocabulary the model's); a setting given explicitly (not at its code default) that
disagrees is refused in one line. Training then starts from the checkpoint's weights at step 0 with a fresh
optimizer (fp4lm.train.setup). Safetensors only, one file or sharded with an index; tied or untied embeddings;
grouped-query attention; `rope_scaling` of type "llama3" (Llama 3.1); routed experts as Mixtral,
Qwen3-MoE and Qwen2-MoE lay them out, one tensor per expert (fp4lm.hf.architectures says which of their
settings fp4lm has: a Qwen2-MoE's q/k/v biases and shared-expert gate must be zero, as fp4lm exports them).
The mapping is the inverse of the export's (fp4lm.hf.tensor_names), so export -> import gives back identical
parameters.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

import numpy as np

from fp4lm.config import Config, validate
from fp4lm.errors import UserError
from fp4lm.hf import architectures, safetensors_files, tensor_names

LLAMA_ARCHITECTURES = ("LlamaForCausalLM",)
TRAINING_RUN_FILES = ("checkpoints", "metrics.jsonl", "summary.json")  # what an fp4lm run directory holds


def _refuse(
    directory: str,
    problem: str,
    fix: str = "pass a Hugging Face Llama, Mixtral, Qwen3-MoE or Qwen2-MoE checkpoint directory",
) -> UserError:
    return UserError(f"train.init_from={directory}: {problem}; {fix}")


def _refuse_training_run(directory: str) -> UserError:
    return _refuse(
        directory,
        "it is an fp4lm training run, not a Hugging Face checkpoint",
        f"to continue that run, resume it with train.run_dir={directory}; to start a new run from its weights, "
        f"export it first (fp4lm export {directory} --format hf --out DIR) and pass train.init_from=DIR",
    )


def read_hf_config(directory: str) -> dict[str, Any]:
    """config.json of a checkpoint, after refusing anything fp4lm's model cannot load as it is."""
    path = pathlib.Path(directory) / "config.json"
    if any((pathlib.Path(directory) / name).exists() for name in TRAINING_RUN_FILES):
        raise _refuse_training_run(directory)
    if not path.is_file():
        raise _refuse(directory, "no config.json there")
    try:
        hf = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise _refuse(directory, "config.json is not valid JSON") from None
    if not isinstance(hf, dict):
        raise _refuse(directory, "config.json is not a JSON object")
    if hf and set(hf) <= {field.name for field in dataclasses.fields(Config)}:  # fp4lm's own config.json
        raise _refuse_training_run(directory)
    if architecture(hf) is None:
        named = hf.get("architectures") or [hf.get("model_type")]
        raise _refuse(
            directory,
            f"the architecture is {', '.join(map(str, named))}, not one of {', '.join(architectures.ARCHITECTURES)}",
        )
    if hf.get("quantization_config"):
        raise _refuse(directory, "the checkpoint is quantized", "import a bf16 or float32 checkpoint")
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise _refuse(directory, "it has attention or MLP biases, which fp4lm's Llama does not", "use one without")
    if hf.get("hidden_act", "silu") != "silu":
        raise _refuse(directory, f"hidden_act={hf['hidden_act']}, fp4lm's MLP is SwiGLU (silu)", "use a silu model")
    return hf


def _rope(hf: dict, directory: str) -> dict[str, Any]:
    """model.rope_* settings from `rope_theta` / `rope_scaling` (transformers 4.x) or `rope_parameters` (5.x)."""
    parameters = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or parameters
    theta = hf.get("rope_theta", parameters.get("rope_theta", 10000.0))
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    settings: dict[str, Any] = {"model.rope_theta": float(theta)}
    if kind in ("default", None):
        return settings
    if kind != "llama3":
        raise _refuse(directory, f"rope_scaling of type {kind} is not supported", "use one without or of type llama3")
    settings.update(
        {
            "model.rope_scaling": "llama3",
            "model.rope_scaling_factor": float(scaling["factor"]),
            "model.rope_low_freq_factor": float(scaling["low_freq_factor"]),
            "model.rope_high_freq_factor": float(scaling["high_freq_factor"]),
            "model.rope_original_max_positions": int(scaling["original_max_position_embeddings"]),
        }
    )
    return settings


def architecture(hf: dict) -> str | None:
    """The checkpoint's class among those fp4lm reads, by `architectures` or else `model_type` (None: none)."""
    by_type = {model_type: name for name, model_type in architectures.MODEL_TYPES.items()}
    named = hf.get("architectures") or [by_type.get(str(hf.get("model_type")))]
    return next((name for name in named if name in architectures.ARCHITECTURES), None)


def checkpoint_settings(directory: str) -> dict[str, Any]:
    """The config keys the checkpoint decides, with its values."""
    hf = read_hf_config(directory)
    kind = architecture(hf)
    try:
        heads = int(hf["num_attention_heads"])
        settings = {
            "model.num_layers": int(hf["num_hidden_layers"]),
            "model.d_model": int(hf["hidden_size"]),
            "model.num_heads": heads,
            "model.num_kv_heads": int(hf.get("num_key_value_heads") or heads),
            "model.head_dim": int(hf.get("head_dim") or int(hf["hidden_size"]) // heads),
            "model.mlp_dim": int(hf["intermediate_size"]),
            "model.norm_eps": float(hf.get("rms_norm_eps", 1e-6)),
            "model.tie_embeddings": bool(hf.get("tie_word_embeddings", False)),
            **_rope(hf, directory),
            "data.tokenizer": str(pathlib.Path(directory).absolute()),
            "data.vocab_size": int(hf["vocab_size"]),
            "data.vocab_multiple": 1,  # the model's vocabulary is exactly the checkpoint's
        }
        if kind is not None and kind != architectures.LLAMA:
            settings.update(architectures.moe_settings(hf, kind, lambda what: _refuse(directory, f"it has {what}")))
    except KeyError as missing:
        raise _refuse(directory, f"config.json has no {missing.args[0]}") from None
    if not (pathlib.Path(directory) / "tokenizer.json").is_file():
        raise _refuse(directory, "no tokenizer.json there", "add the checkpoint's tokenizer.json")
    return settings


def _get(config: Config, key: str) -> Any:
    section, name = key.split(".")
    return getattr(getattr(config, section), name)


def _set(config: Config, key: str, value: Any) -> Config:
    section, name = key.split(".")
    return dataclasses.replace(config, **{section: dataclasses.replace(getattr(config, section), **{name: value})})


def config_from_checkpoint(config: Config) -> Config:
    """`config` with the shape and tokenizer of `train.init_from`; a conflicting explicit setting is refused."""
    directory = config.train.init_from
    if not directory:
        return config
    defaults = Config()
    for key, value in checkpoint_settings(directory).items():
        given = _get(config, key)
        if given != value and given != _get(defaults, key):
            raise UserError(
                f"{key}={given} conflicts with train.init_from={directory}, whose checkpoint has {key}={value}; "
                f"remove {key} (the checkpoint decides it)"
            )
        config = _set(config, key, value)
    validate(config)
    files, _ = _check_weights(directory, config)  # missing shards or tensors are refused before the run starts
    _check_zero_tensors(directory, files, config)
    _check_tokenizer(directory)
    return config


def _check_tokenizer(directory: str) -> None:
    """The checkpoint's tokenizer opens; a damaged one is named as the checkpoint's (its reader would point at
    data.tokenizer, which train.init_from sets)."""
    from fp4lm.tokenizer import open_tokenizer

    try:
        open_tokenizer(directory)
    except UserError as error:
        raise _refuse(
            directory, f"its tokenizer is damaged ({str(error).split(';')[0]})", "copy the checkpoint's tokenizer again"
        ) from None


def _weight_files(directory: pathlib.Path) -> dict[str, pathlib.Path]:
    """tensor name -> file, from the index (sharded) or the single model.safetensors."""
    index = directory / safetensors_files.INDEX_FILE
    what = f"train.init_from={directory}"
    if index.is_file():
        weight_map = safetensors_files.read_index(index, what)
        files = {name: directory / file_name for name, file_name in weight_map.items()}
        missing = sorted({path.name for path in files.values() if not path.is_file()})
        if missing:
            raise _refuse(str(directory), f"shard {missing[0]} named in its index is missing", "copy every shard")
        for shard in sorted(set(files.values())):  # a damaged header is named before the run starts
            with safetensors_files.opened(shard, what):
                pass
        return files
    single = directory / safetensors_files.SINGLE_FILE
    if not single.is_file():
        raise _refuse(str(directory), "no model.safetensors or model.safetensors.index.json there")
    with safetensors_files.opened(single, what) as opened:
        return dict.fromkeys(opened.keys(), single)


def _check_weights(directory: str, config: Config) -> tuple[dict[str, pathlib.Path], list[str]]:
    """(tensor name -> file, the names the model needs), after refusing a missing shard or tensor."""
    files = _weight_files(pathlib.Path(directory))
    needed = tensor_names.expected_tensor_names(config.model)
    missing = [name for name in needed if name not in files]
    if missing:
        raise _refuse(
            directory, f"tensor {missing[0]} is missing ({len(missing)} missing)", "pass a complete checkpoint"
        )
    return files, needed


def _check_zero_tensors(directory: str, files: dict[str, pathlib.Path], config: Config) -> None:
    """Refuses a tensor fp4lm has no parameter for that is not zero (tensor_names.zero_tensor_names: Qwen2-MoE's
    q/k/v biases and shared-expert gates, all small); each file that holds some is opened once."""
    zeros = tensor_names.zero_tensor_names(config.model)
    for file in sorted({files[name] for name in zeros}):
        with safetensors_files.opened(file, f"train.init_from={directory}") as opened:
            trained = [
                name
                for name in zeros
                if files[name] == file and np.any(np.asarray(opened.get_tensor(name), np.float32) != 0)
            ]
        if trained:
            raise _refuse(
                directory,
                f"{trained[0]} is not zero (fp4lm's attention has no biases, and its shared experts no gate)",
                "import a Qwen2-MoE checkpoint fp4lm exported, or one whose q/k/v biases and shared-expert gates are 0",
            )


def read_params(directory: str, config: Config, abstract_params: dict) -> dict:
    """fp4lm's float32 parameters from the checkpoint, checked against the model's shapes (`abstract_params`)."""
    files, needed = _check_weights(directory, config)
    tensors: dict[str, np.ndarray] = {}
    for file in sorted(set(files[name] for name in needed)):
        with safetensors_files.opened(file, f"train.init_from={directory}") as opened:
            for name in needed:
                if files[name] == file:
                    tensors[name] = opened.get_tensor(name)
    params = tensor_names.fp4lm_params(tensors, config.model)
    flat_expected = _flatten(abstract_params)
    for key, value in _flatten(params).items():
        if tuple(value.shape) != tuple(flat_expected[key].shape):
            raise _refuse(directory, f"{key} has shape {value.shape}, the model needs {flat_expected[key].shape}")
    return params


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        flat.update(_flatten(value, name + ".") if isinstance(value, dict) else {name: value})
    return flat
