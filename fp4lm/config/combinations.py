"""The rules that tie several keys together, and `validate`, which applies every rule to a config.

A key's own rule (a range, a choice) is declared with its field in fp4lm.config.sections; what is left here
needs two or more keys: heads dividing the width, the bf16 layers fitting the model, micro-batches dividing
the batch. Each raises a one-line `UserError` naming the keys and the fix. Block sizes of the quantized
layers need the recipes: `Policy.from_config` (fp4lm.quant.policy) checks those.
"""

from __future__ import annotations

import dataclasses

from fp4lm.config.fields import check_fields
from fp4lm.config.sections import BPE_MIN_VOCAB_SIZE, BYTE_VOCAB_SIZE, Config
from fp4lm.errors import UserError


def validate(config: Config) -> None:
    """Checks every key's own rule, then every combination, naming the key and the fix."""
    for field in dataclasses.fields(config):  # also for configs built in code
        check_fields(field.name, getattr(config, field.name))
    check_attention_heads(config)
    check_attention_precision(config.model.attention, config.precision.attention)
    check_experts(config)
    check_vocabulary(config)
    check_bf16_layers(config.precision.bf16_first_layers, config.precision.bf16_last_layers, config.model.num_layers)
    check_micro_batches_per_host(config.train.batch_size, config.train.grad_accum_steps)
    check_profile_window(config)
    check_mesh_rest(config)
    check_loss_scale_bounds(config)
    check_process_id(config)


def check_attention_heads(config: Config) -> None:
    m = config.model
    if m.head_dim is None and m.d_model % m.num_heads:
        raise UserError(
            f"model.num_heads={m.num_heads} does not divide model.d_model={m.d_model}; "
            "choose num_heads that divides d_model (or set model.head_dim)"
        )
    if m.num_heads % m.num_kv_heads:
        raise UserError(
            f"model.num_kv_heads={m.num_kv_heads} must divide model.num_heads={m.num_heads} (grouped-query "
            "attention); choose num_kv_heads that divides num_heads"
        )
    if m.resolved_head_dim % 2:
        raise UserError(
            f"head dimension {m.resolved_head_dim} must be even for RoPE; change model.d_model or model.num_heads"
        )


def check_attention_precision(implementation: str, precision: str) -> None:
    """FP8 attention runs on the XLA path only (fp4lm.model.attention): model.attention=cudnn with it is refused.

    jax's cuDNN FP8 attention takes no document or KV-cache masks and needs every scale before the kernel runs
    (amax history), not the per-tensor current scaling of fp4lm's FP8 matmul; `auto` picks XLA for fp8."""
    if implementation == "cudnn" and precision == "fp8":
        raise UserError(
            "model.attention=cudnn cannot run precision.attention=fp8 (FP8 attention runs on the XLA path: jax's "
            "cuDNN FP8 kernel has no document masks and no current scaling); set model.attention=xla or auto, "
            "or precision.attention=bf16",
            settings=("model.attention", "precision.attention"),
        )


def check_experts(config: Config) -> None:
    """A MoE model routes each token to experts_per_token of its num_experts, after first_dense_layers blocks;
    mesh.expert splits the experts evenly, and only a MoE model's."""
    m, expert_devices = config.model, config.mesh.expert
    if not m.num_experts:
        if expert_devices > 1:
            raise UserError(
                f"mesh.expert={expert_devices} but the model is dense (model.num_experts=0): there are no experts "
                "to split; use mesh.fsdp (or mesh.data) for the same parallelism, or set model.num_experts"
            )
        return
    if m.num_experts % expert_devices:
        raise UserError(
            f"mesh.expert={expert_devices} does not divide model.num_experts={m.num_experts}; each device holds "
            "an equal share of the experts: choose a mesh.expert that divides num_experts"
        )
    if m.experts_per_token > m.num_experts:
        raise UserError(
            f"model.experts_per_token={m.experts_per_token} exceeds model.num_experts={m.num_experts}; a token "
            "cannot go to more experts than there are: lower experts_per_token"
        )
    if m.first_dense_layers >= m.num_layers:
        raise UserError(
            f"model.first_dense_layers={m.first_dense_layers} leaves none of the model.num_layers={m.num_layers} "
            "blocks with experts; lower it (or set model.num_experts=0 for a dense model)"
        )


