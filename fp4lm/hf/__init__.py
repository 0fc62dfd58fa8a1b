"""Hugging Face's side of a checkpoint: which architecture a model is (Llama, Mixtral, Qwen3-MoE) and its
config.json, tensor names, safetensors files, tokenizer files; reading a checkpoint into fp4lm
(`train.init_from`, init_from.py) and writing one (export.py).

Below the trainer: it knows configs, tokenizers and parameter trees, never run directories or checkpoints.
"""
