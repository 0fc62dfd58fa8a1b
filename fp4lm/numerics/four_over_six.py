"""4over6: per NVFP4 block, scale its amax to 4 or to 6, whichever errs less (docs/numerics.md §2.8).

E2M1's grid is sparse at the top (4, 6): a block whose largest value lands on 6 has nothing between 4 and 6
for its next-largest values. Scaling the block so that its amax maps to 4 instead (a block scale 1.5x as
large) trades range for the denser 0..4 part of the grid. Both candidates are quantized and the one with
the smaller error is kept; the codes are then those of the chosen scale, so a GEMM reads them as usual.

The arithmetic follows TransformerEngine's reference (`NVFP4QuantizerRef`, commit d0067d0), all float32
with round-to-nearest-even, every division correctly rounded:

    S_enc   = min((6 · e4m3_max) / amax, FLT_MAX), 1 if that is 0      (amax of the tensor, or of the row)
    S_dec   = 1 / S_enc
    base_b  = fp32(amax_b / 6) · S_enc                                  (divide FIRST: unlike the plain path)
    s_b^4   = e4m3(clip(base_b · 1.5, 0, 448)),  s_b^6 = e4m3(clip(base_b, 0, 448))
    enc_b   = min(1 / fp32(s_b · S_dec), FLT_MAX)                       (per candidate)
    q_i     = E2M1 value of x_i · enc_b under RNE, saturating at 6
    err_b   = Σ_i |d_i|  (mae)  or  Σ_i d_i · d_i  (mse),   d_i = fp32(fp32(q_i · s_b) · amax) / (6 · e4m3_max) - x_i

The sum runs over the block's 16 elements in order, starting from 0. A 16x16 tile sums its 16 row errors
as a tree (rows 0-7 + 8-15, then 0-3 + 4-7, 0-1 + 2-3, 0 + 1), the order of the CUDA kernel's warp
reduction. The map-to-4 candidate wins only if its error is strictly smaller: ties (and NaN) keep map-to-6.
With e4m3_max = 256 the largest block's map-to-4 scale is 384 and never saturates at 448.
"""

import jax.numpy as jnp
import numpy as np

from fp4lm.numerics import formats
from fp4lm.numerics import nvfp4_scales as nvfp4
from fp4lm.numerics.division import divide_correctly_rounded
from fp4lm.numerics.rounding import nearest_magnitude_value

MAP_TO_4 = np.float32(1.5)
GRID_POINTS = tuple(np.float32(g) for g in (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0))  # E2M1's magnitudes


def _per_point_quotients(scale_f32, row_amax, e4m3_max):
    """fp32(fp32(p · s_b) · amax) / (6 · e4m3_max), correctly rounded, for each grid point p: [8, ...].

    A block's dequantized magnitudes take at most 8 values, one per grid point: one quotient per point and
    block instead of one per element. All points go through one division (stacked): the same arithmetic
    as eight, a fraction of the code for XLA to compile. Point 0 keeps 0 · inf = NaN as the per-element
    product has it."""
    points = np.asarray(GRID_POINTS).reshape((-1,) + (1,) * scale_f32.ndim)
    return divide_correctly_rounded((points * scale_f32) * row_amax, nvfp4.global_range(e4m3_max))


def _dequantized(magnitude, quotients):
    """Each element's dequantized magnitude: its grid point's quotient (``quotients`` stacked by point)."""
    value = jnp.zeros_like(magnitude)
    for i, point in enumerate(GRID_POINTS):
        value = jnp.where(magnitude == point, quotients[i], value)
    return value


def _block_errors(elements, scale_f32, scales, row_amax, e4m3_max, mode):
    """Each candidate's error per block, [candidates, N, K/16].

    elements: x as [1, N, K/16, 16]; scale_f32: the candidates' block scales stacked, [candidates, N, K/16].
    The sum runs over the 16 elements in order from 0 (no tree: the reference adds one at a time)."""
    v = elements * nvfp4.block_encode_scale(scale_f32, scales)[..., None]
    quotients = _per_point_quotients(scale_f32, row_amax, e4m3_max)[..., None]
    value = _dequantized(nearest_magnitude_value(jnp.abs(v)), quotients)
    diff = jnp.where(v < 0, -value, value) - elements  # the sign commutes with every rounding here
    terms = jnp.abs(diff) if mode == "mae" else diff * diff
    total = terms[..., 0]
    for i in range(1, nvfp4.BLOCK_SIZE):
        total = total + terms[..., i]
    return total


def _tile_errors(row_errors):
    """[..., N, K/16] row errors -> each 16x16 tile's sum in the kernel's tree order, repeated on its 16 rows."""
    *lead, rows, cols = row_errors.shape
    tiles = row_errors.reshape(*lead, rows // nvfp4.BLOCK_SIZE, nvfp4.BLOCK_SIZE, cols)
    while tiles.shape[-2] > 1:
        half = tiles.shape[-2] // 2
        tiles = tiles[..., :half, :] + tiles[..., half:, :]
    return jnp.broadcast_to(tiles, (*lead, rows // nvfp4.BLOCK_SIZE, nvfp4.BLOCK_SIZE, cols)).reshape(row_errors.shape)


def scale_bytes(blocks, block_amax, row_amax, scales, tile_rows, options):
    """Each block's E4M3 scale byte under 4over6 (uint8 [N, K/16]).

    blocks: x as float32 [N, K/16, 16]; block_amax: [N, K/16]; row_amax: the tensor amax (scalar) or one per
    row ([N, 1]); scales: row_amax's `GlobalScales` under options.e4m3_max; tile_rows: 1 (1x16 blocks) or
    16 (16x16 tiles, whose rows repeat the tile's amax).
    The two candidates are computed side by side, stacked on a leading axis (map to 4, map to 6).
    """
    base = divide_correctly_rounded(block_amax, np.float32(formats.E2M1_MAX)) * scales.enc
    target = jnp.stack([base * MAP_TO_4, base])
    candidate_bytes = formats.to_bytes(formats.to_e4m3(jnp.clip(target, 0.0, formats.E4M3_MAX)))
    scale_f32 = formats.from_bytes(candidate_bytes, jnp.float8_e4m3fn).astype(jnp.float32)
    errors = _block_errors(blocks[None], scale_f32, scales, row_amax, options.e4m3_max, options.four_over_six)
    if tile_rows > 1:
        errors = _tile_errors(errors)
    return jnp.where(errors[0] < errors[1], candidate_bytes[0], candidate_bytes[1])
