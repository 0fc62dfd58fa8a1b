"""A NumPy forward pass of a Hugging Face `LlamaForCausalLM`, `MixtralForCausalLM`, `Qwen3MoeForCausalLM` or
`Qwen2MoeForCausalLM` checkpoint, written from the Hugging Face modelling code's definitions (not from
fp4lm's): RMSNorm, rotary embeddings applied with `rotate_half`, grouped-query attention through `repeat_kv`
(Qwen3-MoE: q and k RMS-normalised per head first; Qwen2-MoE: q/k/v biases), SwiGLU MLP or a sparse MoE
block (softmax over the experts, the top k, renormalised for Mixtral and for the Qwen models'
`norm_topk_prob`; Qwen2-MoE adds its shared expert scaled by sigmoid(shared_expert_gate · x)), float32
throughout. It reads only
config.json and the tensors under their Hugging Face names, so it checks the export's names, layouts and
config."""

from __future__ import annotations

import numpy as np


def rms_norm(x, weight, eps):
    variance = np.mean(x * x, axis=-1, keepdims=True)
    return weight * (x / np.sqrt(variance + eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rope_cos_sin(length, head_dim, theta, inv_freq=None):
    if inv_freq is None:
        inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
    freqs = np.arange(length, dtype=np.float32)[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)  # [T, E]
    return np.cos(emb), np.sin(emb)


def linear(x, weight, bias=None):
    """nn.Linear: x @ weight.T with weight [out, in] (+ bias [out])."""
    return x @ weight.T if bias is None else x @ weight.T + bias


def attention(x, w, prefix, cfg, cos, sin):
    T = x.shape[0]
    H, K, E = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    bias = {name: w.get(f"{prefix}.{name}_proj.bias") for name in "qkv"}  # Qwen2-MoE's qkv_bias
    q = linear(x, w[f"{prefix}.q_proj.weight"], bias["q"]).reshape(T, H, E)
    k = linear(x, w[f"{prefix}.k_proj.weight"], bias["k"]).reshape(T, K, E)
    if cfg.get("model_type") == "qwen3_moe":  # Qwen3: each head's q and k RMS-normalised over E
        q = rms_norm(q, w[f"{prefix}.q_norm.weight"], cfg["rms_norm_eps"])
        k = rms_norm(k, w[f"{prefix}.k_norm.weight"], cfg["rms_norm_eps"])
    q, k = q.transpose(1, 0, 2), k.transpose(1, 0, 2)  # [H, T, E], [K, T, E]
    v = linear(x, w[f"{prefix}.v_proj.weight"], bias["v"]).reshape(T, K, E).transpose(1, 0, 2)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    k = np.repeat(k, H // K, axis=0)  # repeat_kv: query head h reads key/value head h // (H / K)
    v = np.repeat(v, H // K, axis=0)
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(E)
    scores = np.where(np.tril(np.ones((T, T), bool)), scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = (probs @ v).transpose(1, 0, 2).reshape(T, H * E)
    return linear(out, w[f"{prefix}.o_proj.weight"])


def mlp(x, w, prefix, names=("gate_proj", "up_proj", "down_proj")):
    gate_name, up_name, down_name = names
    gate = linear(x, w[f"{prefix}.{gate_name}.weight"])
    silu = gate / (1.0 + np.exp(-gate))
    return linear(silu * linear(x, w[f"{prefix}.{up_name}.weight"]), w[f"{prefix}.{down_name}.weight"])


def sparse_moe(x, w, prefix, cfg, names):
    """The sparse MoE block: router softmax over all experts, the top k per token, their weights renormalised
    where the model does it, each token's output the weighted sum of its experts' SwiGLUs."""
    logits = linear(x, w[f"{prefix}.gate.weight"])  # [T, X]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    k = cfg["num_experts_per_tok"]
    chosen = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
    weights = np.take_along_axis(probs, chosen, axis=-1)
    if cfg["model_type"] == "mixtral" or cfg.get("norm_topk_prob"):
        weights /= weights.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for expert, weight in zip(chosen[t], weights[t], strict=True):
            out[t] += weight * mlp(x[t : t + 1], w, f"{prefix}.experts.{expert}", names)[0]
    return out


def feed_forward(x, w, index, cfg):
    """Block `index`'s MLP: dense (Llama, the Qwen models' mlp_only_layers) or the sparse MoE block."""
    layer = f"model.layers.{index}"
    if cfg["model_type"] == "mixtral":
        return sparse_moe(x, w, f"{layer}.block_sparse_moe", cfg, ("w1", "w3", "w2"))
    if cfg["model_type"] not in ("qwen3_moe", "qwen2_moe") or index in cfg["mlp_only_layers"]:
        return mlp(x, w, f"{layer}.mlp")
    out = sparse_moe(x, w, f"{layer}.mlp", cfg, ("gate_proj", "up_proj", "down_proj"))
    if cfg["model_type"] == "qwen2_moe":
        gate = linear(x, w[f"{layer}.mlp.shared_expert_gate.weight"])  # [T, 1]
        out = out + 1.0 / (1.0 + np.exp(-gate)) * mlp(x, w, f"{layer}.mlp.shared_expert")
    return out


def forward(tokens, weights: dict, cfg: dict, inv_freq=None) -> np.ndarray:
    """Logits [T, V] (float32) of one sequence."""
    w = {name: np.asarray(value, np.float32) for name, value in weights.items()}
    eps = cfg["rms_norm_eps"]
    cos, sin = rope_cos_sin(len(tokens), cfg["head_dim"], cfg["rope_theta"], inv_freq)
    x = w["model.embed_tokens.weight"][np.asarray(tokens)]
    for i in range(cfg["num_hidden_layers"]):
        layer = f"model.layers.{i}"
        x = x + attention(
            rms_norm(x, w[f"{layer}.input_layernorm.weight"], eps), w, f"{layer}.self_attn", cfg, cos, sin
        )
        x = x + feed_forward(rms_norm(x, w[f"{layer}.post_attention_layernorm.weight"], eps), w, i, cfg)
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    return x @ head.T
