"""The Llama-family decoder: embedding, N pre-norm blocks, final RMSNorm, LM head (optionally tied).

    logits_BTV = head(norm(block_{N-1}( ... block_0(embed(tokens_BT)) ... )))

With `model.scan_layers` the blocks run in a `lax.scan` per group of equal precision (fp4lm.model.scan): the
same parameters, precision, stochastic-rounding keys and telemetry, one compiled block per group.

Generation calls the same model with a KV cache (`init_cache`, `cache`/`cache_position`, fp4lm.model.decode):
prefill and each decode step run these blocks and this LM head (`logits`), and return the updated cache.

Only the block projections go through the precision policy; the embedding, the LM head and the
attention score/value matmuls stay bfloat16 with float32 accumulation (the latter FP8 with the policy's
`attention="fp8"`, precision.attention), and logits are float32.
"""

from __future__ import annotations

import functools
from typing import get_args, overload

import jax
import jax.numpy as jnp
from flax import nnx

from fp4lm.config import ModelConfig, RematMode
from fp4lm.linear_layers import linear_layers
from fp4lm.model.blocks import Block
from fp4lm.model.decode import KVCache
from fp4lm.model.layers import COMPUTE_DTYPE, Embedding, RMSNorm, make_param
from fp4lm.model.scan import block_groups, scan_blocks
from fp4lm.quant.dot import QUANTIZED_RESIDUAL_NAME, UNQUANTIZED_OPERAND_NAME
from fp4lm.quant.policy import Policy

REMAT_MODES = get_args(RematMode)


def remat_policy(mode: str):
    """The jax.checkpoint policy for a `model.remat` mode (None: save nothing, recompute everything).

    "save_quantized" keeps only values the quantized matmul tagged with
    `checkpoint_name(..., QUANTIZED_RESIDUAL_NAME)` — its 4.5-bit operand copies — and recomputes the rest
    (bf16 layers included). "save_matmul_operands" also keeps the operands of bf16 layers, so every
    projection's backward reads its operands in the precision its recipe keeps them — 4.5 bits under
    NVFP4, 16 under bf16 — and only norms, activations and attention are recomputed: the same policy for
    every recipe, under which a recipe's activation memory can be compared. The MoE experts' grouped GEMMs
    save, under the same names, their bf16 input rows and the quantized weights (fp4lm.quant.grouped: the
    rows are quantized again per expert in the backward pass).
    """
    assert mode in REMAT_MODES, mode
    if mode == "save_quantized":
        return jax.checkpoint_policies.save_only_these_names(QUANTIZED_RESIDUAL_NAME)
    if mode == "save_matmul_operands":
        return jax.checkpoint_policies.save_only_these_names(QUANTIZED_RESIDUAL_NAME, UNQUANTIZED_OPERAND_NAME)
    return None


