"""A quantized ``lax.dot_general``: the three GEMMs of a linear layer, each operand quantized per the recipe.

A linear layer computes ``Y = X·Wᵀ`` with activations X ``[M tokens, K]`` and weights W ``[N, K]``
(``nnx.Linear`` stores the kernel as ``Wᵀ = [K, N]``; the math is the same). Training runs three GEMMs,
and every operand is quantized *along the contraction axis of the GEMM that consumes it*:

==========  =================  ======================  ============================================
GEMM        product            contracts over          operands as the NVFP4 recipe quantizes them
==========  =================  ======================  ============================================
fprop       ``Y  = X · Wᵀ``    K (features in)         X: 1x16 RNE;  W: 16x16 tiles RNE
dgrad       ``dX = dY · W``    N (features out)        dY: 1x16 stochastic;  W: the fprop tiles, transposed
wgrad       ``dW = dYᵀ · X``   M (tokens)              dYᵀ: RHT + 1x16 stochastic;  Xᵀ: RHT + 1x16 RNE
==========  =================  ======================  ============================================

- A *columnwise* copy (Xᵀ, dYᵀ, and Wᵀ for 1-D weights) is quantized again from the high-precision
  tensor, with its own amax and blocks along the other axis: FP4 data is never transposed. The exception
  is a 16x16-tiled weight, whose codes and tile scales transpose exactly.
- The random Hadamard transform (16-point, along the token axis) spreads outliers before the wgrad
  quantization; it cancels inside the product, ``(dYᵀH)(XᵀH)ᵀ = dYᵀX``.
- Stochastic rounding on gradients makes ``E[Q(dY)] = dY``, so gradient errors average out over steps.
  Each of the six operand slots draws from ``fold_in(key, slot index)`` (see `operand_keys`), so the dgrad
  and wgrad copies of dY use independent bits. ``key`` is the per-call key. There is no fixed fallback:
  drawing stochastic bits without a key is a ValueError (for nvfp4 only differentiation draws them, so
  a forward pass needs no key). `QuantizedDotModule` (``dot_general(recipe, rngs=...)``) owns an
  ``nnx.Rngs`` stream and draws a fresh key on every call.
- Products accumulate in float32; the output is in the inputs' dtype (or ``preferred_element_type``)
  and the cotangents in the primals' dtypes. A quantized dY is taken in the inputs' dtype (bf16 in
  training, as in TransformerEngine) even when the output was requested in float32. ``precision`` only
  matters for the bf16 recipe: quantized operands are exact in bf16 and unquantized float32 operands
  are multiplied at HIGHEST precision.
- What the forward pass saves for the backward are the quantized copies (packed codes + block scales +
  amax: 4.5 bits per value), not a bf16 copy of X; they carry the checkpoint name
  `QUANTIZED_RESIDUAL_NAME` for remat policies.
- Sizes must be multiples of the blocks along every quantized operand's axes (16; 32 for MX; 16x16 tiles
  need N and K; `Recipe.check_gemm_shapes`): a `UserError` names the layer and the shapes. The token
  count M only has to divide when differentiating (wgrad contracts over it), so a sampler can decode one
  token at a time.

General dimension numbers work: batch dimensions stay batch dimensions, several contracting dimensions
are flattened into one K, and the token axis M is made of all non-contracting lhs axes. The lhs must be
the activations and the rhs the kernel (as in ``nnx.Linear``; with ``nnx.Einsum`` keep the output's
activation axes before the kernel's, or jnp.einsum swaps the operands). The formats: docs/numerics.md.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import overload

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec

from fp4lm import numerics
from fp4lm.errors import UserError
from fp4lm.numerics.nvfp4 import NVFP4Array
from fp4lm.quant import gemm
from fp4lm.quant.recipes import BACKWARD_SLOTS, FORWARD_SLOTS, SLOTS, QuantSpec, Recipe, get_recipe
from fp4lm.quant.weight_gather import WeightGather

SR_STREAM = "stochastic_rounding"
"""The ``nnx.Rngs`` stream `QuantizedDotModule` draws from (``nnx.Rngs`` falls back to ``default``)."""
QUANTIZED_RESIDUAL_NAME = "fp4lm_quantized"
"""The ``checkpoint_name`` of the copies saved for the backward pass: a remat policy
``save_only_these_names(QUANTIZED_RESIDUAL_NAME)`` keeps them (4.5 bits per value) and recomputes the rest."""
UNQUANTIZED_OPERAND_NAME = "fp4lm_unquantized_operand"
"""The ``checkpoint_name`` of the operands of an unquantized (bf16 recipe) matmul, which its backward pass
needs as they are: saving both names keeps every linear layer's operands in the precision its recipe keeps."""


