"""The routed experts of a MoE block: X SwiGLU experts run as grouped GEMMs over rows sorted by expert.

`ExpertKernel` holds one projection's kernels (gate [X, D, M], up [X, D, M], down [X, M, D]) with its layer
path; a MoE block holds three (fp4lm.model.moe). `Experts` is what they compute, a pure function of the
kernels: row r, of expert e, becomes down_e(silu(gate_e(x_r)) * up_e(x_r)) (`fp4lm.model.mlp.swiglu`). Each
projection runs once over all experts as `fp4lm.quant.grouped.grouped_dot` with one group of rows per expert,
under the precision policy's recipe for `blocks.{i}.mlp.experts.{gate,up,down}` (each expert its own
quantized tensor). The one-device path and expert parallelism (fp4lm.model.expert_parallel, on a device's
slice of the experts) call the same `Experts`.

Names: the parameter is `blocks.{i}.mlp.gate.kernel` (checkpoints, exports), the layer (precision rules,
telemetry, the inventory fp4lm.linear_layers) is `blocks.{i}.mlp.experts.gate`, and expert e's telemetry row
is `blocks.{i}.mlp.experts.gate.{e}`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
from flax import nnx

from fp4lm.linear_layers import LinearLayer
from fp4lm.model.layers import COMPUTE_DTYPE, fused_weight_amax, make_param, seed_of, shares_weight_scale
from fp4lm.model.mlp import swiglu
from fp4lm.quant.grouped import grouped_dot
from fp4lm.quant.policy import Policy
from fp4lm.quant.stats import grouped_layer_stats


class ExpertKernel(nnx.Module):
    """One projection of the routed experts: its kernels [X, in, out] and its layer `path`, with the telemetry
    switch of a quantized layer (`collect_stats`; the rows go to a `LayerStats` here, one per expert, ".{e}").
    Not called: `Experts` reads its `weight()`."""

    def __init__(self, layer: LinearLayer, *, policy: Policy, rngs: nnx.Rngs):
        self.path = layer.path
        self.policy = policy
        self.collect_stats = False
        shape = (layer.experts, layer.in_features, layer.out_features)
        self.kernel = make_param(rngs.params(), shape, layer.init_std, layer.logical_axes)

    def weight(self) -> jax.Array:
        """The kernels as the grouped GEMM takes them: bfloat16 [X, in, out]."""
        return self.kernel[...].astype(COMPUTE_DTYPE)

    def layer_seed(self) -> int | jax.Array:
        return seed_of(self)

    def layer_key(self, quant_key: jax.Array | None) -> jax.Array | None:
        """The step's key folded with this layer's seed, before the expert index (grouped_dot folds that)."""
        return None if quant_key is None else jax.random.fold_in(quant_key, self.layer_seed())


@dataclasses.dataclass(frozen=True)
class Experts:
    """The routed experts' SwiGLU as a pure function of their kernels; static (paths, policy), so that expert
    parallelism can run it on a device's slice of the experts.

    `paths`: the gate, up and down layers' paths; `with_stats`: measure each expert's operands
    (`grouped_layer_stats`) as its grouped GEMM quantizes them."""

    paths: tuple[str, str, str]
    policy: Policy
    with_stats: bool = False

    @classmethod
    def of(cls, kernels: Sequence[ExpertKernel]) -> Experts:
        """The experts of a MoE block's gate, up and down `ExpertKernel`s."""
        gate, up, down = kernels
        with_stats = any(kernel.collect_stats for kernel in kernels)
        return cls((gate.path, up.path, down.path), gate.policy, with_stats)

    def __call__(
        self,
        x_RD: jax.Array,
        group_sizes_X: jax.Array,
        kernels: Sequence[jax.Array],
        keys: Sequence[jax.Array | None],
        first_expert: int | jax.Array = 0,
    ) -> tuple[jax.Array, dict[str, dict]]:
        """(y_RD bfloat16, telemetry) for rows sorted by expert (group_sizes_X rows each; rows past their sum
        give zeros). `kernels`: bfloat16 gate, up, down, experts first_expert, first_expert + 1, ... of the
        layer; `keys`: each projection's layer key (or None). The telemetry: {path: `grouped_layer_stats`,
        one value per expert of `kernels`} of each quantized projection when `with_stats`, else {}."""
        gate_path, up_path, _ = self.paths
        w_gate_XDM, w_up_XDM, _ = kernels
        gate_up_amax_X = None
        if shares_weight_scale(self.policy, (gate_path, up_path)):  # an expert's gate and up: one fused GEMM
            gate_up_amax_X = fused_weight_amax([w_gate_XDM, w_up_XDM], axis=(1, 2))
        inputs = {}

        def projection(path: str, w, key, weight_amax):
            def run(rows):
                inputs[path] = rows = rows.astype(COMPUTE_DTYPE)
                recipe = self.policy.recipe_for(path)
                options = {"key": key, "name": path, "first_expert": first_expert, "weight_amax": weight_amax}
                y = grouped_dot(rows, w, group_sizes_X, recipe, **options)
                return y.astype(COMPUTE_DTYPE)

            return run

        amaxes = (gate_up_amax_X, gate_up_amax_X, None)
        gate, up, down = map(projection, self.paths, kernels, keys, amaxes)
        y_RD = swiglu(x_RD, gate, up, down)
        if not self.with_stats:
            return y_RD, {}
        return y_RD, {
            path: grouped_layer_stats(inputs[path], w, group_sizes_X, self.policy.recipe_for(path))
            for path, w in zip(self.paths, kernels, strict=True)
            if self.policy.recipe_for(path).is_quantized
        }
