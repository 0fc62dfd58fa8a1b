"""Recipes: how each operand of each of the three GEMMs of a linear layer is quantized.

A linear layer ``Y = X Wᵀ`` (X: [M tokens, K], W: [N, K]) runs three GEMMs, and each of their six operands
gets its own `QuantSpec` (``None`` = leave it in the input precision):

=========  ==================  ==========================================
GEMM       operands            contraction (the axis the blocks run along)
=========  ==================  ==========================================
fprop      Y  = X  · Wᵀ        K   (X rowwise, W rowwise)
dgrad      dX = dY · W         N   (dY rowwise, W columnwise = Wᵀ)
wgrad      dW = dYᵀ · X        M   (dY columnwise = dYᵀ, X columnwise = Xᵀ)
=========  ==================  ==========================================

``backward_override`` (TransformerEngine's name) changes what the backward GEMMs read: ``"high_precision"``
runs them on the original bf16 operands, ``"dequantized"`` on the forward's quantized X and W dequantized
to the compute dtype (the exact gradient of the quantized forward); either way dY is not quantized.

Presets live in one registry, `RECIPES`; `get_recipe` resolves a name (or passes a `Recipe` through).
`Recipe.check_gemm_shapes` is the one shape rule: the traced check in dot.py and the static check before
training both use it. The formats and their math: docs/numerics.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass

from fp4lm import numerics
from fp4lm.errors import UserError
from fp4lm.numerics import nvfp4
from fp4lm.numerics.rounding import ROUNDINGS

FORMATS = (*numerics.FORMATS, "identity")
""""identity" keeps the values (in the input dtype) but still applies ``hadamard``; it exists to test and
ablate the random Hadamard transform on its own."""

SLOTS = ("fprop_x", "fprop_w", "dgrad_g", "dgrad_w", "wgrad_g", "wgrad_x")
"""The six operand slots of a linear layer's three GEMMs, in the order the PRNG keys are folded (dot.py)."""
FORWARD_SLOTS, BACKWARD_SLOTS = SLOTS[:2], SLOTS[2:]
BACKWARD_OVERRIDES = (None, "high_precision", "dequantized")

# slot -> (GEMM, rows axis, contraction axis), for a layer with M tokens, N output and K input features.
_GEMM_AXES = {
    "fprop_x": ("fprop", "M", "K"),
    "fprop_w": ("fprop", "N", "K"),
    "dgrad_g": ("dgrad", "M", "N"),
    "dgrad_w": ("dgrad", "K", "N"),
    "wgrad_g": ("wgrad", "N", "M"),
    "wgrad_x": ("wgrad", "K", "M"),
}
_AXIS_MEANING = {"M": "tokens (non-contracting lhs size)", "N": "output features", "K": "contraction size"}


class GemmShapeError(UserError):
    """A size that a quantized operand's blocks do not divide. The fields let a caller reword the message
    in its own terms (e.g. the config key that set ``size``)."""

    def __init__(self, message: str, *, slot: str, gemm: str, axis: str, size: int, multiple: int):
        super().__init__(message)
        self.slot, self.gemm, self.axis, self.size, self.multiple = slot, gemm, axis, size, multiple


