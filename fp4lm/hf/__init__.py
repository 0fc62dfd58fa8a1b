"""Hugging Face's side of a checkpoint: Llama tensor names and config keys, safetensors files, tokenizer files,
reading a Hugging Face Llama into fp4lm (`train.init_from`, init_from.py) and writing one (export.py).

Below the trainer: it knows configs, tokenizers and parameter trees, never run directories or checkpoints.
"""
