"""Which Hugging Face architecture an fp4lm model is, and its config.json in both directions.

fp4lm's model is a Llama with options; four transformers classes express the combinations below, and an
export is written as the one that matches the run's settings (anything else is refused by name):

    LlamaForCausalLM      dense MLPs, no qk-norm
    MixtralForCausalLM    routed experts in every block (no dense first blocks), softmax scores, the top-k
                          weights renormalised, no qk-norm
    Qwen3MoeForCausalLM   routed experts, qk-norm, softmax scores, top-k renormalised or not (`norm_topk_prob`),
                          the first k blocks dense (`mlp_only_layers` = 0..k-1, width `intermediate_size`)
    Qwen2MoeForCausalLM   as Qwen3-MoE without qk-norm, plus always-on shared experts: fp4lm's one SwiGLU of
                          width num_shared_experts x moe_mlp_dim is Qwen2-MoE's `shared_expert`

Qwen2-MoE differs from fp4lm in two places that an export makes exact, not approximate. Its shared expert
is gated, `sigmoid(shared_expert_gate · x) · shared_expert(x)`: the export writes a zero gate, so every token
gets sigmoid(0) = 1/2, and the shared expert's down projection times 2 (a power of two: exact in every
format, NVFP4's codes and block scales included, only its global scale doubles). Its q/k/v projections have
biases (`qkv_bias`, on in every published Qwen2-MoE): the export writes zeros. An import checks both (zero
biases, a zero gate) and refuses a checkpoint whose gate or biases were trained, as Qwen1.5-MoE's were.

No MoE class has sigmoid scores or a selection bias (DeepSeek-V3's loss-free balancing), or shared experts
beside qk-norm, so runs with those are refused. Settings that only shape training have nothing to express:
the balancing and z-loss coefficients (written as `router_aux_loss_coef`, which transformers uses only
when training), and the capacity factor: the export computes every (token, expert) pair, as serving engines
do, so a run trained with a capacity gives the same logits wherever its capacity dropped no pair.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fp4lm.config import Config, ModelConfig
from fp4lm.errors import UserError

LLAMA, MIXTRAL = "LlamaForCausalLM", "MixtralForCausalLM"
QWEN2_MOE, QWEN3_MOE = "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"
ARCHITECTURES = (LLAMA, MIXTRAL, QWEN3_MOE, QWEN2_MOE)
MODEL_TYPES = {LLAMA: "llama", MIXTRAL: "mixtral", QWEN3_MOE: "qwen3_moe", QWEN2_MOE: "qwen2_moe"}
SHARED_EXPERT_SCALE = 2.0
"""Qwen2-MoE's shared expert output is scaled by sigmoid(gate · x); a zero gate gives 1/2, and the export's
shared down projection, this many times fp4lm's, gives it back (module docstring)."""

# ModelConfig fields and the config.json keys that express them (None: training only, nothing to express).
EXPRESSED = {
    "num_layers": "num_hidden_layers",
    "d_model": "hidden_size",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "mlp_dim": "intermediate_size",
    "rope_theta": "rope_theta",
    "norm_eps": "rms_norm_eps",
    "tie_embeddings": "tie_word_embeddings",
    "rope_scaling": "rope_scaling",
    "rope_scaling_factor": "rope_scaling",
    "rope_low_freq_factor": "rope_scaling",
    "rope_high_freq_factor": "rope_scaling",
    "rope_original_max_positions": "rope_scaling",
    "remat": None,
    "init_std": None,
    "attention": None,  # how attention runs, not what it computes
    "scan_layers": None,  # how the blocks run, not what they compute
    # mixture of experts: what the architecture checks below allow
    "qk_norm": "q_norm / k_norm",
    "num_experts": "num_local_experts / num_experts",
    "experts_per_token": "num_experts_per_tok",
    "moe_mlp_dim": "intermediate_size / moe_intermediate_size",
    "first_dense_layers": "mlp_only_layers",
    "router_renormalize": "norm_topk_prob",
    "num_shared_experts": "shared_expert_intermediate_size (Qwen2-MoE)",
    "router_score": "refused unless softmax",
    "router_bias_update": "refused unless 0",
    "load_balance_loss": None,
    "router_z_loss": None,
    "capacity_factor": None,  # the export is dropless (module doc)
}


