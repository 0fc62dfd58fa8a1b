"""Scanned layers (model.scan_layers): the decoder blocks run in a `jax.lax.scan`, so the compiled program holds
one copy of a block per scan group instead of one per layer and compile time stays nearly flat with depth.

Groups. Consecutive blocks whose seven projections use the same recipes form one group (`block_groups`); a
block of another precision — the bf16 first/last blocks, a regex rule that singles out a layer — starts a new
one, so the precision policy is exactly that of the unrolled model. A group of one block is simply called.

Parameters. The model keeps one set of parameters per block (`blocks.{i}.attn.q.kernel`, ...), so checkpoints,
the Hugging Face export/import, sharding rules and the layer inventory are the same whether the layers are
scanned or not, and a run can switch `model.scan_layers` on resume. Inside the step a group's parameters are
stacked along a new leading axis [L, ...] and the scan takes layer i's slice; the gradient flows back through
the stack to each block's own parameter. The price is one transient copy of the group's parameters per step.

Inside the scan one module (the group's first block, whose paths name the recipes) runs every layer of the
group; what differs per layer is passed as scan inputs:
- the parameters (the stacked slice);
- each projection's stochastic-rounding seed, `policy.layer_seed("blocks.{i}.attn.q")` — the same number the
  unrolled block folds into the step's key (QuantLinear.layer_seed), so both draw the same rounding bits;
and what differs per layer comes out stacked: the telemetry rows (LayerStats), which are unstacked afterwards
onto each block's own QuantLinear, so `pop_layer_stats` names them `blocks.{i}....` as before, and a MoE
block's RoutingStats (its auxiliary loss among them), unstacked onto each block's MoE module.

KV cache (generation, fp4lm.model.decode): a group's cache is stacked [L, ...] like its parameters; layer i's
slice goes in as a scan input and its updated cache comes out as a scan output, stacked again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from fp4lm.model.blocks import Block
from fp4lm.model.decode import KVCache
from fp4lm.model.layers import LayerStats, QuantizedLayer, ScanSeed
from fp4lm.model.moe import MoE, RoutingStats

RelativePath = tuple[str, ...]  # a projection inside a block, e.g. ("attn", "q")


def block_projections(block: Block) -> list[tuple[RelativePath, QuantizedLayer]]:
    """The block's quantized layers (QuantLinears, a MoE block's ExpertKernels) with their paths inside the
    block, in graph order."""
    return [
        (tuple(map(str, path)), module) for path, module in nnx.iter_graph(block) if isinstance(module, QuantizedLayer)
    ]


def _module_at(block: Block, relative: RelativePath) -> QuantizedLayer:
    module = block
    for name in relative:
        module = getattr(module, name)
    assert isinstance(module, QuantizedLayer), relative
    return module


def block_groups(blocks: Sequence[Block]) -> list[list[int]]:
    """Runs of consecutive block indices with the same projections using the same recipes (their policy's
    recipe_for): a dense block and a MoE block never share a group, even with as many projections."""
    groups: list[list[int]] = []
    previous = None
    for index, block in enumerate(blocks):
        recipes = [
            (relative, type(module), module.policy.recipe_for(module.path))
            for relative, module in block_projections(block)
        ]
        if groups and recipes == previous:
            groups[-1].append(index)
        else:
            groups.append([index])
        previous = recipes
    return groups


def scan_blocks(
    blocks: Sequence[Block],
    x_BTD: jax.Array,
    *,
    quant_key: jax.Array | None,
    checkpoint: Callable | None,
    cache: KVCache | None = None,
    cache_position: jax.Array | None = None,
    **layout,
) -> tuple[jax.Array, KVCache | None]:
    """(x after `blocks` (all of one group), run as one `lax.scan` over their stacked parameters; the group's
    updated KV cache, None without one).

    checkpoint: wraps the per-layer function (jax.checkpoint with the model's remat policy; None: no remat).
    cache, cache_position: the group's KV cache, stacked [L, ...], and where the tokens go in it (module doc).
    layout: the document layout passed to every block (segment_ids_BT, positions_BT).
    """
    template_graphdef, _ = nnx.split(blocks[0])
    states = [nnx.to_pure_dict(nnx.state(block, nnx.Param)) for block in blocks]
    stacked_state = jax.tree.map(lambda *layers: jnp.stack(layers), *states)
    relatives = [relative for relative, _ in block_projections(blocks[0])]
    seeds = {
        ".".join(relative): jnp.asarray([_module_at(block, relative).layer_seed() for block in blocks], jnp.uint32)
        for relative in relatives
    }

    def one_layer(x_BTD: jax.Array, per_layer: tuple[dict, dict[str, jax.Array], KVCache | None]):
        state, layer_seeds, layer_cache = per_layer
        block = nnx.merge(template_graphdef, state)
        for relative in relatives:
            seed = ScanSeed(layer_seeds[".".join(relative)])
            _module_at(block, relative).scan_seed = seed  # pyright: ignore[reportAttributeAccessIssue]
        if layer_cache is None:
            x_BTD = block(x_BTD, quant_key=quant_key, **layout)
        else:
            assert cache_position is not None
            x_BTD, layer_cache = block(
                x_BTD, quant_key=quant_key, cache=layer_cache, cache_position=cache_position, **layout
            )
        stats = nnx.to_flat_state(nnx.pop(block, LayerStats))
        routing = nnx.to_flat_state(nnx.pop(block, RoutingStats))
        return x_BTD, (
            {".".join(map(str, path[:-1])): variable.get_value() for path, variable in stats},
            [variable.get_value() for _, variable in routing],
            layer_cache,
        )

    if checkpoint is not None:
        one_layer = checkpoint(one_layer)
    x_BTD, (stats_by_projection, routing, cache) = jax.lax.scan(one_layer, x_BTD, (stacked_state, seeds, cache))
    for name, stacked_stats in stats_by_projection.items():
        relative = tuple(name.split("."))
        for layer, block in enumerate(blocks):
            _module_at(block, relative).stats = LayerStats(_layer_row(stacked_stats, layer))  # pyright: ignore[reportAttributeAccessIssue]
    for stacked_routing in routing:  # the one MoE module of each block
        for layer, block in enumerate(blocks):
            assert isinstance(block.mlp, MoE)
            block.mlp.routing = RoutingStats(_layer_row(stacked_routing, layer))
    return x_BTD, cache


def _layer_row(stacked, layer: int):
    """Layer `layer`'s values of a tree stacked along a leading [L] axis by the scan."""
    return jax.tree.map(lambda values: values[layer], stacked)