def operand_keys(key: jax.Array | None) -> dict[str, jax.Array | None]:
    """The PRNG key of each operand slot: ``fold_in(key, index of the slot in SLOTS)`` (None without a key)."""
    return {slot: None if key is None else jax.random.fold_in(key, i) for i, slot in enumerate(SLOTS)}


def quantize_operand(x: jax.Array, spec: QuantSpec | None, key: jax.Array | None, tensor_amax=None):
    """Quantize a GEMM operand ``[..., K]`` along its last axis; ``None`` keeps it as it is.

    ``tensor_amax``: the amax of an NVFP4 operand's global scale when it is shared (`weight_amax`)."""
    if spec is None:
        return x
    if spec.format == "identity":
        return numerics.rht(x) if spec.hadamard else x
    return numerics.quantize(
        x,
        spec.format,
        block=spec.block,
        rounding=spec.rounding,
        key=key if spec.stochastic else None,
        hadamard=spec.hadamard,
        tensor_amax=tensor_amax,
        nvfp4_options=spec.nvfp4_options,
    )


def shared_amax_for(spec: QuantSpec | None, amax):
    """``amax`` where an operand quantized by ``spec`` can take a shared amax, else None: NVFP4 without the RHT
    (whose amax is that of the transformed values) and without row scaling (one amax per row, its own), the
    only format here with a per-tensor scale from the amax."""
    shareable = spec is not None and spec.format == "nvfp4" and not spec.hadamard and not spec.row_scaled
    return amax if shareable else None


def gemm_operand(q):
    """What a GEMM backend consumes: a plain array stays, a quantized array becomes a ScaledOperand."""
    return q if isinstance(q, jax.Array) else gemm.scaled_operand(q)


def gemm_input(x: jax.Array, spec: QuantSpec | None, key: jax.Array | None, backend: str, tensor_amax=None):
    """The GEMM operand for ``x`` when no quantized copy of it is kept (it feeds this one GEMM only).

    On the emulated backend an NVFP4 operand is quantized straight into ``e2m1 · s_b`` values
    (`gemm.nvfp4_block_scaled_operand`: no codes, packing or table lookup; the same bits); otherwise, and
    for the native backend, which needs packed FP4 data, it is quantized to an array and viewed as usual.
    """
    if backend == "emulated" and spec is not None and spec.format == "nvfp4":
        stochastic_key = key if spec.stochastic else None
        return gemm.nvfp4_block_scaled_operand(
            x,
            block=spec.block,
            rounding=spec.rounding,
            key=stochastic_key,
            hadamard=spec.hadamard,
            tensor_amax=tensor_amax,
            options=spec.nvfp4_options,
        )
    return gemm_operand(quantize_operand(x, spec, key, tensor_amax))


def _transpose_operand(op):
    if isinstance(op, gemm.ScaledOperand):
        return op.transpose_rows_and_k()
    return jnp.swapaxes(op, 1, 2)


def _transposes_exactly(spec: QuantSpec | None) -> bool:
    """Whether quantizing the transpose equals transposing the quantized copy."""
    if spec is None:
        return True
    if spec.hadamard:
        return False
    if spec.format in ("identity", "fp8_e4m3", "fp8_e5m2"):
        return True  # no blocks, or one per-tensor scale
    # 4over6 sums a tile's errors row by row, so the transposed tile may choose the other candidate.
    return spec.format == "nvfp4" and spec.block == (16, 16) and spec.four_over_six is None


