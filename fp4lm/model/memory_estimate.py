"""The trainer's per-device memory estimate from the config alone: integer arithmetic, so it answers at once
for any size. fp4lm.train.memory checks a run with it before anything is built; the planner
(fp4lm.project.fit) checks every planned layout with it. What each term counts is in docs/memory_estimate.md;
how it compares with measured runs (it errs high, which `OVERESTIMATE_MARGIN` allows for) is in BENCHMARKS.md.
It lives here, below both, so that they share one estimate."""

from __future__ import annotations

import dataclasses
import math

from fp4lm.config import Config, ModelConfig
from fp4lm.linear_layers import model_parameters
from fp4lm.model.expert_parallel import experts_per_device, rows_bound
from fp4lm.model.routing import expert_capacity
from fp4lm.tokenizer import planned_model_vocab_size

STATE_BYTES_PER_PARAM = 4 + 8 + 4 + 2  # float32 master, AdamW moments, float32 gradient, bfloat16 copy
OVERESTIMATE_MARGIN = 1.6  # the estimate errs high by up to 60% (see the calibration above)


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one device needs for a training step."""

    params: int  # parameters of the whole model
    state: int  # this device's share of weights, optimizer moments and gradients
    activations: int  # kept for backward, plus one block's working set
    logits: int

    @property
    def total(self) -> int:
        return self.state + self.activations + self.logits

    def largest_part(self) -> str:
        parts = {"state": self.state, "activations": self.activations, "logits": self.logits}
        return max(parts, key=lambda name: parts[name])


def parameter_count(config: Config) -> int:
    """Parameters of the model (fp4lm.linear_layers.model_parameters, with the vocabulary the run will have)."""
    return model_parameters(config.model, planned_model_vocab_size(config.data)).held


def quantized_block_indices(config: Config) -> range:
    """Blocks whose projections run a quantized recipe (precision.rules aside: counted as quantized)."""
    p, layers = config.precision, config.model.num_layers
    return (
        range(0)
        if p.recipe == "bf16"
        else range(p.bf16_first_layers, max(p.bf16_first_layers, layers - p.bf16_last_layers))
    )


def estimate_training_memory(config: Config, mesh_sizes: tuple[int, int, int], expert: int = 1) -> MemoryEstimate:
    """Bytes per device for training `config` on a mesh of (data, fsdp, tensor) sizes and mesh.expert =
    `expert`, which shards parameters and the batch as fsdp does (see the module doc)."""
    data, fsdp, tensor = mesh_sizes
    shards = fsdp * expert  # the batch's and the parameters' shards besides data and tensor
    m = config.model
    accum = config.train.grad_accum_steps  # activations are a micro-batch's; gradients get a float32 sum
    batch = math.ceil(config.train.batch_size // accum / (data * shards))
    seq = config.data.seq_len
    tokens = batch * seq
    heads, kv_heads = math.ceil(m.num_heads / tensor), math.ceil(m.num_kv_heads / tensor)
    mlp, vocab = math.ceil(m.mlp_dim / tensor), math.ceil(planned_model_vocab_size(config.data) / tensor)
    head_dim = m.resolved_head_dim

    params = parameter_count(config)
    state = (STATE_BYTES_PER_PARAM + (4 if accum > 1 else 0)) * math.ceil(params / (shards * tensor))
    stream = 32 * tokens * m.d_model
    projections = 4 * tokens * (heads + 2 * kv_heads) * head_dim
    scores = 14 * batch * heads * seq * seq
    attention_operands = 5 * m.d_model + 2 * (heads + kv_heads) * head_dim  # inputs + outputs of q, k, v, o
    quantized = quantized_block_indices(config)
    kinds = {False: _dense_mlp(tokens, m.d_model, mlp)}  # is a MoE block -> its MLP's figures
    if m.num_experts:
        global_tokens = config.train.batch_size // accum * seq
        kinds[True] = _moe_mlp(m, tokens, tensor, global_tokens, owners=data * fsdp * tensor, expert=expert)
    activations = 0
    working_set = 0
    for moe, (mlp_kept, mlp_operands) in kinds.items():
        count = m.moe_block_count() if moe else m.num_layers - m.moe_block_count()
        quantized_here = m.moe_block_count(quantized) if moe else len(quantized) - m.moe_block_count(quantized)
        block = stream + projections + mlp_kept + scores
        kept_per_block = {"none": block, "full": 4 * tokens * m.d_model}.get(m.remat, block - scores)
        quantization = 6 * (tokens * attention_operands + mlp_operands)
        if m.remat == "full":  # recomputed with the block: only the block being differentiated holds them
            working_set = max(working_set, block - scores + (quantization if quantized else 0))
            quantized_here = 0
        activations += count * kept_per_block + quantized_here * quantization
        working_set = max(working_set, stream + projections + mlp_kept)
    activations += working_set + 8 * batch * heads * seq * seq
    logits = 12 * tokens * vocab
    return MemoryEstimate(params=params, state=state, activations=activations, logits=logits)


def _dense_mlp(tokens: int, d_model: int, mlp: int) -> tuple[int, int]:
    """(bytes kept, quantized operand elements) of a dense SwiGLU of width `mlp` (this device's)."""
    return 16 * tokens * mlp, tokens * (2 * d_model + 3 * mlp)


def _moe_mlp(
    m: ModelConfig, tokens: int, tensor: int, global_tokens: int, *, owners: int, expert: int
) -> tuple[int, int]:
    """(bytes kept, quantized operand elements) of a MoE block's MLP (fp4lm.model.moe) on one device.

    Per token of the device: the router's float32 logits, scores and probabilities [X] (12·X bytes) and the
    shared experts' SwiGLU of width S (split over tensor). Per (token, expert) row that the device's experts
    run: a gathered bfloat16 input row [D], a SwiGLU of width M = moe_mlp_dim like the dense one (16·M)
    and an output row [D] in bfloat16 and float32 (2 + 2 + 4 + 4 bytes per D). Never [tokens, X, D]:
    dispatch is a sort and a gather (moe.py). On one device those rows are its tokens' k pairs. On more
    (expert parallelism, fp4lm/model/expert_parallel.py) every device gathers the whole batch's tokens and
    routing and keeps a float32 sum of its outputs (6·D + 8·k bytes per token of the batch), and runs
    whole experts (M unsplit) over the worst case of rows its experts can receive (`rows_bound`).
    The routed experts keep no quantized operands: their grouped GEMMs save the bf16 rows counted here and
    quantize them again in the backward pass (fp4lm.quant.grouped); only the shared experts' count."""
    k, d, width = m.experts_per_token, m.d_model, m.resolved_moe_mlp_dim
    shared = math.ceil(m.num_shared_experts * width / tensor)
    per_token = 12 * m.num_experts + 16 * shared
    shared_operands = tokens * (2 * d + 3 * shared) if shared else 0
    if owners * expert == 1:  # one device
        rows, gathered = tokens * k, 0
    else:
        runs = experts_per_device(m.num_experts, expert=expert, owners=owners)
        rows = rows_bound(global_tokens, k, runs, expert_capacity(m, global_tokens))
        gathered = global_tokens * (6 * d + 8 * k)
    kept = tokens * per_token + rows * (12 * d + 16 * width) + gathered
    return kept, shared_operands


def exceeds(total: int, limit_bytes: float) -> bool:
    """Whether an estimate of `total` bytes cannot fit in `limit_bytes`, even allowing for the estimate erring
    `OVERESTIMATE_MARGIN` high: the trainer's refusal and the planner's "does not fit"."""
    return total > OVERESTIMATE_MARGIN * limit_bytes
