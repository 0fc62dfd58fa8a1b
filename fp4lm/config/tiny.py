"""The tiny run: the smallest model and batch that still take every code path, NVFP4 included, in seconds on a CPU.

One definition, as `section.key=value` overrides (what `load_config`, `fp4lm train` and `fp4lm compare` take),
shared by the test suite and bench/device_check.py's dry run. One block, d_model 32, mlp_dim 64 and byte tokens,
4 sequences of 32 per step: every NVFP4 operand is a whole number of 16-element blocks, so each recipe runs as is.
"""

TINY_MODEL = (
    "model.num_layers=1",
    "model.d_model=32",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.mlp_dim=64",
)
TINY_DATA = ("data.tokenizer=byte", "data.vocab_size=256", "data.seq_len=32", "train.batch_size=4")
