"""Runs in a subprocess with 8 fake CPU devices (tests/train/test_collectives.py): compiles a program whose
collectives are written out by hand (shard_map) and prints, as one JSON line, what
fp4lm.train.collectives counts in it."""

from __future__ import annotations

import json
from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from fp4lm.train.collectives import collective_volume


def program():
    """Per device: a psum of f32[16,32] over 8; an all-gather of f32[8,16] over the 4 of `a`; a psum_scatter
    of f32[64] over 8; an all_to_all of f32[8,4] over 8; a ppermute of f32[10]; and in a scan of 5 steps a psum
    of f32[4] over the 2 of `b`."""
    mesh = jax.make_mesh((4, 2), ("a", "b"), axis_types=(AxisType.Explicit,) * 2)
    everything = P(("a", "b"))

    @partial(jax.shard_map, mesh=mesh, in_specs=(everything,) * 6, out_specs=(everything,) * 6, check_vma=False)
    def step(x, g, s, t, p, c):
        x = jax.lax.psum(x, ("a", "b"))
        g = jax.lax.all_gather(g, "a", tiled=True)[:8]
        s = jax.lax.psum_scatter(s, ("a", "b"), tiled=True)
        t = jax.lax.all_to_all(t, ("a", "b"), 0, 0, tiled=True)
        p = jax.lax.ppermute(p, ("a", "b"), [(i, (i + 1) % 8) for i in range(8)])

        def body(carry, _):
            return jax.lax.psum(carry * 1.5, "b"), None

        c, _ = jax.lax.scan(body, c, None, length=5)
        return x, g, s, t, p, c

    shapes = [((16, 32), jnp.float32), ((8, 16), jnp.float32), ((64,), jnp.float32), ((8, 4), jnp.float32)]
    shapes += [((10,), jnp.float32), ((4,), jnp.float32)]
    args = [
        jax.ShapeDtypeStruct((8 * shape[0], *shape[1:]), dtype, sharding=NamedSharding(mesh, everything))
        for shape, dtype in shapes
    ]
    return jax.jit(step).lower(*args).compile().as_text()


if __name__ == "__main__":
    assert jax.device_count() == 8, jax.devices()
    print(json.dumps(collective_volume(program(), 8).as_dict()))
