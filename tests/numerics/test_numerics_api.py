"""The `fp4lm.numerics.quantize` dispatch, its errors, and the import boundary of fp4lm/numerics."""

import ast
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4lm.numerics as numerics
from fp4lm.numerics import FP8Array, MXArray, NVFP4Array

NUMERICS_DIR = pathlib.Path(numerics.__file__).parent
ALLOWED_TOP_LEVEL = {"jax", "numpy", "ml_dtypes"} | set(sys.stdlib_module_names)


def _imported_modules(path):
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: use absolute imports"
            yield node.module


def test_numerics_imports_only_jax_numpy_ml_dtypes_and_stdlib():
    files = sorted(NUMERICS_DIR.glob("*.py"))
    assert {f.name for f in files} >= {"__init__.py", "formats.py", "nvfp4.py", "rounding.py", "hadamard.py"}
    for path in files:
        for module in _imported_modules(path):
            top = module.split(".")[0]
            inside = module == "fp4lm.numerics" or module.startswith("fp4lm.numerics.")
            assert top in ALLOWED_TOP_LEVEL or inside, f"{path.name} imports {module}"


X = jax.random.normal(jax.random.key(0), (2, 16, 64), jnp.float32).astype(jnp.bfloat16)


FORMAT_TYPES = [
    ("nvfp4", NVFP4Array),
    ("mxfp4", MXArray),
    ("mxfp8", MXArray),
    ("fp8_e4m3", FP8Array),
    ("fp8_e5m2", FP8Array),
]


@pytest.mark.parametrize("fmt,kind", FORMAT_TYPES)
def test_every_format_round_trips_as_a_pytree(fmt, kind):
    @jax.jit
    def round_trip(a):
        q = numerics.quantize(a, fmt)
        leaves, treedef = jax.tree_util.tree_flatten(q)
        return jax.tree_util.tree_unflatten(treedef, leaves).dequantize(jnp.bfloat16)

    q = jax.eval_shape(lambda a: numerics.quantize(a, fmt), X)
    assert isinstance(q, kind) and q.shape == X.shape
    dq = round_trip(X)
    assert dq.dtype == jnp.bfloat16 and dq.shape == X.shape
    xf = X.astype(jnp.float32)
    assert float(jnp.sqrt(jnp.mean((dq.astype(jnp.float32) - xf) ** 2))) < 0.15 * float(jnp.sqrt(jnp.mean(xf**2)))


def test_dispatch_forwards_nvfp4_options():
    options = dict(block=(16, 16), rounding="stochastic", hadamard=True)

    @jax.jit
    def both(a, key):
        return numerics.nvfp4.quantize(a, key=key, **options), numerics.quantize(a, "nvfp4", key=key, **options)

    direct, routed = both(X, jax.random.key(1))
    np.testing.assert_array_equal(np.asarray(direct.packed), np.asarray(routed.packed))
    assert routed.block == (16, 16) and routed.hadamard


def test_hadamard_applies_to_the_other_formats():
    formats = ("mxfp4", "mxfp8", "fp8_e4m3")

    @jax.jit
    def routed_and_direct(a):
        routed = [numerics.quantize(a, f, hadamard=True).dequantize() for f in formats]
        return routed, [numerics.quantize(numerics.rht(a), f).dequantize() for f in formats]

    for routed, direct in zip(*routed_and_direct(X), strict=True):
        np.testing.assert_array_equal(np.asarray(routed), np.asarray(direct))


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: numerics.quantize(jnp.ones((3, 20)), "nvfp4"), r"\(3, 20\).*\(1, 16\)"),
        (lambda: numerics.quantize(jnp.ones((20, 32)), "nvfp4", block=(16, 16)), r"\(20, 32\).*\(16, 16\)"),
        (lambda: numerics.quantize(jnp.ones((16,)), "nvfp4", block=(16, 16)), r"\(16,\)"),
        (lambda: numerics.quantize(jnp.ones((4, 32)), "nvfp4", block=(1, 32)), "block"),
        (lambda: numerics.quantize(jnp.ones((4, 48)), "mxfp4"), r"\(4, 48\).*\(1, 32\)"),
        (lambda: numerics.quantize(jnp.ones((4, 32)), "mxfp8", block=(16, 16)), "block"),
        (lambda: numerics.quantize(jnp.ones((4, 32)), "nvfp4", rounding="stochastic"), "key"),
        (lambda: numerics.quantize(jnp.ones((4, 32)), "mxfp8", rounding="stochastic", key=jax.random.key(0)), "only"),
        (lambda: numerics.quantize(jnp.ones((4, 32)), "int4"), "unknown"),
        (lambda: numerics.quantize(jnp.ones((4, 32), jnp.int32), "nvfp4"), "floating"),
    ],
)
def test_user_errors_are_value_errors_naming_the_problem(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_mx_formats_accept_their_own_block_and_the_shared_default():
    a = jax.jit(lambda x: numerics.quantize(x, "mxfp4", block=(1, 32)).data)(X)
    b = jax.jit(lambda x: numerics.quantize(x, "mxfp4").data)(X)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
