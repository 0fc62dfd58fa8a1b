"""fp4lm's parameters under Hugging Face names, for the architectures of fp4lm.hf.architectures.

fp4lm's Llama and Hugging Face's compute the same function (checked by tests/export against a NumPy forward
written from the Hugging Face definitions): RMSNorm, RoPE in the "rotate half" layout (channel i pairs with
i + E/2, heads head-major in the projection's output), grouped-query attention where query head h reads
key/value head h // (H/K), SwiGLU. So nothing is permuted; kernels are transposed, fp4lm's `[in, out]` to
Hugging Face's `[out, in]`, and a routed expert's slice of fp4lm's stacked kernel `[X, in, out]` is its own
tensor. Block i (L = model.layers.i):

    blocks.i.attn_norm.scale        [D]        L.input_layernorm.weight
    blocks.i.attn.{q,k,v,o}.kernel             L.self_attn.{q,k,v,o}_proj.weight            (transposed)
    blocks.i.attn.{q,k}_norm.scale  [E]        L.self_attn.{q,k}_norm.weight               (Qwen3-MoE)
    blocks.i.mlp_norm.scale         [D]        L.post_attention_layernorm.weight
    blocks.i.mlp.{gate,up,down}.kernel         L.mlp.{gate,up,down}_proj.weight             (a dense block)
    blocks.i.mlp.router             [D, X]     L.mlp.gate.weight [X, D]          Qwen3-MoE  (transposed)
                                               L.block_sparse_moe.gate.weight    Mixtral
    blocks.i.mlp.{gate,up,down}.kernel[e]      L.mlp.experts.e.{gate,up,down}_proj.weight   Qwen3-MoE
                                               L.block_sparse_moe.experts.e.{w1,w3,w2}.weight  Mixtral
    blocks.i.mlp.shared.{gate,up,down}.kernel  L.mlp.shared_expert.{gate,up,down}_proj.weight  (Qwen2-MoE;
                                               down times 2, beside a zero L.mlp.shared_expert_gate.weight
                                               [1, D] and zero L.self_attn.{q,k,v}_proj.bias: architectures.py)
    embed.table [V, D] model.embed_tokens.weight; final_norm.scale model.norm.weight;
    lm_head [D, V] lm_head.weight [V, D] (absent when the embeddings are tied)

These are the names of the published Mixtral, Qwen3-MoE and Qwen2-MoE checkpoints, which vLLM, ModelOpt and
compressed-tensors read; transformers 5 fuses the experts into one tensor when it loads them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np

from fp4lm.config import ModelConfig
from fp4lm.hf.architectures import MIXTRAL, QWEN2_MOE, SHARED_EXPERT_SCALE, architecture_of

# fp4lm projection (linear_layers.BLOCK_LINEAR_NAMES) -> Hugging Face module within a decoder layer.
PROJECTIONS = {
    "attn.q": "self_attn.q_proj",
    "attn.k": "self_attn.k_proj",
    "attn.v": "self_attn.v_proj",
    "attn.o": "self_attn.o_proj",
    "mlp.gate": "mlp.gate_proj",
    "mlp.up": "mlp.up_proj",
    "mlp.down": "mlp.down_proj",
    "mlp.shared.gate": "mlp.shared_expert.gate_proj",
    "mlp.shared.up": "mlp.shared_expert.up_proj",
    "mlp.shared.down": "mlp.shared_expert.down_proj",
}
NORMS = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}
QK_NORMS = {"q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm"}
# fp4lm expert projection (linear_layers.EXPERT_LINEAR_NAMES, less "mlp.experts.") -> each architecture's name.
EXPERT_PROJECTIONS = {
    MIXTRAL: ("block_sparse_moe", {"gate": "w1", "up": "w3", "down": "w2"}),
    "default": ("mlp", {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}),
}
EMBEDDING = "model.embed_tokens"
FINAL_NORM = "model.norm"
LM_HEAD = "lm_head"


@dataclasses.dataclass(frozen=True)
class Entry:
    """One Hugging Face tensor: where fp4lm keeps it and how it is laid out there. A tensor fp4lm has no
    parameter for (Qwen2-MoE's q/k/v biases and shared-expert gate) has no `param` and is zero."""

    hf_name: str
    param: tuple  # keys into fp4lm's pure-dict parameters; (): a zero tensor of `zeros_shape`
    transpose: bool = False  # fp4lm [in, out] <-> Hugging Face [out, in]
    expert: int | None = None  # one expert's slice of a stacked [X, in, out] kernel
    layer: str | None = None  # the fp4lm layer path of a projection (blocks.3.attn.q, blocks.3.mlp.experts.up)
    scale: float = 1.0  # Hugging Face's tensor is fp4lm's times this power of two (exact both ways)
    zeros_shape: tuple[int, ...] = ()


def hf_module(path: str) -> str:
    """The Hugging Face module of an fp4lm projection path: blocks.3.attn.q -> model.layers.3.self_attn.q_proj."""
    _, index, name = path.split(".", 2)
    return f"model.layers.{index}.{PROJECTIONS[name]}"


def expert_module(path: str, expert: int, architecture: str) -> str:
    """blocks.3.mlp.experts.up, expert 5 -> model.layers.3.mlp.experts.5.up_proj (Mixtral: ...experts.5.w3)."""
    _, index, name = path.split(".", 2)
    parent, names = EXPERT_PROJECTIONS.get(architecture, EXPERT_PROJECTIONS["default"])
    return f"model.layers.{index}.{parent}.experts.{expert}.{names[name.removeprefix('mlp.experts.')]}"


def projection_module(path: str, architecture: str) -> str:
    """`hf_module` of a projection, or `expert_module` of one expert's slice, named `{experts path}.{e}`
    (blocks.3.mlp.experts.up.5), as the per-expert telemetry and the NVFP4 export name it."""
    if ".mlp.experts." not in path:
        return hf_module(path)
    layer, expert = path.rsplit(".", 1)
    return expert_module(layer, int(expert), architecture)


def expert_kernels(params: dict, cfg: ModelConfig) -> Iterator[tuple[str, np.ndarray]]:
    """(`{experts path}.{e}`, expert e's kernel [in, out]) of every routed expert, block by block."""
    for entry in entries(cfg):
        if entry.expert is not None:
            yield f"{entry.layer}.{entry.expert}", _get(params, entry.param)[entry.expert]


def router_module(index: int, architecture: str) -> str:
    parent, _ = EXPERT_PROJECTIONS.get(architecture, EXPERT_PROJECTIONS["default"])
    return f"model.layers.{index}.{parent}.gate"


def shared_expert_gate_module(index: int) -> str:
    """Qwen2-MoE's gate of block `index`'s shared expert, a Linear [1, D] the export writes as zeros."""
    return f"model.layers.{index}.mlp.shared_expert_gate"


def router_modules(cfg: ModelConfig) -> list[str]:
    """The routers' modules (Linear layers in Hugging Face's models), which stay unquantized."""
    architecture = architecture_of(cfg)
    return [router_module(index, architecture) for index in range(cfg.num_layers) if cfg.is_moe_block(index)]


def _block_entries(cfg: ModelConfig, index: int, architecture: str) -> Iterator[Entry]:
    layer = f"model.layers.{index}"
    for ours, theirs in NORMS.items():
        yield Entry(f"{layer}.{theirs}.weight", ("blocks", index, ours, "scale"))
    if cfg.qk_norm:
        for ours, theirs in QK_NORMS.items():
            yield Entry(f"{layer}.{theirs}.weight", ("blocks", index, "attn", ours, "scale"))
    names = [name for name in PROJECTIONS if name.startswith("attn.")]
    if not cfg.is_moe_block(index):
        names += ["mlp.gate", "mlp.up", "mlp.down"]
    for name in names:
        module, projection = name.split(".")
        path = f"blocks.{index}.{name}"
        yield Entry(f"{hf_module(path)}.weight", ("blocks", index, module, projection, "kernel"), True, layer=path)
    if architecture == QWEN2_MOE:
        for name, width in (("q", cfg.num_heads), ("k", cfg.num_kv_heads), ("v", cfg.num_kv_heads)):
            bias = f"{hf_module(f'blocks.{index}.attn.{name}')}.bias"
            yield Entry(bias, (), zeros_shape=(width * cfg.resolved_head_dim,))
    if not cfg.is_moe_block(index):
        return
    yield Entry(f"{router_module(index, architecture)}.weight", ("blocks", index, "mlp", "router"), True)
    for projection in ("gate", "up", "down"):
        path = f"blocks.{index}.mlp.experts.{projection}"
        for expert in range(cfg.num_experts):
            name = f"{expert_module(path, expert, architecture)}.weight"
            yield Entry(name, ("blocks", index, "mlp", projection, "kernel"), True, expert, path)
    if cfg.num_shared_experts:
        for projection in ("gate", "up", "down"):
            path = f"blocks.{index}.mlp.shared.{projection}"
            param = ("blocks", index, "mlp", "shared", projection, "kernel")
            scale = SHARED_EXPERT_SCALE if projection == "down" else 1.0
            yield Entry(f"{hf_module(path)}.weight", param, True, layer=path, scale=scale)
        yield Entry(f"{shared_expert_gate_module(index)}.weight", (), zeros_shape=(1, cfg.d_model))


def entries(cfg: ModelConfig) -> list[Entry]:
    """Every tensor of the model's Hugging Face checkpoint, in order; refuses a model no architecture
    expresses (fp4lm.hf.architectures)."""
    architecture = architecture_of(cfg)
    result = [Entry(f"{EMBEDDING}.weight", ("embed", "table"))]
    for index in range(cfg.num_layers):
        result += _block_entries(cfg, index, architecture)
    result.append(Entry(f"{FINAL_NORM}.weight", ("final_norm", "scale")))
    if not cfg.tie_embeddings:
        result.append(Entry(f"{LM_HEAD}.weight", ("lm_head",), True))
    return result


def _get(params: dict, keys: tuple) -> Any:
    for key in keys:
        params = params[key]
    return params


def _put(params: dict, keys: tuple, value) -> None:
    for key in keys[:-1]:
        params = params.setdefault(key, {})
    params[keys[-1]] = value


def _fp4lm_value(params: dict, entry: Entry) -> np.ndarray:
    """The parameter (an expert's slice) as Hugging Face means it, in fp4lm's layout ([in, out])."""
    value = _get(params, entry.param)
    value = value if entry.expert is None else value[entry.expert]
    return value if entry.scale == 1.0 else value * np.float32(entry.scale)


def hf_value(params: dict, entry: Entry) -> np.ndarray:
    """The tensor of `entry` in Hugging Face's layout."""
    if not entry.param:
        return np.zeros(entry.zeros_shape, np.float32)
    value = _fp4lm_value(params, entry)
    return value.T if entry.transpose else value


def hf_tensors(params: dict, cfg: ModelConfig) -> Iterator[tuple[str, np.ndarray]]:
    """Every parameter under its Hugging Face name, in Hugging Face layout (float32)."""
    for entry in entries(cfg):
        yield entry.hf_name, hf_value(params, entry)


def block_projection_kernels(params: dict, cfg: ModelConfig) -> Iterator[tuple[str, np.ndarray]]:
    """(fp4lm path, kernel [in, out]) of every projection that is not a routed expert's, in execution order,
    as the Hugging Face checkpoint holds it (Qwen2-MoE's shared down projection scaled: `Entry.scale`)."""
    for entry in entries(cfg):
        if entry.layer is not None and entry.expert is None:
            yield entry.layer, _fp4lm_value(params, entry)


def non_projection_tensors(params: dict, cfg: ModelConfig) -> Iterator[tuple[str, np.ndarray]]:
    """(Hugging Face name, float32 value in Hugging Face layout) of what is never quantized: the embedding,
    the norms, the routers, the head (and Qwen2-MoE's zero biases and shared-expert gates)."""
    for entry in entries(cfg):
        if entry.layer is None:
            yield entry.hf_name, hf_value(params, entry)


def fp4lm_params(tensors: dict[str, np.ndarray], cfg: ModelConfig) -> dict:
    """The inverse of `hf_tensors`: fp4lm's pure-dict parameters (float32) from Hugging Face tensors."""
    params: dict = {}
    stacked: dict[tuple, list] = {}
    for entry in entries(cfg):
        if not entry.param:
            continue  # a zero tensor fp4lm has no parameter for (the import checks it is zero)
        value = np.asarray(tensors[entry.hf_name], np.float32)
        value = value.T if entry.transpose else value
        value = value if entry.scale == 1.0 else value / np.float32(entry.scale)
        if entry.expert is not None:
            stacked.setdefault(entry.param, []).append(value)  # entries list the experts in order
            continue
        _put(params, entry.param, value)
    for keys, experts in stacked.items():
        _put(params, keys, np.stack(experts))
    return params


def zero_tensor_names(cfg: ModelConfig) -> list[str]:
    """The tensors a checkpoint of this shape must hold as zeros (fp4lm has no parameter for them)."""
    return [entry.hf_name for entry in entries(cfg) if not entry.param]


def shared_expert_gates(cfg: ModelConfig) -> list[str]:
    """Qwen2-MoE's shared-expert gate modules ([1, D] Linear layers), which stay unquantized as the routers do."""
    if not cfg.num_shared_experts:
        return []
    return [shared_expert_gate_module(index) for index in range(cfg.num_layers) if cfg.is_moe_block(index)]


def expected_tensor_names(cfg: ModelConfig) -> list[str]:
    """The names a Hugging Face checkpoint of this shape holds."""
    return [entry.hf_name for entry in entries(cfg)]
