"""A Hugging Face checkpoint (`fp4lm export --format hf`): a directory transformers loads with its own class,
`LlamaForCausalLM`, `MixtralForCausalLM`, `Qwen3MoeForCausalLM` or `Qwen2MoeForCausalLM`
(fp4lm.hf.architectures chooses).

    config.json  generation_config.json  model.safetensors (or shards + model.safetensors.index.json)
    tokenizer.json  tokenizer_config.json  special_tokens_map.json

The weights are the float32 master weights of the checkpoint, cast to `--dtype` (bfloat16 by default,
round-to-nearest-even). Names and layouts: fp4lm.hf.tensor_names.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import ml_dtypes
import numpy as np

from fp4lm.config import Config, ModelConfig
from fp4lm.errors import UserError
from fp4lm.hf import architectures, safetensors_files, tensor_names
from fp4lm.hf.tokenizer_files import special_ids, write_tokenizer


@dataclasses.dataclass
class HFCheckpoint:
    """What a Hugging Face checkpoint is written from: the run's config, its parameters and its tokenizer."""

    config: Config
    params: dict  # float32 NumPy arrays, the model's pure-dict parameters
    tokenizer_json: str  # as the checkpoint saved it (fp4lm.tokenizer's file format)


DTYPES = {"bfloat16": np.dtype(ml_dtypes.bfloat16), "float32": np.dtype(np.float32)}


def check_expressible(model: ModelConfig) -> None:
    """Refuses (one line, naming the setting) a model none of Llama, Mixtral, Qwen3-MoE and Qwen2-MoE expresses."""
    architectures.architecture_of(model)


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
    config = architectures.hf_config(
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
        (name, value.astype(numpy_dtype)) for name, value in tensor_names.hf_tensors(source.params, source.config.model)
    ]
    files = safetensors_files.write_checkpoint(directory, tensors, max_shard_bytes=max_shard_bytes)
    write_model_files(directory, source, dtype=dtype)
    return files
