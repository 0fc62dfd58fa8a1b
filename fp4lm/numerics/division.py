"""Correctly rounded float32 division whose bits do not depend on the platform's divide.

XLA:CPU divides float32 correctly rounded; XLA:GPU compiles a divide to an approximate one (up to
2 ulp off), and every compiler may turn `x / c` into `x · fl(1/c)`. One ulp in `2688/amax` or in a
block's encode scale moves NVFP4 codes, so every division on the quantization path goes through
`divide_correctly_rounded(a, b)`, which returns round-to-nearest-even(a / b) on any platform.

The method, for finite, non-zero a and b:

1. Normalise with integer bit operations (exact; subnormals included, never flushed):
       |a| = Ma · 2^(ea-23),  |b| = Mb · 2^(eb-23),  Ma, Mb integers in [2^23, 2^24).
2. The exact quotient is T · 2^k with
       s = 23 if Ma >= Mb else 24,   T = Ma · 2^s / Mb  in [2^23, 2^24),   k = ea - eb - s.
3. Approximate: Q = round(q · 2^s) from any q ≈ ma / mb (ma = Ma·2^-23, mb = Mb·2^-23 in [1, 2));
   q may be off by up to 64 ulps. It is ma times a Newton-refined reciprocal of mb: no divide
   instruction at all, so nothing here depends on how a platform divides.
4. Exact residual, in integers: R = Ma·2^s - Q·Mb. The true R is below 2^31 in magnitude whenever
   |T - Q| < 128 (Mb < 2^24), so uint32 arithmetic, which wraps modulo 2^32, gives it exactly.
5. Exact correction: c = floor(R / Mb) and rem = R - c·Mb in [0, Mb) (c estimated to within one
   and fixed in integers), so T = (Q + c) + rem/Mb. Round to nearest even: N = Q + c + 1 if 2·rem > Mb (or
   == Mb and Q + c is odd). A quotient of two 24-bit significands is never exactly halfway, but
   the tie rule is kept for completeness. The sign of T - N (from rem and the rounding) is kept.
6. Assemble the float32 bits of N · 2^k (adding N to the exponent field carries N = 2^24 into the
   exponent). Overflow gives inf. A subnormal result shifts N right, rounding to nearest even with
   the sign of T - N breaking what looks like a tie - N is the correct 24-bit rounding, so no 24-bit
   midpoint separates T from N and this second rounding equals rounding T directly (no double
   rounding).

Special values follow IEEE 754: NaN if either operand is NaN, 0/0 or inf/inf; inf for a finite
non-zero a over 0 and for inf over a finite b; zero for 0 over non-zero and finite over inf; the
sign is the XOR of the operands' signs. Every decision reads bit patterns, not float comparisons,
so a platform that treats subnormals as zero (XLA:CPU) still gets the IEEE answer.

No step is sensitive to FMA contraction or to the compiler's reciprocal rewrites: float arithmetic
only produces estimates (step 3, the estimate of c in step 5) whose errors the integer steps remove.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

# Bit patterns as int32 (the sign bit is the int32 minimum).
_SIGN = np.int32(-(2**31))
_ABS = np.int32(0x7FFFFFFF)
_INF = np.int32(0x7F800000)
_NAN = np.int32(0x7FC00000)
_FRACTION = np.int32(0x007FFFFF)
_HIDDEN = np.int32(0x00800000)
_ONE_EXPONENT = np.int32(127 << 23)


def _reciprocal_estimate(b):
    """1/b for b in [1, 2) to a few ulps, by multiplications only: a linear start (relative error
    < 9%) and three Newton steps e -> e^2. Its accuracy may differ between platforms (FMA), its use
    below does not depend on it."""
    inverse = np.float32(1.4571) - np.float32(0.5) * b
    for _ in range(3):
        inverse = inverse * (np.float32(2.0) - b * inverse)
    return inverse


def _approximate_divide(a, b):
    """A first guess of a / b for a, b in [1, 2) (tests replace it by one that is off by ulps).

    No divide instruction: XLA keeps a divide out of the surrounding fusion and then duplicates the
    code around it, which made this helper several times more expensive to compile."""
    return a * _reciprocal_estimate(b)


def _significand_and_exponent(abs_bits):
    """(M int32 in [2^23, 2^24), e int32) with |x| = M · 2^(e-23), for finite non-zero bit patterns
    (int32 with the sign cleared). Subnormals are normalised with a count of leading zeros."""
    biased = abs_bits >> 23
    fraction = abs_bits & _FRACTION
    subnormal = biased == 0
    shift = jnp.where(subnormal, lax.clz(fraction) - 8, 0)
    significand = jnp.where(subnormal, fraction << shift, fraction | _HIDDEN)
    return significand, jnp.where(subnormal, -126 - shift, biased - 127)


def _as_unit_interval(significand):
    """M·2^-23 in [1, 2) as float32 (exact, built from bits)."""
    return lax.bitcast_convert_type((significand & _FRACTION) | _ONE_EXPONENT, jnp.float32)


def _floor_divide_small(residual, divisor, divisor_inverse):
    """(c, rem) with residual = c·divisor + rem, 0 <= rem < divisor, for |residual / divisor| < 128.

    residual: int32; divisor: int32 in [2^23, 2^24); divisor_inverse: about 2^23/divisor (float32,
    relative error < 2^-10 is plenty). c is estimated with a multiply, off by at most one, and then
    corrected exactly in integers (an integer divide would split XLA's fusion just like a float one).
    """
    estimate = jnp.floor(residual.astype(jnp.float32) * (np.float32(2.0**-23) * divisor_inverse)).astype(jnp.int32)
    remainder = _wrapping(residual, estimate, divisor)
    below, above = remainder < 0, remainder >= divisor
    correction = estimate + jnp.where(below, -1, jnp.where(above, 1, 0))
    return correction, remainder + jnp.where(below, divisor, jnp.where(above, -divisor, 0))


def _wrapping(a, q, b, shift: jax.Array | int = 0):
    """a·2^shift - q·b for int32 arrays, modulo 2^32 (in uint32, which wraps by definition, unlike a
    signed overflow): exact whenever the result fits in an int32."""
    u = jnp.uint32
    shifted = a.astype(u) << jnp.asarray(shift).astype(u)
    return lax.bitcast_convert_type(shifted - q.astype(u) * b.astype(u), jnp.int32)


def _assemble(n, k, above):
    """float32 bits (int32) of n · 2^k for n in [2^23, 2^24], rounded to nearest even where the result
    is subnormal; `above` (-1, 0, +1) is the sign of (exact quotient - n), which breaks apparent ties.
    Adding n, hidden bit included, to the exponent field lets n = 2^24 carry into the exponent."""
    biased = k + 150  # n · 2^k = (n / 2^23) · 2^(biased - 127)
    normal_bits = ((biased - 1) << 23) + n
    shift = jnp.clip(1 - biased, 1, 26)
    kept = n >> shift
    dropped = n & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    tie_up = (above > 0) | ((above == 0) & ((kept & 1) == 1))
    subnormal_bits = kept + ((dropped > half) | ((dropped == half) & tie_up)).astype(jnp.int32)
    return jnp.where(biased > 254, _INF, jnp.where(biased >= 1, normal_bits, subnormal_bits))


def divide_correctly_rounded(a, b):
    """fp32(a / b) rounded to nearest even, bit-identical on every platform (module docstring).

    a, b: float32 arrays (or values convertible to float32 exactly), broadcast against each other.
    Returns float32. IEEE special values and subnormals are handled exactly.
    """
    a, b = jnp.broadcast_arrays(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32))
    # The barrier materialises the quotient: without it XLA fuses these ~100 cheap ops into each
    # consumer, e.g. once per element instead of once per block scale or per tensor.
    return lax.optimization_barrier(_divide(a, b))


@jax.jit
def _divide(a, b):
    """divide_correctly_rounded on float32 arrays of one shape (jitted: traced once per shape)."""
    a_bits = lax.bitcast_convert_type(a, jnp.int32)
    b_bits = lax.bitcast_convert_type(b, jnp.int32)
    a_abs, b_abs = a_bits & _ABS, b_bits & _ABS

    a_significand, a_exponent = _significand_and_exponent(a_abs)
    b_significand, b_exponent = _significand_and_exponent(b_abs)
    smaller = a_significand < b_significand
    s = jnp.where(smaller, 24, 23)
    guess = _approximate_divide(_as_unit_interval(a_significand), _as_unit_interval(b_significand))
    guess = guess * jnp.where(smaller, np.float32(2.0**24), np.float32(2.0**23))
    q = jnp.clip(jnp.round(guess), 2.0**22, 2.0**25).astype(jnp.int32)

    # Exact residual R = Ma·2^s - Q·Mb (exact modulo 2^32, and |R| < 2^31), then T = Q + c + rem/Mb.
    residual = _wrapping(a_significand, q, b_significand, shift=s)
    divisor_inverse = _reciprocal_estimate(_as_unit_interval(b_significand))
    correction, remainder = _floor_divide_small(residual, b_significand, divisor_inverse)
    n = q + correction
    twice = 2 * remainder
    up = (twice > b_significand) | ((twice == b_significand) & ((n & 1) == 1))
    above = jnp.where(up, -1, jnp.where(remainder > 0, 1, 0))
    finite_bits = _assemble(n + up.astype(jnp.int32), a_exponent - b_exponent - s, above)

    a_nan, b_nan = a_abs > _INF, b_abs > _INF
    a_inf, b_inf = a_abs == _INF, b_abs == _INF
    a_zero, b_zero = a_abs == 0, b_abs == 0
    nan = a_nan | b_nan | (a_zero & b_zero) | (a_inf & b_inf)
    magnitude = jnp.where(a_inf | b_zero, _INF, jnp.where(a_zero | b_inf, 0, finite_bits))
    bits = jnp.where(nan, _NAN, magnitude | ((a_bits ^ b_bits) & _SIGN))
    return lax.bitcast_convert_type(bits, jnp.float32)


def reciprocal_correctly_rounded(b):
    """fp32(1 / b), correctly rounded on every platform."""
    return divide_correctly_rounded(np.float32(1.0), b)