def reuses_transposed(fprop: QuantSpec | None, backward: QuantSpec | None) -> bool:
    """Whether a backward GEMM reads the forward's quantized copy transposed instead of quantizing again: the
    same spec, and one whose transpose is exact (a 16x16-tiled NVFP4 weight, FP8, nothing)."""
    return fprop == backward and _transposes_exactly(fprop)


def residual_name(recipe: Recipe) -> str:
    """The ``checkpoint_name`` of what a GEMM under ``recipe`` saves for its backward pass: the quantized
    copies, or the operands themselves when the recipe quantizes nothing."""
    return QUANTIZED_RESIDUAL_NAME if recipe.is_quantized else UNQUANTIZED_OPERAND_NAME


def require_key(recipe: Recipe, slots: tuple[str, ...], *, has_key: bool, where: str, hint: str = "") -> None:
    """A UserError when ``slots`` round stochastically and no key was given (no silent fixed bits)."""
    stochastic = [slot for slot in slots if recipe.is_stochastic((slot,))]
    if stochastic and not has_key:
        raise UserError(
            f"{where}: recipe {recipe.name!r} rounds {', '.join(stochastic)} stochastically, but no random key was "
            f"given, so every call would reuse the same bits; pass key= (a fresh key per step) on each call{hint}"
        )


def gradient_operand(g, spec: QuantSpec | None, compute_dtype):
    """dY as the quantizer sees it: in the inputs' dtype (bf16 in training, as TE's gradients are), even
    when the output was requested in float32; unquantized gradients keep their precision."""
    if spec is None or spec.format == "identity":
        return g
    return g.astype(compute_dtype)


@dataclass(frozen=True)
class _Layout:
    """Maps lhs/rhs of any dimension numbers to canonical ``[B, M, K]`` / ``[B, N, K]`` and back."""

    lhs_perm: tuple[int, ...]
    rhs_perm: tuple[int, ...]
    batch_shape: tuple[int, ...]
    lhs_free_shape: tuple[int, ...]
    rhs_free_shape: tuple[int, ...]
    lhs_contract_shape: tuple[int, ...]
    rhs_contract_shape: tuple[int, ...]

    @classmethod
    def of(cls, lhs_shape, rhs_shape, dimension_numbers) -> _Layout:
        (lhs_c, rhs_c), (lhs_b, rhs_b) = dimension_numbers
        lhs_c, rhs_c, lhs_b, rhs_b = (tuple(int(d) for d in ds) for ds in (lhs_c, rhs_c, lhs_b, rhs_b))
        lhs_free = tuple(d for d in range(len(lhs_shape)) if d not in lhs_c + lhs_b)
        rhs_free = tuple(d for d in range(len(rhs_shape)) if d not in rhs_c + rhs_b)
        return cls(
            lhs_perm=lhs_b + lhs_free + lhs_c,
            rhs_perm=rhs_b + rhs_free + rhs_c,
            batch_shape=tuple(lhs_shape[d] for d in lhs_b),
            lhs_free_shape=tuple(lhs_shape[d] for d in lhs_free),
            rhs_free_shape=tuple(rhs_shape[d] for d in rhs_free),
            lhs_contract_shape=tuple(lhs_shape[d] for d in lhs_c),
            rhs_contract_shape=tuple(rhs_shape[d] for d in rhs_c),
        )

    @property
    def bmnk(self) -> tuple[int, int, int, int]:
        return (
            math.prod(self.batch_shape),
            math.prod(self.lhs_free_shape),
            math.prod(self.rhs_free_shape),
            math.prod(self.lhs_contract_shape),
        )

    def lhs3(self, lhs):
        b, m, _, k = self.bmnk
        return jnp.transpose(lhs, self.lhs_perm).reshape(b, m, k)

    def rhs3(self, rhs):
        b, _, n, k = self.bmnk
        return jnp.transpose(rhs, self.rhs_perm).reshape(b, n, k)

    def out(self, y3):
        return y3.reshape(self.batch_shape + self.lhs_free_shape + self.rhs_free_shape)

    def out3(self, y):
        b, m, n, _ = self.bmnk
        return y.reshape(b, m, n)

    def rhs3_gather(self, gather: WeightGather, ndim: int) -> WeightGather:
        """`gather`'s specs of the rhs as specs of the canonical [B, N, K] weight; a canonical axis made of
        several rhs axes cannot keep a sharded one (ValueError)."""
        b, n, k = (len(self.batch_shape), len(self.rhs_free_shape), len(self.rhs_contract_shape))
        permuted = gather.permuted(self.rhs_perm, ndim)
        canonical = []
        for spec in (permuted.sharded, permuted.gathered):
            groups = (spec[:b], spec[b : b + n], spec[b + n : b + n + k])
            if any(len([e for e in group if e is not None]) > 1 for group in groups):
                raise ValueError(f"weight spec {spec}: more than one sharded axis folds into one GEMM axis")
            canonical.append(PartitionSpec(*(next((e for e in g if e is not None), None) for g in groups)))
        return WeightGather(*canonical)

    def lhs_back(self, dx3):
        dx = dx3.reshape(self.batch_shape + self.lhs_free_shape + self.lhs_contract_shape)
        return jnp.transpose(dx, _inverse(self.lhs_perm))

    def rhs_back(self, dw3):
        dw = dw3.reshape(self.batch_shape + self.rhs_free_shape + self.rhs_contract_shape)
        return jnp.transpose(dw, _inverse(self.rhs_perm))


