"""Number formats and quantizers (jax.numpy + jax.lax + numpy + ml_dtypes only).

`quantize(x, format, ...)` is the one entry point the rest of fp4lm uses; each format's module
(nvfp4, microscaling, fp8) documents its exact math. Every returned array is a pytree with
`.dequantize(dtype)`.
"""

import dataclasses

import jax.numpy as jnp

from fp4lm.numerics import fp8, microscaling, nvfp4
from fp4lm.numerics.fp8 import FP8Array
from fp4lm.numerics.hadamard import rht, rht_matrix
from fp4lm.numerics.microscaling import MXArray
from fp4lm.numerics.nvfp4 import NVFP4Array
from fp4lm.numerics.rounding import check_rounding

FORMATS = ("nvfp4", "mxfp4", "mxfp8", "fp8_e4m3", "fp8_e5m2")
_FP8_DTYPES = {"fp8_e4m3": jnp.float8_e4m3fn, "fp8_e5m2": jnp.float8_e5m2}
_DEFAULT_BLOCK = (1, 16)

__all__ = ["FORMATS", "FP8Array", "MXArray", "NVFP4Array", "quantize", "rht", "rht_matrix"]


def quantize(
    x,
    format,
    *,
    block=_DEFAULT_BLOCK,
    rounding="nearest",
    key=None,
    hadamard=False,
    tensor_amax=None,
    nvfp4_options=nvfp4.PLAIN,
):
    """Quantize x in `format` ("nvfp4" | "mxfp4" | "mxfp8" | "fp8_e4m3" | "fp8_e5m2").

    block:    NVFP4's block, (1, 16) or (16, 16). MX formats always use 1x32 blocks and FP8 one
              per-tensor scale; for them `block` must be the default (1, 16) or (1, 32) for MX.
    rounding: "nearest", or "stochastic" (nvfp4 and mxfp4 only; needs `key`).
    hadamard: apply the 16-point RHT along the last axis first (the result stays transformed).
    tensor_amax: nvfp4 only: the amax its global scale is made from, instead of the tensor's own (a group of
              tensors sharing one global scale; it must be at least max |x|).
    nvfp4_options: nvfp4 only: row-scaled amax, 4over6 and its E4M3 range (`nvfp4.Options`).
    Raises ValueError for an unknown format, an unsupported option, or a shape the block does
    not divide.
    """
    block = tuple(block)
    check_rounding(rounding, key, fmt=str(format))
    if format == "nvfp4":
        return nvfp4.quantize(
            x,
            block=block,
            rounding=rounding,
            key=key,
            hadamard=hadamard,
            tensor_amax=tensor_amax,
            **dataclasses.asdict(nvfp4_options),
        )
    if format not in FORMATS:
        raise ValueError(f"unknown quantization format {format!r}; use one of {FORMATS}")
    if tensor_amax is not None:
        raise ValueError(f"{format}: tensor_amax is for nvfp4's global scale only; leave it unset")
    if nvfp4_options != nvfp4.PLAIN:
        raise ValueError(f"{format}: row scaling and 4over6 are nvfp4 options; leave them unset")

    allowed_blocks: list[tuple[int, int]] = [_DEFAULT_BLOCK]
    if format.startswith("mx"):
        allowed_blocks.append((1, microscaling.MX_BLOCK_SIZE))
    if block not in allowed_blocks:
        raise ValueError(
            f"{format}: block {block} is not supported (only nvfp4 has other blocks); leave block at its default"
        )
    if rounding == "stochastic" and format != "mxfp4":
        raise ValueError(
            f"{format}: stochastic rounding is implemented for nvfp4 and mxfp4 only; use rounding='nearest'"
        )

    if format == "mxfp4":
        return microscaling.quantize_mxfp4(x, rounding=rounding, key=key, hadamard=hadamard)
    if format == "mxfp8":
        return microscaling.quantize_mxfp8(x, hadamard=hadamard)
    x = jnp.asarray(x)
    if hadamard:
        x = rht(x)
    return fp8.quantize(x, _FP8_DTYPES[format])