@dataclass(frozen=True, kw_only=True)
class QuantSpec:
    """How one operand of one GEMM is quantized. Blocks run along that GEMM's contraction axis.

    ``block=(1, 16)`` is a 1-D block of 16 consecutive elements along the contraction axis; ``(16, 16)`` is a
    2-D tile (NVFP4 weights: the tile's codes and scale are the same whichever axis is contracted, so the
    transposed copy is exact). MX formats use ``(1, 32)``; per-tensor FP8 ignores ``block``.

    NVFP4 only (docs/numerics.md §2.7-2.8): ``row_scaled`` gives each row of the operand (each index of the
    non-contracted axis) its own float32 amax; ``four_over_six`` ("mae" | "mse") picks per block the
    map-to-4 or map-to-6 scale, whichever errs less, with ``e4m3_max`` 448 or 256 as the global range.
    """

    format: str
    block: tuple[int, int] = (1, 16)
    rounding: str = "nearest"
    hadamard: bool = False
    row_scaled: bool = False
    four_over_six: str | None = None
    e4m3_max: int = 448

    def __post_init__(self):
        if self.format not in FORMATS:
            raise UserError(f"unknown quantization format {self.format!r}; use one of {', '.join(FORMATS)}")
        if self.rounding not in ROUNDINGS:
            raise UserError(f"unknown rounding {self.rounding!r}; use one of {', '.join(ROUNDINGS)}")
        object.__setattr__(self, "block", tuple(int(b) for b in self.block))
        assert len(self.block) == 2, self.block
        if self.nvfp4_options != nvfp4.PLAIN:
            if self.format != "nvfp4":
                raise UserError(f"{self.format}: row_scaled, four_over_six and e4m3_max are nvfp4 options")
            try:
                self.nvfp4_options.check(self.block)
            except ValueError as error:
                raise UserError(str(error)) from None

    @property
    def nvfp4_options(self) -> nvfp4.Options:
        return nvfp4.Options(self.row_scaled, self.four_over_six, self.e4m3_max)

    @property
    def stochastic(self) -> bool:
        return self.rounding == "stochastic"

    @property
    def row_multiple(self) -> int:
        """The size of the non-contracted axis must be a multiple of this (16 for 2-D tiles)."""
        return self.block[0] if self.format in ("nvfp4", "mxfp4", "mxfp8") else 1

    @property
    def contraction_multiple(self) -> int:
        """The contraction size must be a multiple of this (the block length, and 16 for the RHT)."""
        multiple = self.block[1] if self.format in ("nvfp4", "mxfp4", "mxfp8") else 1
        return math.lcm(multiple, 16) if self.hadamard else multiple

    def describe(self) -> str:
        parts = [self.format]
        if self.format in ("nvfp4", "mxfp4", "mxfp8"):
            parts.append(f"{self.block[0]}x{self.block[1]}")
        parts.append("SR" if self.stochastic else "RNE")
        if self.hadamard:
            parts.append("RHT")
        if self.row_scaled:
            parts.append("row-scaled")
        if self.four_over_six:
            parts.append(f"4over6 {self.four_over_six.upper()} {self.e4m3_max}")
        return " ".join(parts)


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """The six operand specs of a linear layer's three GEMMs (see the module docstring)."""

    name: str
    fprop_x: QuantSpec | None = None  # Y  = X Wᵀ : X rowwise, blocks along K
    fprop_w: QuantSpec | None = None  #             W rowwise, blocks along K
    dgrad_g: QuantSpec | None = None  # dX = dY W : dY rowwise, blocks along N
    dgrad_w: QuantSpec | None = None  #             Wᵀ, blocks along N
    wgrad_g: QuantSpec | None = None  # dW = dYᵀX : dYᵀ, blocks along M (tokens)
    wgrad_x: QuantSpec | None = None  #             Xᵀ, blocks along M (tokens)
    backward_override: str | None = None  # None | "high_precision" | "dequantized" (module docstring)

    def __post_init__(self):
        if self.backward_override not in BACKWARD_OVERRIDES:
            raise UserError(
                f"recipe {self.name!r}: unknown backward_override {self.backward_override!r}; use "
                f"{', '.join(repr(o) for o in BACKWARD_OVERRIDES)}"
            )
        quantized_backward = [slot for slot in BACKWARD_SLOTS if getattr(self, slot) is not None]
        if self.backward_override and quantized_backward:
            raise UserError(
                f"recipe {self.name!r}: backward_override={self.backward_override!r} runs the backward GEMMs "
                f"unquantized, but {', '.join(quantized_backward)} are quantized; leave them unset"
            )

    def specs(self) -> dict[str, QuantSpec | None]:
        return {slot: getattr(self, slot) for slot in SLOTS}

    @property
    def is_quantized(self) -> bool:
        return any(spec is not None for spec in self.specs().values())

    @property
    def shares_weight_tiles(self) -> bool:
        """Whether the forward and dgrad GEMMs read one NVFP4 copy of the weight in plain 16x16 tiles (the
        dgrad its transpose, or with the "dequantized" override its values): all of the weight a step needs,
        which `precision.fp4_param_gather` gathers in 4 bits."""
        w = self.fprop_w
        if w is None or w.format != "nvfp4" or w.block != (16, 16) or w.hadamard or w.nvfp4_options != nvfp4.PLAIN:
            return False
        return self.backward_override == "dequantized" or self.dgrad_w == w

    def is_stochastic(self, slots: Iterable[str] = SLOTS) -> bool:
        """Whether any of ``slots`` rounds stochastically (and so needs random bits)."""
        return any(spec is not None and spec.stochastic for spec in (getattr(self, slot) for slot in slots))

    def check_gemm_shapes(self, *, m: int | None, n: int, k: int, slots: Iterable[str] = SLOTS, where: str) -> None:
        """Raise `GemmShapeError` unless the blocks of every quantized operand in ``slots`` divide its sizes.

        A linear layer on M tokens with K input and N output features: each quantized operand needs its
        GEMM's contraction size to be a multiple of ``spec.contraction_multiple`` and its other axis a
        multiple of ``spec.row_multiple`` (see `_GEMM_AXES`). ``m=None`` (token count not known
        statically) skips the checks on M. ``where`` names the layer in the message.
        """
        sizes = {"M": m, "N": n, "K": k}
        for slot in slots:
            spec = getattr(self, slot)
            if spec is None:
                continue
            gemm, rows, contraction = _GEMM_AXES[slot]
            for axis, multiple in ((contraction, spec.contraction_multiple), (rows, spec.row_multiple)):
                size = sizes[axis]
                if size is None or size % multiple == 0:
                    continue
                raise GemmShapeError(
                    f"{where}: recipe {self.name!r} quantizes {slot} ({spec.describe()}) in the {gemm} GEMM, "
                    f"which needs {_AXIS_MEANING[axis]} {axis}={size} to be a multiple of {multiple}; use "
                    f"sizes that are multiples of {multiple} or keep this layer unquantized (recipe 'bf16')",
                    slot=slot,
                    gemm=gemm,
                    axis=axis,
                    size=size,
                    multiple=multiple,
                )

    def describe(self) -> str:
        """One line per operand, for logs and tables."""

        def what(slot: str, spec: QuantSpec | None) -> str:
            if spec is not None:
                return spec.describe()
            if self.backward_override == "dequantized" and slot in ("dgrad_w", "wgrad_x"):
                return "bf16: the forward's quantized copy, dequantized"
            return "bf16 (not quantized)"

        return "\n".join(f"{slot:8s} {what(slot, spec)}" for slot, spec in self.specs().items())