def _inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    inverse = [0] * len(perm)
    for position, axis in enumerate(perm):
        inverse[axis] = position
    return tuple(inverse)


@dataclass(frozen=True)
class _Static:
    """Everything the custom VJP needs that is not an array (hashable: a nondiff argument)."""

    recipe: Recipe
    backend: str
    layout: _Layout
    out_dtype: jnp.dtype
    lhs_dtype: jnp.dtype
    rhs_dtype: jnp.dtype
    compute_dtype: jnp.dtype  # the inputs' common dtype: quantized gradients are taken in it (bf16)
    name: str | None  # the layer path, for errors
    shapes: tuple[tuple[int, ...], tuple[int, ...]]  # lhs and rhs shapes, for errors
    weight_gather: WeightGather | None = None  # of the canonical [B, N, K] weight (fp4lm.quant.weight_gather)

    def check(self, slots: tuple[str, ...], *, has_key: bool) -> None:
        """The recipe's shape rule for ``slots``, then: stochastic slots need a key (no silent fixed bits)."""
        _, m, n, k = self.layout.bmnk
        lhs_shape, rhs_shape = self.shapes
        where = f"layer {self.name!r}" if self.name else "quantized dot_general"
        self.recipe.check_gemm_shapes(
            m=m, n=n, k=k, slots=slots, where=f"{where} (lhs shape {lhs_shape}, rhs shape {rhs_shape})"
        )
        require_key(
            self.recipe,
            slots,
            has_key=has_key,
            where=where,
            hint=", or build it with dot_general(recipe, rngs=nnx.Rngs(...)), which draws a new key per call",
        )


def _swap(x3):
    return jnp.swapaxes(x3, 1, 2)


def _swapped_for(x3, spec: QuantSpec | None):
    """``x3`` ``[B, M, K]`` as the ``[B, K, M]`` operand of a slot whose blocks run along M (wgrad's), and the
    spec to quantize it with. A Hadamard spec's RHT runs along M before the swap, over whole contiguous rows
    (`numerics.rht`'s ``axis``), and the spec handed on skips it: the same bits as transforming the swapped
    array, without a butterfly that reads every element a row apart."""
    if spec is None or not spec.hadamard:
        return _swap(x3), spec
    return _swap(numerics.rht(x3, axis=1)), replace(spec, hadamard=False)


