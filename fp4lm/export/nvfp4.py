"""`fp4lm export RUN_DIR --format nvfp4 | nvfp4-ct`: the NVFP4 weights the forward pass used.

Per quantized linear layer P (a Hugging Face module name, model.layers.3.self_attn.q_proj):

ModelOpt (`--format nvfp4`; vLLM `modelopt_fp4`, TensorRT-LLM, SGLang)
    P.weight          uint8 [out, in/2]     two E2M1 codes per byte, element 2i in the low nibble; code
                                            bit 3 is the sign, bits 0-2 index 0, .5, 1, 1.5, 2, 3, 4, 6
    P.weight_scale    float8_e4m3fn [out, in/16]   one scale per 16 consecutive inputs (row-major)
    P.weight_scale_2  float32 []            amax / 2688 (amax / 1536 for 4over6's e4m3_max 256)
    decode: e2m1 · weight_scale · weight_scale_2, which is fp4lm's dequantization, bit for bit.

compressed-tensors (`--format nvfp4-ct`, `nvfp4-pack-quantized`; llm-compressor's output)
    P.weight_packed, P.weight_scale         the same bytes
    P.weight_global_scale  float32 [1]      2688 / amax (1536 / amax for 4over6), the reciprocal
    decode: e2m1 · weight_scale / weight_global_scale. The global scale is stored as a rounded reciprocal,
    so decoding is not bit-exact: 1 / weight_global_scale is within one float32 ulp of amax / 2688, and a
    decoded value, rounded twice on each side, within two float32 ulps of fp4lm's value (relative error below
    2^-22, far under bfloat16's resolution). tests/export/test_nvfp4_export.py checks both bounds on every
    E2M1 x E4M3 product over ten decades of amax, and on the exported weights.

Each recipe's forward weight is written as it is where it is NVFP4 with one global scale (every nvfp4
recipe, 4over6 included: fp4lm.export.nvfp4_weights). A run that quantized no layer (precision.recipe=bf16),
one past its precision.bf16_after switch, and layers whose forward weights are MX or FP8 are quantized here,
post-training, from their bf16 weights (16x16 tiles, round-to-nearest); the output line and the metadata say
so, from one decision (fp4lm.export.provenance).

Both: weights-only (activations stay bf16: ModelOpt `W4A16_NVFP4`, compressed-tensors without
`input_activations`). The embedding, the LM head, the norms and the layers the run kept in bf16 are
written in bfloat16 and listed as excluded / ignored. Fused groups (q/k/v, gate/up) share one global scale
(fp4lm.export.nvfp4_weights).
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable

import ml_dtypes
import numpy as np

from fp4lm.config import ModelConfig
from fp4lm.export.consumer_notes import compressed_tensors_notes
from fp4lm.export.nvfp4_weights import (
    FUSED_GROUPS,
    QuantizedWeight,
    check_group_precision,
    forward_spec,
    quantize_group,
)
from fp4lm.export.provenance import METADATA_KEY, POST_TRAINING, Provenance, weights_provenance
from fp4lm.export.source import ExportSource
from fp4lm.hf import architectures, safetensors_files, tensor_names
from fp4lm.hf import export as hf
from fp4lm.linear_layers import linear_layers
from fp4lm.quant import Policy

LAYOUTS = ("modelopt", "compressed-tensors")
GLOBAL_SCALE_RANGE = np.float32(2688.0)  # 6 · 448: E2M1's largest value times E4M3's
BF16 = ml_dtypes.bfloat16


def _layer_tensors(
    q: QuantizedWeight, layout: str, input_amax: float | None, architecture: str
) -> list[tuple[str, np.ndarray]]:
    """The layer's tensors; `input_amax` (W4A4) adds its activation scale: amax/2688 (ModelOpt's input_scale)
    or its reciprocal (compressed-tensors' input_global_scale). NumPy's float32 division is correctly rounded."""
    module = tensor_names.projection_module(q.path, architecture)
    if layout == "modelopt":
        tensors = [
            (f"{module}.weight", q.packed),
            (f"{module}.weight_scale", q.scales),
            (f"{module}.weight_scale_2", np.asarray(q.global_decode_scale, np.float32).reshape(())),
        ]
        if input_amax is not None:
            tensors.append((f"{module}.input_scale", np.asarray(np.float32(input_amax) / GLOBAL_SCALE_RANGE)))
        return tensors
    global_scale = np.float32(q.global_range / np.float32(q.amax))
    tensors = [
        (f"{module}.weight_packed", q.packed),
        (f"{module}.weight_scale", q.scales),
        (f"{module}.weight_global_scale", np.asarray([global_scale], np.float32)),
    ]
    if input_amax is not None:
        input_global = np.float32(GLOBAL_SCALE_RANGE / np.float32(input_amax))
        tensors.append((f"{module}.input_global_scale", np.asarray([input_global], np.float32)))
    return tensors


def quantization_config(layout: str, excluded: list[str], *, w4a4: bool = False) -> dict:
    """config.json's `quantization_config` (and, for ModelOpt, the body of hf_quant_config.json)."""
    if layout == "modelopt":
        return {
            "quant_method": "modelopt",
            "quant_algo": "NVFP4" if w4a4 else "W4A16_NVFP4",
            "kv_cache_quant_algo": None,
            "group_size": 16,
            "exclude_modules": excluded,
        }
    weights = {
        "num_bits": 4,
        "type": "float",
        "strategy": "tensor_group",
        "group_size": 16,
        "symmetric": True,
        "dynamic": False,
        "observer": "minmax",
        "actorder": None,
        "block_structure": None,
        "scale_dtype": "torch.float8_e4m3fn",
    }
    activations = None
    if w4a4:  # one static global scale per layer (input_global_scale), block scales computed at run time
        activations = {**weights, "dynamic": "local", "observer": "minmax"}
    group = {"targets": ["Linear"], "weights": weights, "input_activations": activations, "output_activations": None}
    return {
        "quant_method": "compressed-tensors",
        "format": "nvfp4-pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": {**group, "format": "nvfp4-pack-quantized"}},
        "ignore": excluded,
        "kv_cache_scheme": None,
    }


