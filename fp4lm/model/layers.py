"""Building blocks of the decoder: parameters, QuantLinear, RMSNorm, token embedding and RoPE.

Conventions used throughout fp4lm/model:
- Parameters are float32 master weights; compute runs in bfloat16; norms, softmax and logits in float32.
- Tensor names carry their shape in capital letters, one per axis, from the one table fp4lm.shapes
  (B batch, T positions, D model width, M MLP hidden width, X experts, ...).
- Every parameter carries its logical axis names as the flax `out_sharding` metadata, e.g.
  ("embed", "mlp"). They are *logical* names, not mesh axes: `fp4lm.sharding` maps them onto the mesh.
  `eager_sharding=False` keeps flax from trying to place them on a mesh at creation time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import jax
import jax.numpy as jnp
from flax import nnx

from fp4lm.config import ModelConfig
from fp4lm.numerics.formats import abs_max
from fp4lm.quant.policy import Policy
from fp4lm.quant.stats import layer_stats
from fp4lm.quant.weight_gather import TILE, WeightGather
from fp4lm.sharding import fsdp_gathered, fsdp_placements

COMPUTE_DTYPE = jnp.bfloat16


def make_param(
    key: jax.Array | None, shape: tuple[int, ...], std: float | None, logical_axes: tuple[str | None, ...]
) -> nnx.Param:
    """A float32 parameter drawn from normal(0, std) (std=None: all ones), annotated with logical axes."""
    assert len(shape) == len(logical_axes), (shape, logical_axes)
    if std is None:
        value = jnp.ones(shape, jnp.float32)
    else:
        assert key is not None, "a drawn parameter needs a key"
        value = std * jax.random.normal(key, shape, jnp.float32)
    return nnx.Param(value, out_sharding=logical_axes, eager_sharding=False)


class LayerStats(nnx.Variable):
    """Quantization telemetry of a quantized layer's last call: {row suffix: {operand: {metric: scalar}}}.

    A row is named by the layer's `path` and the suffix: "" for a QuantLinear (one row, its path), ".{e}" for
    expert e of a MoE block's routed projection ("blocks.1.mlp.experts.gate.3"). Suffixes, not whole names,
    so that a layer scan can run one block's modules for every layer and put the rows back on each block's
    own (fp4lm.model.scan). Written only while the layer's `collect_stats` is on; `pop_layer_stats` takes it
    out of the model (fp4lm.quant.stats computes the metrics).
    """


class QuantLinear(nnx.Module):
    """y = x @ W with W [in, out], using the matmul the precision policy chose for this layer's path.

    The float32 kernel is cast to bfloat16 and handed, with the bfloat16 input, to
    `policy.dot_general_for(path)`, which may quantize either operand (and the gradients in backward).
    Products accumulate in float32; the output is bfloat16. When a `quant_key` is given, the layer
    passes `key = fold_in(quant_key, policy.layer_seed(path))` so every layer draws its own
    stochastic-rounding bits, identical on 1 or many devices.

    With `collect_stats` on (see `collect_layer_stats`), a quantized layer also stores the telemetry of
    its operands in a `LayerStats` variable, `self.stats`.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        path: str,
        policy: Policy,
        logical_axes: tuple[str, ...],
        init_std: float,
        rngs: nnx.Rngs,
    ):
        self.path = path
        self.policy = policy
        self.collect_stats = False
        self.kernel = make_param(rngs.params(), (in_features, out_features), init_std, logical_axes)

    @property
    def is_quantized(self) -> bool:
        return self.policy.recipe_for(self.path).is_quantized

    def __call__(
        self, x_BTD: jax.Array, *, quant_key: jax.Array | None = None, weight_amax: jax.Array | None = None
    ) -> jax.Array:
        """y [..., out] in bfloat16. `weight_amax`: the fused group's shared weight amax (`shared_weight_amax`)."""
        x_BTD = x_BTD.astype(COMPUTE_DTYPE)
        weight = self.weight()  # [in, out]
        dot = self.policy.dot_general_for(self.path)
        contract_last_with_first = (((x_BTD.ndim - 1,), (0,)), ((), ()))
        options: dict = {"preferred_element_type": jnp.float32}
        if weight_amax is not None:
            options["weight_amax"] = weight_amax
        if quant_key is not None:
            options["key"] = jax.random.fold_in(quant_key, self.layer_seed())
        if (weight_gather := self.weight_gather()) is not None:
            options["weight_gather"] = weight_gather
        y = dot(x_BTD, weight, contract_last_with_first, **options)
        if self.collect_stats and self.is_quantized:
            recipe = self.policy.recipe_for(self.path)
            self.stats = LayerStats({"": layer_stats(x_BTD, weight, recipe, weight_amax=weight_amax)})
        return y.astype(COMPUTE_DTYPE)

    def weight(self) -> jax.Array:
        """The kernel as the matmul takes it: bfloat16 [in, out]."""
        return self.kernel[...].astype(COMPUTE_DTYPE)

    def weight_gather(self) -> WeightGather | None:
        """With precision.fp4_param_gather, under FSDP on the context mesh: the kernel's placements, so that
        its NVFP4 tiles are quantized on its shards and gathered in 4 bits (fp4lm.quant.weight_gather)."""
        if not (self.policy.fp4_param_gather and self.is_quantized):
            return None
        names = self.kernel.get_metadata()["out_sharding"]
        mesh = jax.sharding.get_abstract_mesh()  # the step's (fp4lm.train.run_functions)
        placements = fsdp_placements(names, self.kernel.shape, mesh, tile=TILE, where=f"layer {self.path}")
        return None if placements is None else WeightGather(*placements)

    def layer_seed(self) -> int | jax.Array:
        return seed_of(self)


