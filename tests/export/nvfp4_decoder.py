"""An NVFP4 decoder written from the export format's description alone (no fp4lm code):

byte [out, in/2]: element 2i in the low nibble, 2i+1 in the high nibble; in a nibble, bit 3 is the sign and
bits 0-2 index the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6;
block scale float8_e4m3fn [out, in/16]: one per 16 consecutive inputs;
ModelOpt:            value = e2m1 · weight_scale · weight_scale_2            (float32, in that order)
compressed-tensors:  value = e2m1 · weight_scale / weight_global_scale
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)


def e2m1_values(packed: np.ndarray) -> np.ndarray:
    """float32 [out, in] from uint8 [out, in/2]."""
    nibbles = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(packed.shape[0], -1)
    sign = np.where(nibbles & 0x8, np.float32(-1.0), np.float32(1.0))
    return sign * MAGNITUDES[nibbles & 0x7]


def block_scaled(packed: np.ndarray, block_scales: np.ndarray) -> np.ndarray:
    scales = np.asarray(block_scales).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    return e2m1_values(packed) * np.repeat(scales, 16, axis=1)


def decode_modelopt(weight, weight_scale, weight_scale_2) -> np.ndarray:
    return block_scaled(weight, weight_scale) * np.float32(weight_scale_2)


def decode_compressed_tensors(weight_packed, weight_scale, weight_global_scale) -> np.ndarray:
    return block_scaled(weight_packed, weight_scale) / np.float32(np.asarray(weight_global_scale).reshape(()))