def quantizes_no_layer(policy: Policy, model: ModelConfig) -> bool:
    """True for a run that kept every projection in bf16 (precision.recipe=bf16)."""
    paths = [layer.path for layer in linear_layers(model)]
    return not any(policy.recipe_for(path).is_quantized for path in paths)


def fused_groups(model: ModelConfig, index: int) -> list[list[str]]:
    """The layer paths of block `index` that a serving engine runs as one GEMM each (one global scale):
    q/k/v, o, and gate/up and down of the dense MLP, of each routed expert (`{experts path}.{e}`) and of the
    shared experts."""
    prefix = f"blocks.{index}"
    if not model.is_moe_block(index):
        return [[f"{prefix}.{name}" for name in group] for group in FUSED_GROUPS]
    groups = [[f"{prefix}.{name}" for name in group] for group in FUSED_GROUPS if group[0].startswith("attn.")]
    for expert in range(model.num_experts):
        groups.append([f"{prefix}.mlp.experts.gate.{expert}", f"{prefix}.mlp.experts.up.{expert}"])
        groups.append([f"{prefix}.mlp.experts.down.{expert}"])
    if model.num_shared_experts:
        groups += [[f"{prefix}.mlp.shared.gate", f"{prefix}.mlp.shared.up"], [f"{prefix}.mlp.shared.down"]]
    return groups


def layer_of(path: str) -> str:
    """The layer whose recipe a path takes: an expert's slice (`{experts path}.{e}`) takes the experts'."""
    return path.rsplit(".", 1)[0] if ".mlp.experts." in path else path