class Llama(nnx.Module):
    """Decoder-only transformer. `policy` (fp4lm.quant.policy.Policy) picks each projection's matmul."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, policy: Policy, *, rngs: nnx.Rngs):
        assert cfg.remat in REMAT_MODES, cfg.remat
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.policy = policy
        self.embed = Embedding(vocab_size, cfg.d_model, init_std=cfg.init_std, rngs=rngs)
        self.blocks = nnx.List([Block(cfg, i, policy=policy, rngs=rngs) for i in range(cfg.num_layers)])
        self.final_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        if not cfg.tie_embeddings:
            self.lm_head = make_param(rngs.params(), (cfg.d_model, vocab_size), cfg.init_std, ("embed", "vocab"))

    def linear_paths(self) -> list[str]:
        """Paths of all quantizable projections, in execution order (blocks.0.attn.q, ..., blocks.N.mlp.down)."""
        return [layer.path for layer in linear_layers(self.cfg)]

    @overload
    def __call__(
        self,
        tokens_BT: jax.Array,
        *,
        quant_key: jax.Array | None = None,
        segment_ids_BT: jax.Array | None = None,
        positions_BT: jax.Array | None = None,
        cache: None = None,
        cache_position: None = None,
    ) -> jax.Array: ...
    @overload
    def __call__(
        self,
        tokens_BT: jax.Array,
        *,
        quant_key: jax.Array | None = None,
        segment_ids_BT: jax.Array | None = None,
        positions_BT: jax.Array | None = None,
        cache: list[KVCache],
        cache_position: jax.Array,
    ) -> tuple[jax.Array, list[KVCache]]: ...
    def __call__(
        self,
        tokens_BT: jax.Array,
        *,
        quant_key: jax.Array | None = None,
        segment_ids_BT: jax.Array | None = None,
        positions_BT: jax.Array | None = None,
        cache: list[KVCache] | None = None,
        cache_position: jax.Array | None = None,
    ) -> jax.Array | tuple[jax.Array, list[KVCache]]:
        """logits_BTV float32.

        quant_key: PRNG key for stochastic rounding (each layer folds in its own seed).
        segment_ids_BT, positions_BT: int [B, T], the rows' document layout (fp4lm.data.pipeline): attention
        stays inside each document and RoPE uses these positions. None (both): plain causal attention over
        the row, positions 0..T-1.
        cache, cache_position: generation's KV cache (`init_cache`, fp4lm.model.decode) and the position the
        tokens start at: the prefill of a whole window (T = S, position 0) or one decode step (T = 1); then
        (logits_BTV, the updated cache) is returned.
        Telemetry is not returned: turn it on with `collect_layer_stats(model)` and take it with
        `pop_layer_stats(model)` after the call (fp4lm.model.layers).
        """
        layout: dict = {"segment_ids_BT": segment_ids_BT, "positions_BT": positions_BT}
        if cache is None:
            return self.from_embeddings(self.embed(tokens_BT), quant_key=quant_key, **layout)
        if cache_position is None:
            raise ValueError("a cached call needs the cache_position its tokens start at")
        return self.from_embeddings(
            self.embed(tokens_BT), quant_key=quant_key, cache=cache, cache_position=cache_position, **layout
        )

    @overload
    def from_embeddings(
        self,
        x_BTD: jax.Array,
        *,
        quant_key: jax.Array | None = None,
        segment_ids_BT: jax.Array | None = None,
        positions_BT: jax.Array | None = None,
        cache: None = None,
        cache_position: None = None,
    ) -> jax.Array: ...
    @overload
    def from_embeddings(
        self,
        x_BTD: jax.Array,
        *,
        quant_key: jax.Array | None = None,
        segment_ids_BT: jax.Array | None = None,
        positions_BT: jax.Array | None = None,
        cache: list[KVCache],
        cache_position: jax.Array,
    ) -> tuple[jax.Array, list[KVCache]]: ...
    def from_embeddings(
        self,
        x_BTD: jax.Array,
        *,
        quant_key: jax.Array | None = None,
        segment_ids_BT: jax.Array | None = None,
        positions_BT: jax.Array | None = None,
        cache: list[KVCache] | None = None,
        cache_position: jax.Array | None = None,
    ) -> jax.Array | tuple[jax.Array, list[KVCache]]:
        """Everything after the embedding lookup: blocks, final norm, LM head (same arguments as __call__).

        Separate so that tests and tools can differentiate with respect to the input embeddings, and so
        that fault injection can perturb them from outside the model.
        """
        x_BTD = x_BTD.astype(COMPUTE_DTYPE)
        if cache is not None:
            if cache_position is None or segment_ids_BT is not None or positions_BT is not None:
                raise ValueError("a cached call takes cache_position and no document layout (one text per row)")
            x_BTD, cache = self._cached_blocks(x_BTD, cache, cache_position)
            return self.logits(x_BTD), cache

        def run_block(
            block: Block,
            x_BTD: jax.Array,
            key: jax.Array | None,
            segments: jax.Array | None,
            positions: jax.Array | None,
        ) -> jax.Array:
            return block(x_BTD, quant_key=key, segment_ids_BT=segments, positions_BT=positions)

        if self.cfg.remat != "none":
            run_block = nnx.remat(run_block, policy=remat_policy(self.cfg.remat))

        if self.cfg.resolved_scan_layers:
            checkpoint = None
            if self.cfg.remat != "none":
                checkpoint = functools.partial(jax.checkpoint, policy=remat_policy(self.cfg.remat), prevent_cse=False)
            layout: dict = {"segment_ids_BT": segment_ids_BT, "positions_BT": positions_BT}
            for group in block_groups(self.blocks):
                blocks = [self.blocks[i] for i in group]
                if len(blocks) == 1:
                    x_BTD = run_block(blocks[0], x_BTD, quant_key, segment_ids_BT, positions_BT)
                else:
                    x_BTD, _ = scan_blocks(blocks, x_BTD, quant_key=quant_key, checkpoint=checkpoint, **layout)
        else:
            for block in self.blocks:
                x_BTD = run_block(block, x_BTD, quant_key, segment_ids_BT, positions_BT)
        return self.logits(x_BTD)

    def _cached_blocks(
        self, x_BTD: jax.Array, cache: list[KVCache], cache_position: jax.Array
    ) -> tuple[jax.Array, list[KVCache]]:
        """The blocks of a cached call, group by group as the training call runs them (`cache_groups`); no
        remat and no stochastic rounding: generation has no backward pass."""
        updated = []
        for group, group_cache in zip(self.cache_groups(), cache, strict=True):
            if len(group) == 1:
                x_BTD, group_cache = self.blocks[group[0]](x_BTD, cache=group_cache, cache_position=cache_position)
            else:
                blocks = [self.blocks[i] for i in group]
                x_BTD, group_cache = scan_blocks(
                    blocks, x_BTD, quant_key=None, checkpoint=None, cache=group_cache, cache_position=cache_position
                )
                assert group_cache is not None
            updated.append(group_cache)
        return x_BTD, updated

    def logits(self, x_BTD: jax.Array) -> jax.Array:
        """The LM head: logits [B, T, V] float32 of the last block's output (final norm, then the head)."""
        x_BTD = self.final_norm(x_BTD)
        if self.cfg.tie_embeddings:
            return self.embed.attend(x_BTD)
        head_DV = self.lm_head[...].astype(COMPUTE_DTYPE)
        return jnp.einsum("btd,dv->btv", x_BTD, head_DV, preferred_element_type=jnp.float32)

    def cache_groups(self) -> list[list[int]]:
        """The blocks' indices as they run, one KVCache each: the scan groups (fp4lm.model.scan) with
        model.scan_layers, else one block each."""
        if self.cfg.resolved_scan_layers:
            return block_groups(self.blocks)
        return [[index] for index in range(len(self.blocks))]

    def init_cache(self, batch: int, length: int) -> list[KVCache]:
        """An empty KV cache for `batch` rows of `length` positions, as a cached call takes it: one KVCache per
        entry of `cache_groups`, a scanned group's stacked [L, ...]."""
        kv_heads, head_dim = self.cfg.num_kv_heads, self.cfg.resolved_head_dim
        return [
            KVCache.empty(batch, length, kv_heads, head_dim, layers=len(group) if len(group) > 1 else None)
            for group in self.cache_groups()
        ]


def set_policy(model: Llama, policy: Policy) -> Llama:
    """A new model with `policy` that shares `model`'s parameter values (used for the late bf16 switch).

    The structure is rebuilt abstractly (nnx.eval_shape: no parameters are initialised) and the
    existing state is merged into it, so no weights are copied or re-drawn.
    """
    abstract = nnx.eval_shape(lambda: Llama(model.cfg, model.vocab_size, policy, rngs=nnx.Rngs(0)))
    graphdef, _ = nnx.split(abstract)
    _, state = nnx.split(model)
    return nnx.merge(graphdef, state)


def param_count(model: nnx.Module) -> int:
    """Number of scalar parameters (nnx.Param leaves) in the model."""
    return sum(int(leaf.size) for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)))
