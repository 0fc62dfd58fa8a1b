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
6. Assemble the float32 bits: N · 2^k, with N = 2^24 renormalised. Overflow gives inf. A subnormal
   result shifts N right, rounding to nearest even with the sign of T - N breaking what looks like
   a tie - N is the correct 24-bit rounding, so no 24-bit midpoint separates T from N and this
   second rounding equals rounding T directly (no double-rounding error).

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

_SIGN = np.uint32(0x80000000)
_ABS = np.uint32(0x7FFFFFFF)
_INF = np.uint32(0x7F800000)
_NAN = np.uint32(0x7FC00000)
_FRACTION = np.uint32(0x007FFFFF)
_HIDDEN = np.uint32(0x00800000)
_ONE_EXPONENT = np.uint32(127 << 23)


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
    """(M uint32 in [2^23, 2^24), e int32) with |x| = M · 2^(e-23), for finite non-zero bit patterns.

    Subnormals are normalised with a count of leading zeros, all in integers.
    """
    biased = (abs_bits >> 23).astype(jnp.int32)
    fraction = abs_bits & _FRACTION
    subnormal = biased == 0
    shift = jnp.where(subnormal, lax.clz(fraction).astype(jnp.int32) - 8, 0)
    significand = jnp.where(subnormal, fraction << shift.astype(jnp.uint32), fraction | _HIDDEN)
    exponent = jnp.where(subnormal, -126 - shift, biased - 127)
    return significand, exponent


def _as_unit_interval(significand):
    """M·2^-23 in [1, 2) as float32 (exact, built from bits)."""
    return lax.bitcast_convert_type((significand & _FRACTION) | _ONE_EXPONENT, jnp.float32)


def _floor_divide_small(residual, divisor, divisor_inverse):
    """(c, rem) with residual = c·divisor + rem, 0 <= rem < divisor, for |residual / divisor| < 128.

    residual: uint32 holding an int32 modulo 2^32; divisor: uint32 in [2^23, 2^24); divisor_inverse:
    about 2^23/divisor (float32, relative error < 2^-10 is plenty). c is estimated with a multiply,
    off by at most one, and then corrected exactly in integers (an integer divide would split XLA's
    fusion just like a float one).
    """
    signed = lax.bitcast_convert_type(residual, jnp.int32)
    estimate = jnp.floor(signed.astype(jnp.float32) * np.float32(2.0**-23) * divisor_inverse).astype(jnp.int32)
    remainder = lax.bitcast_convert_type(residual - estimate.astype(jnp.uint32) * divisor, jnp.int32)
    below, above = remainder < 0, remainder >= divisor.astype(jnp.int32)
    correction = estimate - below.astype(jnp.int32) + above.astype(jnp.int32)
    step = jnp.where(below, divisor, 0).astype(jnp.int32) - jnp.where(above, divisor, 0).astype(jnp.int32)
    remainder = remainder + step
    return correction, remainder


def _assemble(n, k, above):
    """float32 bits of n · 2^k (n uint32 in [2^23, 2^24]), rounded to nearest even if subnormal;
    `above` (int32 -1, 0, +1) is the sign of (exact quotient - n), which breaks apparent ties."""
    carry = n == (_HIDDEN << 1)
    n = jnp.where(carry, _HIDDEN, n)
    biased = k + jnp.where(carry, 151, 150)  # value = (n / 2^23) · 2^(biased - 127)
    normal_bits = (jnp.clip(biased, 1, 254).astype(jnp.uint32) << 23) | (n & _FRACTION)

    shift = jnp.clip(1 - biased, 1, 26).astype(jnp.uint32)
    kept = n >> shift
    dropped = n & ((np.uint32(1) << shift) - np.uint32(1))
    half = np.uint32(1) << (shift - np.uint32(1))
    odd = (kept & np.uint32(1)) == 1
    round_up = (dropped > half) | ((dropped == half) & ((above > 0) | ((above == 0) & odd)))
    subnormal_bits = kept + round_up.astype(jnp.uint32)

    bits = jnp.where(biased >= 1, normal_bits, subnormal_bits)
    return jnp.where(biased >= 255, _INF, bits)


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
    a_bits = lax.bitcast_convert_type(a, jnp.uint32)
    b_bits = lax.bitcast_convert_type(b, jnp.uint32)
    sign = (a_bits ^ b_bits) & _SIGN
    a_abs, b_abs = a_bits & _ABS, b_bits & _ABS

    a_significand, a_exponent = _significand_and_exponent(a_abs)
    b_significand, b_exponent = _significand_and_exponent(b_abs)
    smaller = a_significand < b_significand
    s = jnp.where(smaller, 24, 23).astype(jnp.uint32)
    k = a_exponent - b_exponent - s.astype(jnp.int32)

    guess = _approximate_divide(_as_unit_interval(a_significand), _as_unit_interval(b_significand))
    guess = jnp.where(smaller, guess * np.float32(2.0**24), guess * np.float32(2.0**23))
    guess = jnp.nan_to_num(jnp.round(guess), nan=2.0**23)
    q = jnp.clip(guess, 2.0**22, 2.0**25).astype(jnp.int32).astype(jnp.uint32)

    # Exact residual modulo 2^32 (uint32 wraps), exact as an int32 because |R| < 2^31.
    residual = (a_significand << s) - q * b_significand
    divisor_inverse = _reciprocal_estimate(_as_unit_interval(b_significand))
    correction, remainder = _floor_divide_small(residual, b_significand, divisor_inverse)
    n = (q.astype(jnp.int32) + correction).astype(jnp.uint32)
    twice = 2 * remainder
    divisor = b_significand.astype(jnp.int32)
    up = (twice > divisor) | ((twice == divisor) & ((n & np.uint32(1)) == 1))
    n = n + up.astype(jnp.uint32)
    above = jnp.where(up, -1, jnp.where(remainder > 0, 1, 0)).astype(jnp.int32)
    finite_bits = _assemble(n, k, above)

    a_nan, b_nan = a_abs > _INF, b_abs > _INF
    a_inf, b_inf = a_abs == _INF, b_abs == _INF
    a_zero, b_zero = a_abs == 0, b_abs == 0
    nan = a_nan | b_nan | (a_zero & b_zero) | (a_inf & b_inf)
    infinite = a_inf | b_zero
    zero = a_zero | b_inf
    magnitude = jnp.where(infinite, _INF, jnp.where(zero, np.uint32(0), finite_bits))
    bits = jnp.where(nan, _NAN, magnitude | sign)
    return lax.bitcast_convert_type(bits, jnp.float32)


def reciprocal_correctly_rounded(b):
    """fp32(1 / b), correctly rounded on every platform."""
    return divide_correctly_rounded(np.float32(1.0), b)