def _refuse(setting: str, why: str, fix: str) -> UserError:
    return UserError(f"{setting} {why}; {fix}")


def architecture_of(model: ModelConfig) -> str:
    """The transformers class that computes what `model` computes; refuses (one line, naming the setting)
    a model none of them can express."""
    defaults = type(model)()
    for field in dataclasses.fields(model):
        value = getattr(model, field.name)
        if field.name not in EXPRESSED and value != getattr(defaults, field.name):
            raise _refuse(
                f"model.{field.name}={value}",
                "has no equivalent in Hugging Face's Llama, Mixtral, Qwen3-MoE or Qwen2-MoE",
                f"export a run trained with the default model.{field.name}={getattr(defaults, field.name)}",
            )
    if model.num_experts == 0:
        if model.qk_norm:
            raise _refuse(
                "model.qk_norm=True",
                "in a dense model is Qwen3's attention, which the export does not write",
                "export a run trained without qk-norm, or with routed experts (Qwen3-MoE)",
            )
        return LLAMA
    if model.router_score != "softmax":
        raise _refuse(
            f"model.router_score={model.router_score}",
            "has no equivalent in Mixtral or Qwen-MoE, whose routers take a softmax",
            "export a run trained with model.router_score=softmax",
        )
    if model.router_bias_update:
        raise _refuse(
            f"model.router_bias_update={model.router_bias_update}",
            "trains a selection bias that Mixtral and Qwen-MoE have no place for",
            "export a run trained with model.router_bias_update=0",
        )
    if model.num_shared_experts and model.qk_norm:
        raise _refuse(
            f"model.num_shared_experts={model.num_shared_experts} with model.qk_norm=True",
            "has no equivalent: Qwen2-MoE has shared experts but no qk-norm, Qwen3-MoE qk-norm but no shared experts",
            "export a run trained without one of the two",
        )
    if model.num_shared_experts:
        return QWEN2_MOE
    if model.qk_norm:
        return QWEN3_MOE
    if model.first_dense_layers or not model.router_renormalize:
        setting = (
            f"model.first_dense_layers={model.first_dense_layers}"
            if model.first_dense_layers
            else "model.router_renormalize=False"
        )
        raise _refuse(
            setting,
            "without model.qk_norm or shared experts has no equivalent: Mixtral has neither dense blocks nor "
            "unnormalised top-k weights, Qwen3-MoE (which has both) always normalises q and k, and Qwen2-MoE always "
            "has a shared expert",
            "export a run trained with model.qk_norm=true (Qwen3-MoE), with model.num_shared_experts above 0 "
            "(Qwen2-MoE), or with every block routed and model.router_renormalize=true (Mixtral)",
        )
    return MIXTRAL


def _rope_settings(model: ModelConfig) -> dict[str, Any]:
    """`rope_theta` / `rope_scaling` (transformers 4.x) beside `rope_parameters` (5.x)."""
    rope_scaling = None
    if model.rope_scaling == "llama3":
        rope_scaling = {
            "rope_type": "llama3",
            "factor": model.rope_scaling_factor,
            "low_freq_factor": model.rope_low_freq_factor,
            "high_freq_factor": model.rope_high_freq_factor,
            "original_max_position_embeddings": model.rope_original_max_positions,
        }
    rope_parameters = {**(rope_scaling or {"rope_type": "default"}), "rope_theta": model.rope_theta}
    return {"rope_theta": model.rope_theta, "rope_scaling": rope_scaling, "rope_parameters": rope_parameters}


def _moe_settings(model: ModelConfig, architecture: str) -> dict[str, Any]:
    common = {
        "num_experts_per_tok": model.experts_per_token,
        "router_aux_loss_coef": model.load_balance_loss,
        "output_router_logits": False,
    }
    if architecture == MIXTRAL:
        return {
            **common,
            "num_local_experts": model.num_experts,
            "intermediate_size": model.resolved_moe_mlp_dim,
            "router_jitter_noise": 0.0,
            "sliding_window": None,
        }
    qwen = {
        **common,
        "num_experts": model.num_experts,
        "moe_intermediate_size": model.resolved_moe_mlp_dim,
        "intermediate_size": model.mlp_dim,  # the dense first blocks'
        "norm_topk_prob": model.router_renormalize,
        "decoder_sparse_step": 1,
        "mlp_only_layers": list(range(model.first_dense_layers)),
        "use_sliding_window": False,
        "sliding_window": None,
    }
    if architecture == QWEN2_MOE:
        shared_width = model.num_shared_experts * model.resolved_moe_mlp_dim
        return {**qwen, "shared_expert_intermediate_size": shared_width, "qkv_bias": True}
    return qwen


