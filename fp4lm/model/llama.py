"""The Llama-family decoder: embedding, N pre-norm blocks, final RMSNorm, LM head (optionally tied).

    logits_BTV = head(norm(block_{N-1}( ... block_0(embed(tokens_BT)) ... )))

With `model.scan_layers` the blocks run in a `lax.scan` per group of equal precision (fp4lm.model.scan): the
same parameters, precision, stochastic-rounding keys and telemetry, one compiled block per group.

Only the block projections go through the precision policy; the embedding, the LM head and the
attention score/value matmuls stay bfloat16 with float32 accumulation (the latter FP8 with the policy's
`attention="fp8"`, precision.attention), and logits are float32.
"""

from __future__ import annotations

import functools
from typing import get_args

import jax
import jax.numpy as jnp
from flax import nnx

from fp4lm.config import ModelConfig, RematMode
from fp4lm.linear_layers import linear_layers
from fp4lm.model.blocks import Block
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

    def __call__(
        self,
        tokens_BT: jax.Array,
        *,
        quant_key: jax.Array | None = None,
        segment_ids_BT: jax.Array | None = None,
        positions_BT: jax.Array | None = None,
    ) -> jax.Array:
        """logits_BTV float32.

        quant_key: PRNG key for stochastic rounding (each layer folds in its own seed).
        segment_ids_BT, positions_BT: int [B, T], the rows' document layout (fp4lm.data.pipeline): attention
        stays inside each document and RoPE uses these positions. None (both): plain causal attention over
        the row, positions 0..T-1.
        Telemetry is not returned: turn it on with `collect_layer_stats(model)` and take it with
        `pop_layer_stats(model)` after the call (fp4lm.model.layers).
        """
        layout = {"segment_ids_BT": segment_ids_BT, "positions_BT": positions_BT}
        return self.from_embeddings(self.embed(tokens_BT), quant_key=quant_key, **layout)

    def from_embeddings(
        self,
        x_BTD: jax.Array,
        *,
        quant_key: jax.Array | None = None,
        segment_ids_BT: jax.Array | None = None,
        positions_BT: jax.Array | None = None,
    ) -> jax.Array:
        """Everything after the embedding lookup: blocks, final norm, LM head (same arguments as __call__).

        Separate so that tests and tools can differentiate with respect to the input embeddings, and so
        that fault injection can perturb them from outside the model.
        """
        x_BTD = x_BTD.astype(COMPUTE_DTYPE)

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
            layout = {"segment_ids_BT": segment_ids_BT, "positions_BT": positions_BT}
            for group in block_groups(self.blocks):
                blocks = [self.blocks[i] for i in group]
                if len(blocks) == 1:
                    x_BTD = run_block(blocks[0], x_BTD, quant_key, segment_ids_BT, positions_BT)
                else:
                    x_BTD = scan_blocks(blocks, x_BTD, quant_key=quant_key, checkpoint=checkpoint, **layout)
        else:
            for block in self.blocks:
                x_BTD = run_block(block, x_BTD, quant_key, segment_ids_BT, positions_BT)

        x_BTD = self.final_norm(x_BTD)
        if self.cfg.tie_embeddings:
            return self.embed.attend(x_BTD)
        head_DV = self.lm_head[...].astype(COMPUTE_DTYPE)
        return jnp.einsum("btd,dv->btv", x_BTD, head_DV, preferred_element_type=jnp.float32)


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
