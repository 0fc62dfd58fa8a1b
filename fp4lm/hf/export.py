"""A Hugging Face Llama checkpoint (`fp4lm export --format hf`): a directory `LlamaForCausalLM.from_pretrained` loads.

    config.json  generation_config.json  model.safetensors (or shards + model.safetensors.index.json)
    tokenizer.json  tokenizer_config.json  special_tokens_map.json

The weights are the float32 master weights of the checkpoint, cast to `--dtype` (bfloat16 by default,
round-to-nearest-even). Names and layouts: fp4lm.hf.llama_names.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import ml_dtypes
import numpy as np

from fp4lm.config import Config, ModelConfig
from fp4lm.errors import UserError
from fp4lm.hf import llama_names, safetensors_files
from fp4lm.hf.tokenizer_files import special_ids, write_tokenizer


@dataclasses.dataclass
class HFCheckpoint:
    """What a Hugging Face checkpoint is written from: the run's config, its parameters and its tokenizer."""

    config: Config
    params: dict  # float32 NumPy arrays, the model's pure-dict parameters
    tokenizer_json: str  # as the checkpoint saved it (fp4lm.tokenizer's file format)


DTYPES = {"bfloat16": np.dtype(ml_dtypes.bfloat16), "float32": np.dtype(np.float32)}

# ModelConfig fields and how Hugging Face's Llama config expresses them (None: training only, nothing to express).
EXPRESSED = {
    "num_layers": "num_hidden_layers",
    "d_model": "hidden_size",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "mlp_dim": "intermediate_size",
    "rope_theta": "rope_theta",
    "norm_eps": "rms_norm_eps",
    "tie_embeddings": "tie_word_embeddings",
    "rope_scaling": "rope_scaling",
    "rope_scaling_factor": "rope_scaling",
    "rope_low_freq_factor": "rope_scaling",
    "rope_high_freq_factor": "rope_scaling",
    "rope_original_max_positions": "rope_scaling",
    "remat": None,
    "init_std": None,
    "attention": None,  # how attention runs, not what it computes
    "scan_layers": None,  # how the blocks run, not what they compute
}


def check_expressible(model: ModelConfig) -> None:
    """Refuses (one line, naming the setting) a model setting Hugging Face's Llama has no equivalent for."""
    defaults = type(model)()
    for field in dataclasses.fields(model):
        value = getattr(model, field.name)
        if field.name not in EXPRESSED and value != getattr(defaults, field.name):
            raise UserError(
                f"model.{field.name}={value} has no equivalent in Hugging Face's LlamaForCausalLM; "
                f"export a run trained with the default model.{field.name}={getattr(defaults, field.name)}"
            )


def check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise UserError(f"--dtype {dtype} is not one of {', '.join(DTYPES)}; pass --dtype bfloat16 or float32")


def vocab_size(source: HFCheckpoint) -> int:
    return int(source.params["embed"]["table"].shape[0])


def write_json(path: pathlib.Path, payload: dict) -> None:
    path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


def write_model_files(directory: pathlib.Path, source: HFCheckpoint, *, dtype: str, quantization: dict | None = None):
    """config.json (with `quantization_config` when given), generation_config.json and the tokenizer files."""
    bos_id, eos_id = special_ids(source.tokenizer_json)
    config = llama_names.hf_config(
        source.config, vocab_size=vocab_size(source), bos_id=bos_id, eos_id=eos_id, dtype=dtype
    )
    if quantization is not None:
        config["quantization_config"] = quantization
    write_json(directory / "config.json", config)
    write_json(directory / "generation_config.json", {"bos_token_id": bos_id, "eos_token_id": eos_id})
    write_tokenizer(directory, source.tokenizer_json, model_max_length=source.config.data.seq_len)


def export_hf(
    source: HFCheckpoint,
    directory: pathlib.Path,
    *,
    dtype: str = "bfloat16",
    max_shard_bytes: int = safetensors_files.DEFAULT_MAX_SHARD_BYTES,
) -> list[str]:
    """Writes the Hugging Face checkpoint of `source` into `directory`; returns the safetensors file names."""
    check_dtype(dtype)
    check_expressible(source.config.model)
    numpy_dtype = DTYPES[dtype]
    tensors = [
        (name, value.astype(numpy_dtype)) for name, value in llama_names.hf_tensors(source.params, source.config.model)
    ]
    files = safetensors_files.write_checkpoint(directory, tensors, max_shard_bytes=max_shard_bytes)
    write_model_files(directory, source, dtype=dtype)
    return files