def check_vocabulary(config: Config) -> None:
    """The tokenizer's tokens fit the vocabulary data.vocab_size asks for."""
    tokenizer, vocab_size = config.data.tokenizer, config.data.vocab_size
    if tokenizer == "byte" and vocab_size is not None and vocab_size < BYTE_VOCAB_SIZE:
        raise UserError(
            f"data.tokenizer=byte needs data.vocab_size >= {BYTE_VOCAB_SIZE}; "
            "leave data.vocab_size unset (the model's vocabulary follows the tokenizer)"
        )
    if tokenizer == "bpe" and vocab_size is not None and vocab_size < BPE_MIN_VOCAB_SIZE:
        raise UserError(
            f"data.vocab_size={vocab_size} is too small for BPE; use at least {BPE_MIN_VOCAB_SIZE} (e.g. 2048)"
        )


def check_bf16_layers(first: int, last: int, num_layers: int) -> None:
    """precision.bf16_first_layers and bf16_last_layers (each >= 0: their fields' rule) fit in num_layers.

    The precision policy (fp4lm.quant.policy) applies the same rules to a policy built in code."""
    if first + last > num_layers:
        raise UserError(
            f"precision.bf16_first_layers={first} + precision.bf16_last_layers={last} exceed num_layers={num_layers} "
            "(model.num_layers); lower them"
        )


def check_micro_batches_per_host(batch_size: int, grad_accum_steps: int, process_count: int = 1) -> None:
    """Each process feeds train.batch_size / process_count sequences; they split into equal micro-batches.

    The config knows one process; the trainer checks again with the processes it runs on."""
    per_host = batch_size // process_count
    if per_host % grad_accum_steps == 0:
        return
    if process_count == 1:
        raise UserError(
            f"train.grad_accum_steps={grad_accum_steps} does not divide train.batch_size={batch_size}; "
            "choose a number of micro-batches that divides the batch"
        )
    raise UserError(
        f"train.grad_accum_steps={grad_accum_steps} does not divide the per-host batch of {per_host} sequences "
        f"(train.batch_size={batch_size} over {process_count} processes); choose grad_accum_steps dividing "
        f"{per_host}"
    )


def check_profile_window(config: Config) -> None:
    prof, steps = config.profile, config.train.steps
    last = prof.start_step + prof.steps - 1
    if prof.steps and last > steps:
        raise UserError(
            f"profile window steps {prof.start_step}-{last} (profile.start_step={prof.start_step}, "
            f"profile.steps={prof.steps}) ends beyond train.steps={steps}; move profile.start_step earlier or "
            "trace fewer profile.steps"
        )


def check_mesh_rest(config: Config) -> None:
    """At most one mesh axis takes "the rest of the devices" (-1)."""
    if sum(getattr(config.mesh, f.name) == -1 for f in dataclasses.fields(config.mesh)) > 1:
        raise UserError("only one of mesh.data, mesh.fsdp, mesh.tensor may be -1; give the others a device count")


def check_loss_scale_bounds(config: Config) -> None:
    ls = config.loss_scale
    if ls.min_scale > ls.max_scale:
        raise UserError(f"loss_scale.min_scale={ls.min_scale} exceeds loss_scale.max_scale={ls.max_scale}; lower it")


def check_process_id(config: Config) -> None:
    d = config.distributed
    if d.process_id is not None and d.num_processes is not None and d.process_id >= d.num_processes:
        raise UserError(
            f"distributed.process_id={d.process_id} must be in [0, distributed.num_processes={d.num_processes}); "
            "number the processes from 0"
        )