def _nvfp4(**changes) -> dict[str, QuantSpec | None]:
    """The paper's NVFP4 recipe (docs/numerics.md), with optional per-slot overrides."""
    x = QuantSpec(format="nvfp4")
    w2d = QuantSpec(format="nvfp4", block=(16, 16))
    g_sr = QuantSpec(format="nvfp4", rounding="stochastic")
    slots: dict[str, QuantSpec | None] = dict(
        fprop_x=x,
        fprop_w=w2d,
        dgrad_g=g_sr,
        dgrad_w=w2d,
        wgrad_g=QuantSpec(format="nvfp4", rounding="stochastic", hadamard=True),
        wgrad_x=QuantSpec(format="nvfp4", hadamard=True),
    )
    slots.update(changes)
    return slots


def _with(slots: dict[str, QuantSpec | None], which: Iterable[str], **fields) -> dict[str, QuantSpec | None]:
    """``slots`` with ``fields`` replaced in the specs of the slots ``which`` names."""
    return {k: dataclasses.replace(s, **fields) if k in which and s is not None else s for k, s in slots.items()}


def _without(slots: dict[str, QuantSpec | None], **fields) -> dict[str, QuantSpec | None]:
    return {k: None if s is None else dataclasses.replace(s, **fields) for k, s in slots.items()}