def _forward(st: _Static, lhs, rhs, key, weight_amax, *, save: bool):
    """The fprop GEMM, and with ``save`` the quantized copies the backward pass reads.

    A forward operand whose quantized copy is saved for the backward (the reused 16x16 weight tiles) is
    quantized to an array once and used for both; every other operand feeds the fprop GEMM only and goes
    through `gemm_input`. What is saved is the same either way: packed arrays, never the bf16 values.
    ``weight_amax`` (None: the weight's own) is the amax of the weight's NVFP4 copies (W and Wᵀ).
    """
    recipe, keys = st.recipe, operand_keys(key)
    x3, w3 = st.layout.lhs3(lhs), st.layout.rhs3(rhs)
    fprop_w_amax = shared_amax_for(recipe.fprop_w, weight_amax)
    dequantized = recipe.backward_override == "dequantized"  # the backward reads the forward's copies
    gather_w = st.weight_gather is not None  # quantized on the shards, so kept as an array (even unsaved)
    reuse_w = (save or gather_w) and (dequantized or reuses_transposed(recipe.fprop_w, recipe.dgrad_w))
    reuse_x = save and (dequantized or reuses_transposed(recipe.fprop_x, recipe.wgrad_x))
    qx = quantize_operand(x3, recipe.fprop_x, keys["fprop_x"]) if reuse_x else None
    qw = quantize_operand(w3, recipe.fprop_w, keys["fprop_w"], fprop_w_amax) if reuse_w else None
    if gather_w:  # quantized where the shards live; the backward gathers the saved shards again
        assert st.weight_gather is not None and isinstance(qw, NVFP4Array), "checked by QuantizedDotGeneral"
        qw = st.weight_gather.on_shards(qw)
    x_op = gemm_operand(qx) if reuse_x else gemm_input(x3, recipe.fprop_x, keys["fprop_x"], st.backend)
    if reuse_w:
        w_op = gemm_operand(_gathered(qw, st))
    else:
        w_op = gemm_input(w3, recipe.fprop_w, keys["fprop_w"], st.backend, fprop_w_amax)
    y3 = gemm.matmul(x_op, w_op, backend=st.backend)
    y = st.layout.out(y3.astype(st.out_dtype))
    if not save:
        return y, None
    if reuse_w:
        w_saved = qw  # [B, N, K]; transposed in the backward pass
    else:
        w_saved = quantize_operand(  # Wᵀ [B, K, N]: the same elements, so the same (or the shared) amax
            _swap(w3), recipe.dgrad_w, keys["dgrad_w"], shared_amax_for(recipe.dgrad_w, weight_amax)
        )
    if reuse_x:
        x_saved = qx  # [B, M, K]
    else:
        x_saved = quantize_operand(*_swapped_for(x3, recipe.wgrad_x), keys["wgrad_x"])  # Xᵀ [B, K, M]
    return y, (checkpoint_name((w_saved, x_saved), QUANTIZED_RESIDUAL_NAME), key)


def _gathered(qw, st: _Static):
    """The quantized weight as its GEMM reads it: under fp4_param_gather its shards gathered in 4 bits."""
    return qw if st.weight_gather is None else st.weight_gather.gather(qw)


def _saved_operand(saved, reused: bool):
    op = gemm_operand(saved)
    return _transpose_operand(op) if reused else op


def _backward_operand(saved, recipe: Recipe, fprop: QuantSpec | None, backward: QuantSpec | None, st: _Static):
    """The saved copy of W or X as the backward GEMM reads it, transposed: ``[B, K, N]`` or ``[B, K, M]``."""
    if recipe.backward_override == "dequantized":  # the forward's quantized copy, in the compute dtype
        values = saved if isinstance(saved, jax.Array) else saved.dequantize(st.compute_dtype)
        return _swap(values)
    return _saved_operand(saved, reuses_transposed(fprop, backward))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _quantized_dot(st: _Static, lhs, rhs, key, weight_amax):
    return _forward(st, lhs, rhs, key, weight_amax, save=False)[0]


