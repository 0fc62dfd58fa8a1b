"""The reference a grouped GEMM must equal bit for bit: the dense quantized dot run once per expert.

Used by bench/grouped_dot.py (its baseline) and tests/quant/test_grouped_dot.py (the bit-exactness test), so
the benchmark times exactly the loop the test proves equal. It lives with the benchmarks, which import nothing
from tests/."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fp4lm.quant import dot_general
from fp4lm.quant.grouped import token_multiple
from fp4lm.quant.recipes import get_recipe

LINEAR_DIMS = (((1,), (0,)), ((), ()))  # x [tokens, d_in] @ w [d_in, d_out]


def per_expert_loop(recipe: str, x, w, dy, group_sizes: tuple[int, ...], key, weight_amax=None):
    """(y, dx, dw) from the dense quantized dot on each expert's tokens, padded with zero rows to the
    grouped path's multiple; expert e rounds with key fold_in(key, e) (and its weight takes the global
    scale of weight_amax[e], when given); an empty expert's dw is zero.
    `group_sizes` is static (a tuple): jit it with `recipe` and `group_sizes` as static arguments."""
    dot = dot_general(recipe, backend="emulated")
    multiple = token_multiple(get_recipe(recipe))
    ys, dxs, dws, start = [], [], [], 0
    for expert, size in enumerate(group_sizes):
        if size == 0:
            dws.append(jnp.zeros_like(w[expert]))
            continue
        pad = -size % multiple
        x_e = jnp.pad(x[start : start + size], ((0, pad), (0, 0)))
        dy_e = jnp.pad(dy[start : start + size], ((0, pad), (0, 0)))
        key_e = jax.random.fold_in(key, expert)
        amax_e = None if weight_amax is None else weight_amax[expert]

        def product(a, b, key_e=key_e, amax_e=amax_e):
            return dot(a, b, LINEAR_DIMS, key=key_e, weight_amax=amax_e)

        y_e, vjp = jax.vjp(product, x_e, w[expert])
        dx_e, dw_e = vjp(dy_e)
        ys.append(y_e[:size])
        dxs.append(dx_e[:size])
        dws.append(dw_e)
        start += size
    return jnp.concatenate(ys), jnp.concatenate(dxs), jnp.stack(dws)