def export_nvfp4(
    source: ExportSource,
    directory: pathlib.Path,
    *,
    layout: str,
    log: Callable[[str], None],
    input_amax: dict[str, float] | None = None,
) -> Provenance:
    """Writes the NVFP4 checkpoint of `source` into `directory` in `layout` ("modelopt" | "compressed-tensors").
    `input_amax` ({layer path: calibrated input amax}, fp4lm.export.calibration): W4A4, with activation scales.
    Returns whether the weights are the trained ones or were quantized now (fp4lm.export.provenance), which the
    export's metadata records.

    A run that quantized no layer (precision.recipe=bf16), and layers whose forward weights are not NVFP4, are
    quantized now, post-training, from their bf16 weights with 16x16 tiles and round-to-nearest: an NVFP4
    export of what was asked for, said so in the provenance."""
    assert layout in LAYOUTS, layout
    cfg = source.config.model
    policy = source.quantized_policy  # the precision the run trains (and serves) its quantized layers in
    trained_unquantized = quantizes_no_layer(policy, cfg)
    architecture = architectures.architecture_of(cfg)
    kernels = dict(tensor_names.block_projection_kernels(source.params, cfg))
    kernels.update(tensor_names.expert_kernels(source.params, cfg))
    tensors = [(name, value.astype(BF16)) for name, value in tensor_names.non_projection_tensors(source.params, cfg)]
    excluded = [
        tensor_names.LM_HEAD,
        tensor_names.EMBEDDING,
        *tensor_names.router_modules(cfg),
        *tensor_names.shared_expert_gates(cfg),
    ]
    changes, quantized_count, post_training = [], 0, []
    expert_blocks: dict[bool, set[int]] = {True: set(), False: set()}  # quantized or not -> MoE blocks
    for index in range(cfg.num_layers):
        for paths in fused_groups(cfg, index):
            check_group_precision(policy, [layer_of(path) for path in paths])
            modules = [tensor_names.projection_module(path, architecture) for path in paths]
            bf16 = not trained_unquantized and not policy.recipe_for(layer_of(paths[0])).is_quantized
            if ".mlp.experts." in paths[0]:
                expert_blocks[not bf16].add(index)
            if bf16:
                excluded += modules
                tensors += [(f"{m}.weight", kernels[p].T.astype(BF16)) for m, p in zip(modules, paths, strict=True)]
                continue
            spec = None if trained_unquantized else forward_spec(policy, layer_of(paths[0]))
            quantized_count += len(paths)
            if spec is None:
                post_training += paths
            quantized, change = quantize_group(
                {p: kernels[p] for p in paths}, spec, trained_shared=policy.shared_weight_scale
            )
            if spec is not None and change is not None:
                changes.append((paths, change))
            for q in quantized:
                tensors += _layer_tensors(q, layout, None if input_amax is None else input_amax[q.path], architecture)
    provenance = weights_provenance(
        recipe=policy.recipe,
        step=source.step,
        switch_step=source.bf16_switch,
        quantized=quantized_count,
        post_training=len(post_training),
    )
    if provenance.label != POST_TRAINING:  # the shared-amax re-quantization moved trained weights: how far
        for paths, change in changes:
            log(
                f"re-quantized {', '.join(paths)} with their shared amax (one global scale per fused group; "
                f"precision.shared_weight_scale is off): relative change of the weights {change.change:.2e} "
                f"(for scale, their NVFP4 error against the bf16 weights: {change.error_before:.2e})"
            )
    if layout == "compressed-tensors":
        notes = compressed_tensors_notes(
            quantized_expert_blocks=sorted(expert_blocks[True]), bf16_expert_blocks=sorted(expert_blocks[False])
        )
        for note in notes:
            log(note)
    safetensors_files.write_checkpoint(directory, tensors, metadata={METADATA_KEY: provenance.label})
    config = quantization_config(layout, excluded, w4a4=input_amax is not None)
    hf.write_model_files(directory, source, dtype="bfloat16", quantization=config)
    if layout == "modelopt":
        body = {key: value for key, value in config.items() if key != "quant_method"}
        producer = {
            "name": "fp4lm",
            "version": _version(),
            "weights_provenance": provenance.label,
            "weights": provenance.text,
        }
        hf.write_json(directory / "hf_quant_config.json", {"producer": producer, "quantization": body})
    return provenance


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fp4lm")
    except PackageNotFoundError:
        return "unknown"