def hf_config(config: Config, *, vocab_size: int, bos_id: int | None, eos_id: int | None, dtype: str) -> dict:
    """`config.json` of the model's architecture (valid for transformers 4.45+ and 5.x): both spellings are
    written where the versions differ, `torch_dtype` (4.x) and `dtype` (5.x), and the RoPE keys."""
    m = config.model
    architecture = architecture_of(m)
    payload = {
        "architectures": [architecture],
        "model_type": MODEL_TYPES[architecture],
        "vocab_size": vocab_size,
        "hidden_size": m.d_model,
        "intermediate_size": m.mlp_dim,
        "num_hidden_layers": m.num_layers,
        "num_attention_heads": m.num_heads,
        "num_key_value_heads": m.num_kv_heads,
        "head_dim": m.resolved_head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.data.seq_len,
        "rms_norm_eps": m.norm_eps,
        **_rope_settings(m),
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": m.init_std,
        "tie_word_embeddings": m.tie_embeddings,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "use_cache": True,
        "torch_dtype": dtype,
        "dtype": dtype,
    }
    if architecture == LLAMA:
        return {**payload, "mlp_bias": False, "pretraining_tp": 1}
    return {**payload, **_moe_settings(m, architecture)}


def _first_dense_layers(hf: dict, refuse) -> int:
    """Qwen3-MoE's dense blocks, which fp4lm has only as a prefix: `mlp_only_layers` = 0..k-1, every other
    block routed (`decoder_sparse_step` 1)."""
    dense = sorted(int(i) for i in hf.get("mlp_only_layers") or [])
    if int(hf.get("decoder_sparse_step", 1)) != 1:
        raise refuse(f"decoder_sparse_step={hf['decoder_sparse_step']} (experts every few blocks)")
    if dense != list(range(len(dense))):
        raise refuse(f"mlp_only_layers={dense} (fp4lm's dense blocks are the first k)")
    return len(dense)


def moe_settings(hf: dict, architecture: str, refuse) -> dict[str, Any]:
    """The model.* keys a Mixtral, Qwen3-MoE or Qwen2-MoE config.json decides; `refuse(what)` makes the error
    for a setting fp4lm cannot load."""
    if architecture == MIXTRAL:
        if hf.get("sliding_window"):
            raise refuse(f"sliding_window={hf['sliding_window']} (fp4lm's attention is full causal)")
        return {
            "model.num_experts": int(hf["num_local_experts"]),
            "model.experts_per_token": int(hf["num_experts_per_tok"]),
            "model.moe_mlp_dim": int(hf["intermediate_size"]),
            "model.mlp_dim": int(hf["intermediate_size"]),
            "model.router_renormalize": True,
        }
    if hf.get("use_sliding_window"):
        raise refuse("use_sliding_window=true (fp4lm's attention is full causal)")
    width = int(hf["moe_intermediate_size"])
    settings = {
        "model.num_experts": int(hf["num_experts"]),
        "model.experts_per_token": int(hf["num_experts_per_tok"]),
        "model.moe_mlp_dim": width,
        "model.mlp_dim": int(hf["intermediate_size"]),
        "model.first_dense_layers": _first_dense_layers(hf, refuse),
        "model.router_renormalize": bool(hf.get("norm_topk_prob", False)),
        "model.qk_norm": architecture == QWEN3_MOE,
    }
    if architecture == QWEN2_MOE:
        shared_width = int(hf["shared_expert_intermediate_size"])
        if shared_width <= 0 or shared_width % width:
            raise refuse(
                f"shared_expert_intermediate_size={shared_width}, not a positive multiple of moe_intermediate_size="
                f"{width} (fp4lm's shared experts are num_shared_experts x moe_mlp_dim wide)"
            )
        settings["model.num_shared_experts"] = shared_width // width
    return settings
