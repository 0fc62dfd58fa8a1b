"""fp4lm: pretraining language models with NVFP4 (4-bit) mixed precision in JAX."""

__version__ = "0.1.0"