def _build_registry() -> dict[str, Recipe]:
    nvfp4 = _nvfp4()
    mx4 = QuantSpec(format="mxfp4", block=(1, 32))
    mx4_sr = dataclasses.replace(mx4, rounding="stochastic")
    mx8 = QuantSpec(format="mxfp8", block=(1, 32))
    e4m3 = QuantSpec(format="fp8_e4m3")
    e5m2 = QuantSpec(format="fp8_e5m2")
    one_d = QuantSpec(format="nvfp4")
    nvfp4_backward = {slot: nvfp4[slot] for slot in BACKWARD_SLOTS}
    no_backward = dict.fromkeys(BACKWARD_SLOTS)
    # TransformerEngine's 4over6 scopes: the operands without the RHT (it has no 4over6 + RHT kernel yet).
    without_rht = [slot for slot, spec in nvfp4.items() if spec is not None and not spec.hadamard]
    one_by_16 = [slot for slot, spec in nvfp4.items() if spec is not None and spec.block == (1, 16)]
    table = {
        "bf16": {},
        "nvfp4": nvfp4,
        "nvfp4_no_rht": _without(nvfp4, hadamard=False),
        "nvfp4_no_sr": _without(nvfp4, rounding="nearest"),
        "nvfp4_1d_weights": _nvfp4(fprop_w=one_d, dgrad_w=one_d),
        "nvfp4_fwd_only": _nvfp4(dgrad_g=None, dgrad_w=None, wgrad_g=None, wgrad_x=None),
        "nvfp4_naive": {slot: one_d for slot in nvfp4},
        "mxfp4": dict(
            fprop_x=mx4,
            fprop_w=mx4,
            dgrad_g=mx4_sr,
            dgrad_w=mx4,
            wgrad_g=dataclasses.replace(mx4_sr, hadamard=True),
            wgrad_x=dataclasses.replace(mx4, hadamard=True),
        ),
        "mxfp8": {slot: mx8 for slot in nvfp4},
        "fp8": dict(fprop_x=e4m3, fprop_w=e4m3, dgrad_g=e5m2, dgrad_w=e4m3, wgrad_g=e5m2, wgrad_x=e4m3),
        # The 2026 options (docs/numerics.md §2.7-2.8, §7): TransformerEngine's, in JAX.
        "nvfp4_4over6": _with(nvfp4, without_rht, four_over_six="mae", e4m3_max=256),
        "nvfp4_row_scaled": _with(nvfp4, one_by_16, row_scaled=True),
        "mxfp8_fwd_nvfp4_bwd": dict(fprop_x=mx8, fprop_w=mx8, **nvfp4_backward),
        "nvfp4_fwd_mxfp8_bwd": dict(
            fprop_x=nvfp4["fprop_x"], fprop_w=nvfp4["fprop_w"], **dict.fromkeys(BACKWARD_SLOTS, mx8)
        ),
        "nvfp4_bwd_high_precision": dict(_nvfp4(**no_backward), backward_override="high_precision"),
        "nvfp4_bwd_dequantized": dict(_nvfp4(**no_backward), backward_override="dequantized"),
    }
    return {name: Recipe(name=name, **slots) for name, slots in table.items()}


RECIPES: dict[str, Recipe] = _build_registry()


def get_recipe(name_or_recipe: str | Recipe) -> Recipe:
    """The preset called ``name_or_recipe``, or the `Recipe` itself when one is given."""
    if isinstance(name_or_recipe, Recipe):
        return name_or_recipe
    if name_or_recipe not in RECIPES:
        raise UserError(f"unknown precision recipe {name_or_recipe!r}; use one of {', '.join(RECIPES)}")
    return RECIPES[name_or_recipe]
