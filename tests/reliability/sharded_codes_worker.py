"""Run in a subprocess with 8 fake CPU devices (XLA_FLAGS set before jax is imported): quantize the same
tensors unsharded and under several shardings, and print, as JSON, per case whether every code, scale byte
and amax came out bit-identical. Some shardings cut 16x16 tiles or 16-element blocks across devices."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from fp4lm import numerics

FORMATS = {
    "nvfp4_1x16": lambda x: numerics.quantize(x, "nvfp4"),
    "nvfp4_16x16": lambda x: numerics.quantize(x, "nvfp4", block=(16, 16)),
    "nvfp4_rht_sr": lambda x: numerics.quantize(
        x, "nvfp4", rounding="stochastic", key=jax.random.key(7), hadamard=True
    ),
    "mxfp4": lambda x: numerics.quantize(x, "mxfp4"),
}


def activations() -> jax.Array:
    """Heavy-tailed float32 values with outlier channels, as activations have: [batch 4, tokens 32, 128]."""
    x = jax.random.t(jax.random.key(2025), 3.0, (4, 32, 128), jnp.float32)
    return x * jnp.geomspace(0.01, 50.0, 128)


def parts(q) -> dict[str, np.ndarray]:
    out = {"codes": np.asarray(q.codes()), "scales": np.asarray(q.scale_bytes())}
    if hasattr(q, "amax"):
        out["amax"] = np.asarray(q.amax).reshape(-1).view(np.uint32)
    return out


def compare(quantize, x, sharding) -> dict:
    compiled = jax.jit(quantize)
    sharded_x = jax.device_put(x, sharding)
    expected, got = parts(compiled(x)), parts(compiled(sharded_x))
    return {
        "devices": len(sharded_x.sharding.device_set),
        "differs": [k for k in expected if not np.array_equal(expected[k], got[k])],
    }


def main() -> None:
    assert jax.device_count() == 8, jax.devices()
    devices = np.asarray(jax.devices())
    line, grid = Mesh(devices, ("d",)), Mesh(devices.reshape(2, 4), ("a", "b"))
    shardings = {
        "tokens_over_8": NamedSharding(line, P(None, "d", None)),  # 4 rows each: 16x16 tiles cut across devices
        "features_over_8": NamedSharding(line, P(None, None, "d")),  # 16 features each: whole blocks
        "batch_2_features_4": NamedSharding(grid, P("a", None, "b")),
    }
    x = activations()
    results = {}
    for format_name, quantize in FORMATS.items():
        for sharding_name, sharding in shardings.items():
            results[f"{format_name}/{sharding_name}"] = compare(quantize, x, sharding)
    # 64 features over 8 devices: each device holds half of every 16-element block.
    half_blocks = NamedSharding(line, P(None, None, "d"))
    for format_name, quantize in FORMATS.items():
        results[f"{format_name}/half_blocks_per_device"] = compare(quantize, x[..., :64], half_blocks)
    # Weights in bfloat16 with 16x16 tiles, sharded FSDP x tensor style.
    weights = x.reshape(128, 128)[:64].astype(jnp.bfloat16)
    results["nvfp4_16x16_bf16_weights/grid_2x4"] = compare(
        FORMATS["nvfp4_16x16"], weights, NamedSharding(grid, P("a", "b"))
    )
    print("RESULTS " + json.dumps(results))


if __name__ == "__main__":
    main()