@runtime_checkable
class QuantizedLayer(Protocol):
    """What a quantized layer has, and is found by (telemetry, the layer scan): its `path`, its `policy`, the
    telemetry switch `collect_stats` and `layer_seed()`. A QuantLinear; a MoE block's ExpertKernels."""

    path: str
    policy: Policy
    collect_stats: bool

    def layer_seed(self) -> int | jax.Array: ...


def seed_of(layer: QuantizedLayer) -> int | jax.Array:
    """The seed a quantized layer folds into the step's key:
    `policy.layer_seed(path)`, or inside a layer scan (which runs one block's modules for every layer of a
    group, fp4lm.model.scan) the current layer's, which the scan sets as `scan_seed` — the same number, so
    scanned and unrolled blocks draw the same bits."""
    scan_seed = getattr(layer, "scan_seed", None)
    return layer.policy.layer_seed(layer.path) if scan_seed is None else scan_seed[...]


def shares_weight_scale(policy: Policy, paths: Sequence[str]) -> bool:
    """Whether the layers `paths` of a fused group (q/k/v, gate/up: they read one activation) share one weight
    amax: the policy has `shared_weight_scale` and some member is quantized (bf16 layers have no global scale)."""
    return policy.shared_weight_scale and any(policy.recipe_for(path).is_quantized for path in paths)


def fused_weight_amax(weights: Sequence[jax.Array], axis=None) -> jax.Array:
    """The one weight amax of a fused group: max |W| over the members' bfloat16 weights (NaN-propagating, like
    a quantizer's own amax), over `axis` of each (None: all of it; (1, 2): one per expert of [X, in, out])."""
    return abs_max(jnp.stack([abs_max(weight, axis=axis) for weight in weights]), axis=0)


def shared_weight_amax(layers: Sequence[QuantLinear]) -> jax.Array | None:
    """`fused_weight_amax` of the QuantLinears of a fused group when they share a scale (`shares_weight_scale`),
    else None."""
    if not shares_weight_scale(layers[0].policy, [layer.path for layer in layers]):
        return None
    return fused_weight_amax([layer.weight() for layer in layers])


class ScanSeed(nnx.Variable):
    """A QuantLinear's stochastic-rounding seed for the current iteration of a layer scan (uint32 scalar)."""


def collect_layer_stats(model: nnx.Module, enabled: bool = True) -> None:
    """Turns telemetry on (or off) in every quantized layer of `model`: its next call stores `LayerStats`."""
    for _, module in nnx.iter_graph(model):
        if isinstance(module, QuantizedLayer):
            module.collect_stats = enabled


def pop_layer_stats(model: nnx.Module) -> dict[str, dict]:
    """{row: {operand: {metric: scalar}}} stored by the last call, removed from the model: each LayerStats
    row named by its layer's `path` and the row's suffix ("blocks.0.attn.q", "blocks.1.mlp.experts.gate.3").

    Only quantized layers report (in no particular order: jax sorts a dict's keys anyway).
    """
    modules = dict(nnx.iter_graph(model))
    popped = nnx.to_flat_state(nnx.pop(model, LayerStats))
    found: dict[str, dict] = {}
    for variable_path, variable in popped:
        layer = modules[variable_path[:-1]]
        assert isinstance(layer, QuantizedLayer), variable_path
        found.update({layer.path + suffix: stats for suffix, stats in variable.get_value().items()})
    return found


class RMSNorm(nnx.Module):
    """y = x / sqrt(mean(x²) + eps) * scale, computed in float32, returned in bfloat16."""

    def __init__(self, dim: int, *, eps: float):
        self.eps = eps
        self.scale = make_param(None, (dim,), None, ("norm",))

    def __call__(self, x_BTD: jax.Array) -> jax.Array:
        x_BTD = x_BTD.astype(jnp.float32)
        mean_square_BT1 = jnp.mean(jnp.square(x_BTD), axis=-1, keepdims=True)
        y_BTD = x_BTD * jax.lax.rsqrt(mean_square_BT1 + self.eps) * self.scale[...]
        return y_BTD.astype(COMPUTE_DTYPE)


