"""The NVFP4 export of every recipe: where the forward pass's weight is NVFP4 with one
global scale (every nvfp4 recipe, 4over6's codes and its amax/1536 global scale included), the export decoded
as a consumer decodes it (tests/export/nvfp4_decoder.py: code x block scale x global scale) equals, bit for
bit, what the recipe's own fprop_w quantizer dequantizes the weight to, and is labelled "trained"; where it is
not (MX, FP8, bf16), the export is NVFP4 post-training quantization (16x16 tiles, round-to-nearest) and says
so. The tiny run's kernels are re-labelled with each recipe (the export reads only the policy and the weights)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import safetensors

from fp4lm.export.nvfp4 import export_nvfp4
from fp4lm.export.source import load_source
from fp4lm.hf import tensor_names
from fp4lm.numerics import nvfp4
from fp4lm.quant import Policy, dot
from fp4lm.quant.recipes import RECIPES
from tests.export import nvfp4_decoder
from tests.export.safetensors_reading import read_checkpoint
from tests.export.test_nvfp4_export import _paths, _with_shared_amax, kernel_of

pytestmark = pytest.mark.slow

TRAINED = {
    "nvfp4",
    "nvfp4_no_rht",
    "nvfp4_no_sr",
    "nvfp4_1d_weights",
    "nvfp4_fwd_only",
    "nvfp4_naive",
    "nvfp4_4over6",
    "nvfp4_row_scaled",  # its row scaling is on the 1x16 operands; its weights are plain 16x16 tiles
    "nvfp4_fwd_mxfp8_bwd",
    "nvfp4_bwd_high_precision",
    "nvfp4_bwd_dequantized",
}
"""The recipes whose forward weights an NVFP4 export holds as they are: the decision, one recipe at a time."""


@pytest.fixture(scope="module")
def shared(trained_run):
    """The tiny run with every fused group's members sharing one amax, so every layer is written unchanged."""
    return _with_shared_amax(load_source(str(trained_run)))


def _as_recipe(source, recipe: str, **policy):
    quantized = Policy(recipe, num_layers=source.config.model.num_layers, **policy)
    return dataclasses.replace(source, quantized_policy=quantized, policy=quantized)


def _header_label(directory) -> str:
    with safetensors.safe_open(str(directory / "model.safetensors"), framework="numpy") as opened:
        return opened.metadata()["fp4lm_nvfp4_weights"]


def _expected(source, path: str, recipe: str) -> np.ndarray:
    """What the forward pass's weight quantizer dequantizes W [out, in] to, or, post-training, 16x16 RNE NVFP4."""
    weight = jnp.asarray(kernel_of(source, path), jnp.bfloat16).T
    spec = RECIPES[recipe].fprop_w
    if recipe in TRAINED:
        assert spec is not None and spec.format == "nvfp4" and not spec.stochastic and not spec.hadamard
        return np.asarray(dot.quantize_operand(weight, spec, None).dequantize())
    return np.asarray(nvfp4.quantize(weight, block=(16, 16), rounding="nearest").dequantize())


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_every_recipe_exports_its_forward_weights_or_says_post_training(shared, tmp_path, recipe):
    source = _as_recipe(shared, recipe)
    provenance = {}
    for name, layout in (("mo", "modelopt"), ("ct", "compressed-tensors")):
        (tmp_path / name).mkdir()
        provenance[name] = export_nvfp4(source, tmp_path / name, layout=layout, log=lambda _: None)
    label = "trained" if recipe in TRAINED else "post-training"
    assert provenance["mo"].label == provenance["ct"].label == label
    assert _header_label(tmp_path / "mo") == _header_label(tmp_path / "ct") == label
    mo, ct = read_checkpoint(tmp_path / "mo"), read_checkpoint(tmp_path / "ct")
    for path in _paths(source):
        module = tensor_names.hf_module(path)
        expected = _expected(source, path, recipe)
        decoded = nvfp4_decoder.decode_modelopt(
            *(mo[f"{module}.{n}"] for n in ("weight", "weight_scale", "weight_scale_2"))
        )
        np.testing.assert_array_equal(decoded.view(np.uint32), expected.view(np.uint32), err_msg=f"{recipe} {path}")
        ct_decoded = nvfp4_decoder.decode_compressed_tensors(
            *(ct[f"{module}.{n}"] for n in ("weight_packed", "weight_scale", "weight_global_scale"))
        )
        ulps = np.abs(ct_decoded.view(np.int32).astype(np.int64) - expected.view(np.int32).astype(np.int64))
        assert ulps.max() <= 2, (recipe, path, ulps.max())


def test_4over6_codes_are_not_plain_nvfp4_codes(shared, tmp_path):
    """The 4over6 export differs from plain NVFP4 (so the test above tells them apart), its global scale is
    amax / 1536 and the compressed-tensors one its reciprocal."""
    export_nvfp4(_as_recipe(shared, "nvfp4_4over6"), tmp_path, layout="modelopt", log=lambda _: None)
    tensors = read_checkpoint(tmp_path)
    differing = 0
    for path in _paths(shared):
        module = tensor_names.hf_module(path)
        weight = jnp.asarray(kernel_of(shared, path), jnp.bfloat16).T
        plain = nvfp4.quantize(weight, block=(16, 16), rounding="nearest")
        differing += int(
            np.any(tensors[f"{module}.weight_scale"].view(np.uint8) != np.asarray(plain.scales).view(np.uint8))
        )
        amax = np.float32(np.abs(np.asarray(weight, np.float32)).max())
        assert tensors[f"{module}.weight_scale_2"] == amax / np.float32(1536), path
    assert differing == len(_paths(shared))


def test_a_recipe_mix_is_labelled_mixed_and_counts_the_post_training_layers(shared, tmp_path):
    source = _as_recipe(shared, "nvfp4", rules=((r"blocks\.0\..*", "mxfp8"),))
    logged = []
    provenance = export_nvfp4(source, tmp_path, layout="modelopt", log=logged.append)
    assert provenance.label == _header_label(tmp_path) == "mixed"
    assert provenance.text.startswith("mixed: 7 of 14 projections were not trained with NVFP4 weights"), provenance.text
    tensors = read_checkpoint(tmp_path)
    assert tensors["model.layers.0.self_attn.q_proj.weight_scale"].dtype == ml_dtypes.float8_e4m3fn
