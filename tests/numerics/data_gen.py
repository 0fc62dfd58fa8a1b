"""Random test tensors for the property tests: several distributions over a wide range of magnitudes."""

import numpy as np

DISTRIBUTIONS = ("normal", "heavy_tailed", "outliers", "zeros", "sparse", "uniform_positive", "constant_blocks")
TINY = np.finfo(np.float32).tiny


def make_tensor(shape, distribution, log10_scale, seed):
    """float32 array of `shape`; float32 subnormals are flushed to zero (outside the bit-exact contract)."""
    rng = np.random.default_rng(seed)
    if distribution == "normal":
        x = rng.standard_normal(shape)
    elif distribution == "heavy_tailed":
        x = rng.standard_t(2, shape)
    elif distribution == "outliers":
        x = rng.standard_normal(shape)
        mask = rng.random(shape) < 0.01
        x[mask] *= 10.0 ** rng.uniform(1, 5, mask.sum())
    elif distribution == "zeros":
        x = np.zeros(shape)
    elif distribution == "sparse":
        x = rng.standard_normal(shape) * (rng.random(shape) < 0.05)
    elif distribution == "uniform_positive":
        x = rng.uniform(0, 1, shape)
    else:  # whole 16-blocks of a repeated value, including exact E2M1 ties
        x = np.repeat(rng.choice([0.25, 0.75, 1.25, 2.5, 5.0, -3.5, 6.0], shape[:-1] + (shape[-1] // 16,)), 16, -1)
        x = x * (1 + (rng.random(shape) < 0.1))
    x = (x * 10.0**log10_scale).astype(np.float32)
    x[np.abs(x) < TINY] = 0.0
    return x
