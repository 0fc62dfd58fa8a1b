"""Export a run's checkpoint for other tools.

    fp4lm export RUN_DIR --format hf|nvfp4|nvfp4-ct --out DIR [--step N] [--dtype bfloat16|float32] [--force]

- fp4lm/hf/export.py: a `transformers` checkpoint, Llama, Mixtral, Qwen3-MoE or Qwen2-MoE (bf16 or f32
  safetensors, config, tokenizer);
- nvfp4.py: the NVFP4 weights the forward pass used, in ModelOpt's layout (vLLM `modelopt_fp4`,
  TensorRT-LLM, SGLang) or compressed-tensors' `nvfp4-pack-quantized` (llm-compressor's output).

The output directory is written complete or not at all (output_dir.py).
"""

from __future__ import annotations

from fp4lm.errors import UserError

FORMATS = ("hf", "nvfp4", "nvfp4-ct")
ACTIVATIONS = ("none", "nvfp4")  # weights only (W4A16), or NVFP4 activations too (W4A4, calibrated)


def export_run(
    run_dir: str,
    *,
    fmt: str,
    out: str,
    step: int | None = None,
    dtype: str | None = None,
    force: bool = False,
    activations: str = "none",
    calibration_batches: int | None = None,
    log=print,
) -> None:
    """Exports checkpoint `step` (None: the newest) of `run_dir` to `out` in format `fmt`; NVFP4 formats with
    `activations="nvfp4"` are W4A4, their input scales calibrated on `calibration_batches` validation batches.
    `dtype` (hf only; None: bfloat16) and `calibration_batches` (W4A4 only) given where they do not apply are
    refused, not ignored."""
    from fp4lm.export import calibration, nvfp4
    from fp4lm.export.output_dir import check_output_dir, staged_output
    from fp4lm.export.source import load_source
    from fp4lm.hf import export as hf

    if fmt not in FORMATS:
        raise UserError(f"--format {fmt} is not one of {', '.join(FORMATS)}; pass e.g. --format hf")
    if dtype is not None and fmt != "hf":
        raise UserError(
            f"--dtype {dtype} applies to --format hf only; --format {fmt} writes its unquantized tensors in bfloat16, "
            "as serving engines expect: drop --dtype"
        )
    dtype = dtype or "bfloat16"
    hf.check_dtype(dtype)
    if activations not in ACTIVATIONS:
        raise UserError(f"--activations {activations} is not one of {', '.join(ACTIVATIONS)}; pass none or nvfp4")
    if activations == "nvfp4" and fmt == "hf":
        raise UserError("--activations nvfp4 applies to --format nvfp4 or nvfp4-ct; drop it for --format hf")
    if calibration_batches is not None and activations != "nvfp4":
        raise UserError(
            f"--calibration-batches {calibration_batches} applies only with --activations nvfp4 (W4A4), which this "
            "export does not ask for; add --activations nvfp4, or drop --calibration-batches"
        )
    calibration.check_calibration_batches(activations, calibration_batches or 0)
    path = check_output_dir(out, force=force, run_dir=run_dir)  # before the checkpoint is read: a refusal is instant
    source = load_source(run_dir, step)
    hf.check_expressible(source.config.model)
    if activations == "nvfp4" and nvfp4.quantizes_no_layer(source.quantized_policy, source.config.model):
        raise UserError(
            f"--activations nvfp4: {run_dir} was trained in {source.quantized_policy.recipe} with no NVFP4 layer, "
            "so it has no quantized forward pass to calibrate input scales on; export weights only (--activations "
            "none), which quantizes its weights post-training"
        )
    input_amax = calibration.input_amaxes(source, calibration_batches or 0, log) if activations == "nvfp4" else None
    provenance = None
    with staged_output(path, log) as staging:
        if fmt == "hf":
            hf.export_hf(source, staging, dtype=dtype)
        else:
            layout = "modelopt" if fmt == "nvfp4" else "compressed-tensors"
            provenance = nvfp4.export_nvfp4(source, staging, layout=layout, log=log, input_amax=input_amax)
    weights = f" ({provenance.text})" if provenance else ""
    log(f"exported {run_dir} step {source.step} as {fmt} to {path}{weights}")
