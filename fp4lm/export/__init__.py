"""Export a run's checkpoint for other tools, and import Hugging Face Llama checkpoints.

    fp4lm export RUN_DIR --format hf|nvfp4|nvfp4-ct --out DIR [--step N] [--dtype bfloat16|float32] [--force]

- hf.py: a `transformers` Llama checkpoint (bf16 or f32 safetensors, config, tokenizer);
- nvfp4.py: the NVFP4 weights the forward pass used, in ModelOpt's layout (vLLM `modelopt_fp4`,
  TensorRT-LLM, SGLang) or compressed-tensors' `nvfp4-pack-quantized` (llm-compressor's output);
- hf_import.py: `train.init_from=HF_DIR`, the reverse of hf.py.

The output directory is written complete or not at all (output_dir.py).
"""

from __future__ import annotations

from fp4lm.errors import UserError

FORMATS = ("hf", "nvfp4", "nvfp4-ct")


def export_run(
    run_dir: str,
    *,
    fmt: str,
    out: str,
    step: int | None = None,
    dtype: str = "bfloat16",
    force: bool = False,
    log=print,
) -> None:
    """Exports checkpoint `step` (None: the newest) of `run_dir` to `out` in format `fmt`."""
    from fp4lm.export import hf, nvfp4
    from fp4lm.export.output_dir import check_output_dir, staged_output
    from fp4lm.export.source import load_source

    if fmt not in FORMATS:
        raise UserError(f"--format {fmt} is not one of {', '.join(FORMATS)}; pass e.g. --format hf")
    hf.check_dtype(dtype)
    path = check_output_dir(out, force=force)  # before the checkpoint is read: a refusal is instant
    source = load_source(run_dir, step)
    hf.check_expressible(source.config.model)
    with staged_output(path) as staging:
        if fmt == "hf":
            hf.export_hf(source, staging, dtype=dtype)
        else:
            nvfp4.export_nvfp4(source, staging, layout="modelopt" if fmt == "nvfp4" else "compressed-tensors", log=log)
    log(f"exported {run_dir} step {source.step} as {fmt} to {path}")