def _quantized_dot_fwd(st: _Static, lhs, rhs, key, weight_amax):
    # Only differentiation needs the backward GEMMs' sizes to divide (e.g. M for wgrad), so a sampler
    # decoding one token at a time can still run the quantized forward pass; likewise only
    # differentiation draws the backward slots' stochastic bits.
    st.check(BACKWARD_SLOTS, has_key=key is not None)
    return _forward(st, lhs, rhs, key, weight_amax, save=True)


def _quantized_dot_bwd(st: _Static, saved, g):
    recipe = st.recipe
    (w_saved, x_saved), key = saved
    keys = operand_keys(key)
    g3 = st.layout.out3(g)
    # dgrad: dX [B, M, K] = dY [B, M, N] · (Wᵀ [B, K, N]), contracting N.
    # The two gradient copies feed one GEMM each, so they go through gemm_input.
    g_op = gemm_input(
        gradient_operand(g3, recipe.dgrad_g, st.compute_dtype), recipe.dgrad_g, keys["dgrad_g"], st.backend
    )
    w_t = _backward_operand(_gathered(w_saved, st), recipe, recipe.fprop_w, recipe.dgrad_w, st)
    dx3 = gemm.matmul(g_op, w_t, backend=st.backend)
    # wgrad: dW [B, N, K] = dYᵀ [B, N, M] · (Xᵀ [B, K, M]), contracting M (tokens).
    g_t_op = gemm_input(
        *_swapped_for(gradient_operand(g3, recipe.wgrad_g, st.compute_dtype), recipe.wgrad_g),
        keys["wgrad_g"],
        st.backend,
    )
    x_t = _backward_operand(x_saved, recipe, recipe.fprop_x, recipe.wgrad_x, st)
    dw3 = gemm.matmul(g_t_op, x_t, backend=st.backend)
    dlhs = st.layout.lhs_back(dx3.astype(st.lhs_dtype))
    drhs = st.layout.rhs_back(dw3.astype(st.rhs_dtype))
    return dlhs, drhs, None, None  # no cotangent for the key or the shared amax (a statistic of the weights)


_quantized_dot.defvjp(_quantized_dot_fwd, _quantized_dot_bwd)


@dataclass(frozen=True)
class QuantizedDotGeneral:
    """A drop-in for ``lax.dot_general`` that quantizes as ``recipe`` says (see the module docstring).

    A frozen value: equal settings give equal (and equally hashed) functions, so Flax graph definitions
    holding it compare equal and jit caches are reused. It holds no randomness: a recipe that rounds
    stochastically needs ``key=`` on every call that draws bits (the trainer folds a per-step key with
    the layer's seed); `QuantizedDotModule` supplies one per call.
    """

    recipe: Recipe
    backend: str = "auto"
    name: str | None = None

    def __call__(
        self,
        lhs,
        rhs,
        dimension_numbers,
        precision=None,
        preferred_element_type=None,
        *,
        key: jax.Array | None = None,
        weight_amax: jax.Array | None = None,
        weight_gather: WeightGather | None = None,
        out_sharding=None,
    ):
        """``weight_amax``: the amax to build the rhs's NVFP4 global scale from instead of its own (at least
        max |rhs|): a fused group of layers (q/k/v) sharing one global scale, as a serving engine runs them.
        ``weight_gather``: the rhs's placement as its shards live and as it is gathered; its NVFP4 tiles are
        then quantized on the shards and gathered in 4 bits (fp4lm.quant.weight_gather), which needs a recipe
        that `shares_weight_tiles` (ValueError otherwise)."""
        if not self.recipe.is_quantized:
            lhs, rhs = checkpoint_name((lhs, rhs), UNQUANTIZED_OPERAND_NAME)  # the identity outside remat
            return lax.dot_general(
                lhs,
                rhs,
                dimension_numbers,
                precision=precision,
                preferred_element_type=preferred_element_type,
                out_sharding=out_sharding,
            )
        lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
        layout = _Layout.of(lhs.shape, rhs.shape, dimension_numbers)
        compute_dtype = jnp.result_type(lhs.dtype, rhs.dtype)
        out_dtype = jnp.dtype(preferred_element_type or compute_dtype)
        if weight_gather is not None:
            if not self.recipe.shares_weight_tiles:
                raise ValueError(
                    f"{self.name or 'quantized dot_general'}: recipe {self.recipe.name!r} has no single 16x16 NVFP4 "
                    "weight copy to gather in 4 bits"
                )
            weight_gather = layout.rhs3_gather(weight_gather, rhs.ndim)
        static = _Static(
            self.recipe,
            gemm.resolve_backend(self.backend),
            layout,
            out_dtype,
            lhs.dtype,
            rhs.dtype,
            compute_dtype,
            self.name,
            (tuple(lhs.shape), tuple(rhs.shape)),
            weight_gather,
        )
        static.check(FORWARD_SLOTS, has_key=key is not None)
        if weight_amax is not None:
            weight_amax = lax.stop_gradient(jnp.asarray(weight_amax, jnp.float32))
        y = _quantized_dot(static, lhs, rhs, key, weight_amax)
        if out_sharding is not None:
            y = jax.sharding.reshard(y, out_sharding)
        return y


