"""An independent NumPy transcription of docs/numerics.md §2.2 and §6, used as a test oracle.

Written for clarity, not speed: IEEE float32 scalar/array arithmetic from NumPy (which does not
flush subnormals, so callers keep inputs out of the float32 subnormal range), ml_dtypes for the
E4M3 and E2M1 casts. Shares no code with fp4lm.numerics on purpose.
"""

import ml_dtypes
import numpy as np

F32 = np.float32
FLT_MAX = F32(3.4028235e38)
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], F32)


def _block_amax(xf, tile):
    rows, cols = xf.shape
    if tile == (1, 16):
        return np.max(np.abs(xf).reshape(rows, cols // 16, 16), axis=-1)
    tiles = np.abs(xf).reshape(rows // 16, 16, cols // 16, 16).max(axis=(1, 3))
    return np.repeat(tiles, 16, axis=0)


def quantize(x, tile=(1, 16)):
    """x: 2-D array (float32 or bf16). Returns dict(codes, scale_bytes, amax, dequant)."""
    with np.errstate(all="ignore"):
        xf = np.asarray(x).astype(F32)
        amax = F32(np.max(np.abs(xf)))
        s_enc = np.minimum(F32(2688) / amax, FLT_MAX)
        if s_enc == 0:
            s_enc = F32(1)
        s_dec = F32(1) / s_enc
        multiplier = F32(s_enc * F32(1.0 / 6.0))
        block_amax = _block_amax(xf, tile)
        d = np.clip(np.minimum(block_amax * multiplier, FLT_MAX), F32(-448), F32(448))
        scales = d.astype(ml_dtypes.float8_e4m3fn)
        scale_f32 = scales.astype(F32)
        encode = np.minimum(F32(1) / (scale_f32 * s_dec), FLT_MAX)
        blocks = xf.reshape(xf.shape[0], -1, 16)
        v = np.clip(blocks * encode[..., None], F32(-6), F32(6))
        magnitude = np.abs(v).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 7
        magnitude = np.where(np.isnan(v), 0, magnitude).astype(np.uint8)
        codes = (magnitude | ((v < 0).astype(np.uint8) << 3)).reshape(xf.shape)
        decode = F32(amax / F32(2688))
        values = E2M1_VALUES[codes].reshape(blocks.shape)
        dequant = ((values * scale_f32[..., None]) * decode).reshape(xf.shape)
    return dict(codes=codes, scale_bytes=scales.view(np.uint8), amax=amax, dequant=dequant)