class Embedding(nnx.Module):
    """Token embedding table [V, D]; `attend` reuses it as a tied LM head (logits = x @ tableᵀ)."""

    def __init__(self, vocab_size: int, dim: int, *, init_std: float, rngs: nnx.Rngs):
        self.table = make_param(rngs.params(), (vocab_size, dim), init_std, ("vocab", "embed"))

    def __call__(self, tokens_BT: jax.Array) -> jax.Array:
        table_VD = fsdp_gathered(self.table[...], self.table.get_metadata()["out_sharding"])
        return jnp.take(table_VD, tokens_BT, axis=0).astype(COMPUTE_DTYPE)

    def attend(self, x_BTD: jax.Array) -> jax.Array:
        table_VD = self.table[...].astype(COMPUTE_DTYPE)
        return jnp.einsum("btd,vd->btv", x_BTD.astype(COMPUTE_DTYPE), table_VD, preferred_element_type=jnp.float32)


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1's long-context RoPE (`rope_scaling` of type "llama3" in Hugging Face configs).

    With L = original_max_positions, each frequency f_i = theta^(-2i/E) has a wavelength w_i = 2π / f_i:
    - w_i < L / high_freq_factor (fast rotations, local detail): f_i is kept;
    - w_i > L / low_freq_factor (slow rotations, longer than the original context): f_i / factor;
    - in between, a linear blend in s = (L / w_i - low_freq_factor) / (high_freq_factor - low_freq_factor):
      (1 - s) · f_i / factor + s · f_i.
    """

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_positions: int

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> Llama3RopeScaling | None:
        if cfg.rope_scaling == "none":
            return None
        return cls(
            cfg.rope_scaling_factor,
            cfg.rope_low_freq_factor,
            cfg.rope_high_freq_factor,
            cfg.rope_original_max_positions,
        )


def rope_inverse_frequencies(head_dim: int, theta: float, scaling: Llama3RopeScaling | None = None) -> jax.Array:
    """f_i = theta^(-2i/E) for the E/2 channel pairs, float32, rescaled by `scaling` when given."""
    frequencies = theta ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
    if scaling is None:
        return frequencies
    original = float(scaling.original_max_positions)
    wavelengths = 2 * math.pi / frequencies
    blend = (original / wavelengths - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    blended = (1 - blend) * frequencies / scaling.factor + blend * frequencies
    scaled = jnp.where(wavelengths > original / scaling.low_freq_factor, frequencies / scaling.factor, frequencies)
    in_between = (wavelengths >= original / scaling.high_freq_factor) & (
        wavelengths <= original / scaling.low_freq_factor
    )
    return jnp.where(in_between, blended, scaled)


def rope_angles(
    positions_T: jax.Array, head_dim: int, theta: float, scaling: Llama3RopeScaling | None = None
) -> jax.Array:
    """Rotation angles [..., T, E/2]: position t rotates channel pair i by t * theta^(-2i/E).

    `positions_T` is [T] (one sequence layout for the batch) or [B, T] (each row its own, e.g. restarting
    at every document start). `scaling`: Llama 3.1's frequency scaling (None: plain RoPE)."""
    assert head_dim % 2 == 0, head_dim
    inverse_frequencies = rope_inverse_frequencies(head_dim, theta, scaling)
    return positions_T.astype(jnp.float32)[..., None] * inverse_frequencies


def apply_rope(x_BTHE: jax.Array, angles_TF: jax.Array) -> jax.Array:
    """Rotary position embedding, "rotate half" layout: channel i pairs with channel i + E/2.

    Each pair (a, b) is rotated by its angle: (a cos - b sin, a sin + b cos). Rotations compose, so
    the dot product of a query rotated to position m with a key rotated to position n depends only on
    m - n. Computed in float32, returned in the input dtype. `angles_TF` is [T, F] or [B, T, F] (F = E/2).
    """
    x = x_BTHE.astype(jnp.float32)
    first_BTHF, second_BTHF = jnp.split(x, 2, axis=-1)
    cos_BT1F = jnp.cos(angles_TF)[..., None, :]  # broadcasts over the heads (and over B for [T, F] angles)
    sin_BT1F = jnp.sin(angles_TF)[..., None, :]
    rotated = jnp.concatenate(
        [first_BTHF * cos_BT1F - second_BTHF * sin_BT1F, first_BTHF * sin_BT1F + second_BTHF * cos_BT1F], axis=-1
    )
    return rotated.astype(x_BTHE.dtype)