class QuantizedDotModule(nnx.Module):
    """A `QuantizedDotGeneral` that owns an ``nnx.Rngs`` stream and draws a fresh key on every call.

    Pass it as ``nnx.Linear(..., dot_general=...)``: it becomes part of the layer's graph, so
    ``nnx.jit`` / ``nnx.grad`` / ``nnx.value_and_grad`` over the layer advance its stream and every step
    rounds with new bits (reproducibly: the same seed gives the same sequence of keys).
    """

    def __init__(self, dot: QuantizedDotGeneral, rngs: nnx.Rngs | nnx.RngStream):
        self.dot = dot
        self.rngs = (rngs[SR_STREAM] if isinstance(rngs, nnx.Rngs) else rngs).fork()

    def __call__(
        self,
        lhs,
        rhs,
        dimension_numbers,
        precision=None,
        preferred_element_type=None,
        *,
        weight_amax=None,
        weight_gather=None,
        out_sharding=None,
    ):
        key = self.rngs() if self.dot.recipe.is_stochastic() else None
        return self.dot(
            lhs,
            rhs,
            dimension_numbers,
            precision,
            preferred_element_type,
            key=key,
            weight_amax=weight_amax,
            weight_gather=weight_gather,
            out_sharding=out_sharding,
        )


@overload
def dot_general(
    recipe: str | Recipe, *, backend: str = "auto", name: str | None = None, rngs: None = None
) -> QuantizedDotGeneral: ...
@overload
def dot_general(
    recipe: str | Recipe, *, backend: str = "auto", name: str | None = None, rngs: nnx.Rngs | nnx.RngStream
) -> QuantizedDotModule: ...
def dot_general(
    recipe: str | Recipe,
    *,
    backend: str = "auto",
    name: str | None = None,
    rngs: nnx.Rngs | nnx.RngStream | None = None,
) -> QuantizedDotGeneral | QuantizedDotModule:
    """``lax.dot_general`` quantized by ``recipe`` (a preset name or a Recipe); pass it as
    ``nnx.Linear(..., dot_general=dot_general(recipe, rngs=nnx.Rngs(0)))``.

    With ``rngs``: a `QuantizedDotModule` that draws each call's stochastic-rounding key from the stream
    ``"stochastic_rounding"`` (else ``"default"``) of ``rngs``. Without: a `QuantizedDotGeneral`, called
    as ``fn(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, *, key=None)``,
    whose stochastic slots need ``key=``. ``backend``: "auto" | "emulated" | "native" (gemm.py).
    ``name``: the layer path, named in errors.
    """
    if backend not in gemm.BACKENDS:
        raise UserError(f"unknown GEMM backend {backend!r}; use one of {', '.join(gemm.BACKENDS)}")
    dot = QuantizedDotGeneral(get_recipe(recipe), backend, name)
    return dot if rngs is None else QuantizedDotModule(dot, rngs)
