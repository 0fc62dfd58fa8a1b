"""fp4lm's Llama parameters under Hugging Face `LlamaForCausalLM` names, and its `config.json`.

The two models compute the same function (checked by tests/export against a NumPy forward written from
the Hugging Face definition): RMSNorm, RoPE in the "rotate half" layout (channel i pairs with i + E/2,
frequencies theta^(-2i/E), heads laid out head-major in the projection's output), grouped-query attention
where query head h reads key/value head h // (H/K), and SwiGLU. So no permutation is needed; only the
kernels are transposed, fp4lm's `[in, out]` to Hugging Face's `[out, in]`.

    embed.table                    [V, D]  model.embed_tokens.weight
    blocks.i.attn_norm.scale       [D]     model.layers.i.input_layernorm.weight
    blocks.i.attn.{q,k,v,o}.kernel         model.layers.i.self_attn.{q,k,v,o}_proj.weight   (transposed)
    blocks.i.mlp_norm.scale        [D]     model.layers.i.post_attention_layernorm.weight
    blocks.i.mlp.{gate,up,down}.kernel     model.layers.i.mlp.{gate,up,down}_proj.weight    (transposed)
    final_norm.scale               [D]     model.norm.weight
    lm_head                        [D, V]  lm_head.weight [V, D] (absent when the embeddings are tied)
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from fp4lm.config import Config, ModelConfig

# fp4lm projection (linear_layers.BLOCK_LINEAR_NAMES) -> Hugging Face module within a decoder layer.
PROJECTIONS = {
    "attn.q": "self_attn.q_proj",
    "attn.k": "self_attn.k_proj",
    "attn.v": "self_attn.v_proj",
    "attn.o": "self_attn.o_proj",
    "mlp.gate": "mlp.gate_proj",
    "mlp.up": "mlp.up_proj",
    "mlp.down": "mlp.down_proj",
}
NORMS = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}
EMBEDDING = "model.embed_tokens"
FINAL_NORM = "model.norm"
LM_HEAD = "lm_head"


def hf_module(path: str) -> str:
    """The Hugging Face module of an fp4lm projection path: blocks.3.attn.q -> model.layers.3.self_attn.q_proj."""
    _, index, name = path.split(".", 2)
    return f"model.layers.{index}.{PROJECTIONS[name]}"


def block_projection_kernels(params: dict, num_layers: int) -> Iterator[tuple[str, np.ndarray]]:
    """(fp4lm path, kernel [in, out]) of every projection, in execution order."""
    for index in range(num_layers):
        block = params["blocks"][index]
        for name in PROJECTIONS:
            module, projection = name.split(".")
            yield f"blocks.{index}.{name}", block[module][projection]["kernel"]


def non_projection_tensors(params: dict, cfg: ModelConfig) -> Iterator[tuple[str, np.ndarray]]:
    """(Hugging Face name, float32 value in Hugging Face layout) of the embedding, the norms and the head."""
    yield f"{EMBEDDING}.weight", params["embed"]["table"]
    for index in range(cfg.num_layers):
        for ours, theirs in NORMS.items():
            yield f"model.layers.{index}.{theirs}.weight", params["blocks"][index][ours]["scale"]
    yield f"{FINAL_NORM}.weight", params["final_norm"]["scale"]
    if not cfg.tie_embeddings:
        yield f"{LM_HEAD}.weight", params["lm_head"].T


def hf_tensors(params: dict, cfg: ModelConfig) -> Iterator[tuple[str, np.ndarray]]:
    """Every parameter under its Hugging Face name, in Hugging Face layout (float32)."""
    yield from non_projection_tensors(params, cfg)
    for path, kernel in block_projection_kernels(params, cfg.num_layers):
        yield f"{hf_module(path)}.weight", kernel.T


def fp4lm_params(tensors: dict[str, np.ndarray], cfg: ModelConfig) -> dict:
    """The inverse of `hf_tensors`: fp4lm's pure-dict parameters (float32) from Hugging Face tensors."""

    def get(name: str) -> np.ndarray:
        return np.asarray(tensors[name], np.float32)

    blocks = {}
    for index in range(cfg.num_layers):
        block: dict = {"attn": {}, "mlp": {}}
        for ours, theirs in NORMS.items():
            block[ours] = {"scale": get(f"model.layers.{index}.{theirs}.weight")}
        for name in PROJECTIONS:
            module, projection = name.split(".")
            block[module][projection] = {"kernel": get(f"{hf_module(f'blocks.{index}.{name}')}.weight").T}
        blocks[index] = block
    params = {"embed": {"table": get(f"{EMBEDDING}.weight")}, "blocks": blocks, "final_norm": {}}
    params["final_norm"]["scale"] = get(f"{FINAL_NORM}.weight")
    if not cfg.tie_embeddings:
        params["lm_head"] = get(f"{LM_HEAD}.weight").T
    return params


def expected_tensor_names(cfg: ModelConfig) -> list[str]:
    """The names a Hugging Face checkpoint of this shape holds."""
    names = [f"{EMBEDDING}.weight", f"{FINAL_NORM}.weight"]
    for index in range(cfg.num_layers):
        names += [f"model.layers.{index}.{theirs}.weight" for theirs in NORMS.values()]
        names += [f"{hf_module(f'blocks.{index}.{name}')}.weight" for name in PROJECTIONS]
    if not cfg.tie_embeddings:
        names.append(f"{LM_HEAD}.weight")
    return names


def hf_config(config: Config, *, vocab_size: int, bos_id: int | None, eos_id: int | None, dtype: str) -> dict:
    """`config.json` for `LlamaForCausalLM` (valid for transformers 4.45+ and 5.x).

    Both spellings are written where the versions differ: `torch_dtype` (4.x) and `dtype` (5.x), and
    `rope_theta` / `rope_scaling` (4.x) beside `rope_parameters` (5.x).
    """
    m = config.model
    rope_scaling = None
    if m.rope_scaling == "llama3":
        rope_scaling = {
            "rope_type": "llama3",
            "factor": m.rope_scaling_factor,
            "low_freq_factor": m.rope_low_freq_factor,
            "high_freq_factor": m.rope_high_freq_factor,
            "original_max_position_embeddings": m.rope_original_max_positions,
        }
    rope_parameters = {**(rope_scaling or {"rope_type": "default"}), "rope_theta": m.rope_theta}
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
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
        "rope_theta": m.rope_theta,
        "rope_scaling": rope_scaling,
        "rope_parameters": rope_parameters,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": m.init_std,
        "tie_word_embeddings": m.tie_embeddings,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pretraining_tp": 1,
        "use_cache": True,
        "torch_dtype": dtype,
        "dtype": dtype,
    }
