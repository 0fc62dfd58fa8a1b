"""fp4lm.flops against MaxText's accounting, computed by hand for small shapes."""

import pytest

from fp4lm.config import ModelConfig
from fp4lm.flops import training_flops_per_step
from fp4lm.linear_layers import BLOCK_LINEAR_NAMES, block_linear_layers, linear_layers


def _model(**kw):
    base = dict(num_layers=2, d_model=64, num_heads=4, num_kv_heads=2, mlp_dim=128, head_dim=None)
    return ModelConfig(**{**base, **kw})


def test_small_gqa_shape_by_hand():
    # L=2, d=64, 4 heads of 16, 2 KV heads, SwiGLU 128, vocab 100, 3 sequences of 32 tokens.
    tokens = 3 * 32
    qkv = 2 * 64 * (4 + 2 * 2) * 16  # forward FLOPs per token
    o = 2 * 64 * 4 * 16
    mlp = 2 * 64 * 128 * 2 + 2 * 64 * 128  # gate + up, then down
    linear = 3 * (qkv + o + mlp) * tokens * 2
    attention = 3 * (4 * 3 * 32**2 * 4 * 16 / 2) * 2
    lm_head = 3 * 2 * tokens * 64 * 100
    f = training_flops_per_step(_model(), vocab_size=100, seq_len=32, batch_size=3)
    assert f.linear == linear == 42_467_328
    assert f.attention == attention == 2_359_296
    assert f.lm_head == lm_head == 3_686_400
    assert f.embedding == 0
    assert f.total == 48_513_024


def test_explicit_head_dim_differs_from_d_over_heads():
    # d=96 but 4 heads of 32 (q width 128): q/o use 128, k/v use 2*32 = 64.
    m = _model(num_layers=3, d_model=96, num_heads=4, num_kv_heads=2, mlp_dim=256, head_dim=32)
    tokens = 2 * 64
    qkv = 2 * 96 * (4 + 2 * 2) * 32
    o = 2 * 96 * 4 * 32
    mlp = 3 * 2 * 96 * 256
    f = training_flops_per_step(m, vocab_size=50, seq_len=64, batch_size=2)
    assert f.linear == 3 * (qkv + o + mlp) * tokens * 3
    assert f.attention == 3 * (4 * 2 * 64**2 * 4 * 32 / 2) * 3
    assert f.lm_head == 6 * tokens * 96 * 50
    assert f.total == f.linear + f.attention + f.lm_head


def test_llama3_8b_matches_6n_plus_attention_formula():
    """Independent form: 6 * (weight params incl. LM head) per token + 6 * L * seq * heads * head_dim."""
    m = ModelConfig(num_layers=32, d_model=4096, num_heads=32, num_kv_heads=8, mlp_dim=14336)
    per_block = 4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096 + 3 * 4096 * 14336
    assert per_block == 218_103_808
    weights = 32 * per_block + 4096 * 128256
    per_token = 6 * weights + 6 * 32 * 8192 * 32 * 128
    f = training_flops_per_step(m, vocab_size=128256, seq_len=8192, batch_size=1)
    assert f.total == pytest.approx(per_token * 8192, rel=1e-12)
    assert f.total / 8192 == pytest.approx(51.47e9, rel=1e-3)  # ~51.5 GFLOP per token


def test_flops_scale_linearly_with_batch_and_ignore_tied_embeddings():
    one = training_flops_per_step(_model(), 100, 32, 1)
    four = training_flops_per_step(_model(tie_embeddings=True), 100, 32, 4)
    assert four.total == pytest.approx(4 * one.total)


def test_linear_layer_shapes_names_and_sizes():
    layers = block_linear_layers(_model(), 1)
    names = [layer.name for layer in layers]
    assert names == ["attn.q", "attn.k", "attn.v", "attn.o", "mlp.gate", "mlp.up", "mlp.down"]
    assert names == list(BLOCK_LINEAR_NAMES)
    assert layers[1][:3] == ("blocks.1.attn.k", 64, 32) and layers[6][:3] == ("blocks.1.mlp.down", 128, 64)
    assert [layer.path for layer in linear_layers(_model())][6:8] == ["blocks.0.mlp.down", "blocks.1.attn.q"]
    wide_heads = block_linear_layers(_model(head_dim=32), 0)
    assert wide_heads[0][:3] == ("blocks.0.attn.q", 64, 128) and wide_heads[3][:3] == ("blocks.0.attn.o", 128, 64)


def test_moe_blocks_count_active_experts_shared_experts_and_the_router_by_hand():
    """MaxText's DeepSeek-style count: dense first block, then per MoE block the router D·X, the shared
    experts and experts_per_token routed experts of width moe_mlp_dim (not the num_experts held)."""
    m = _model(
        num_layers=3, num_experts=8, experts_per_token=2, moe_mlp_dim=32, num_shared_experts=1, first_dense_layers=1
    )
    tokens = 3 * 32
    attention_weights = 2 * 64 * (4 + 2 * 2) * 16 + 2 * 64 * 4 * 16  # q, k, v and o, forward per token
    dense_mlp = 3 * 2 * 64 * 128
    moe_mlp = 3 * 2 * 64 * 32 * 2 + 3 * 2 * 64 * 32 * 1  # two routed experts, one shared expert
    f = training_flops_per_step(m, vocab_size=100, seq_len=32, batch_size=3)
    assert f.linear == 3 * tokens * (3 * attention_weights + dense_mlp + 2 * moe_mlp)
    assert f.router == 3 * 2 * tokens * 64 * 8 * 2  # two MoE blocks
    assert f.total == f.linear + f.router + f.attention + f.lm_head
    dense = training_flops_per_step(_model(num_layers=3), vocab_size=100, seq_len=32, batch_size=3)
    assert dense.router == 0 and f.attention == dense.attention and f.lm_head == dense.lm_head


@pytest.mark.parametrize(
    ("shape", "active"),
    [
        # Qwen3-235B-A22B: 22B activated parameters (its model card), of which 0.6B are the input embedding
        (dict(num_layers=94, d_model=4096, num_heads=64, num_kv_heads=4, head_dim=128, num_experts=128,
              experts_per_token=8, moe_mlp_dim=1536, vocab=151936), 22.0e9 - 151936 * 4096),
        # Mixtral 8x7B: 12.9B active parameters (Mistral's announcement), 0.13B of them the input embedding
        (dict(num_layers=32, d_model=4096, num_heads=32, num_kv_heads=8, mlp_dim=14336, num_experts=8,
              experts_per_token=2, vocab=32000), 12.9e9 - 32000 * 4096),
    ],
)  # fmt: skip
def test_published_moe_models_come_to_their_published_active_parameters(shape, active):
    """6 FLOPs per active weight per token: the weight FLOPs over 6·tokens give the active parameters."""
    shape = dict(shape)
    vocab = shape.pop("vocab")
    f = training_flops_per_step(ModelConfig(**shape), vocab_size=vocab, seq_len=1, batch_size=1)
    assert (f.linear + f.router + f.lm_head) / 6 == pytest.approx(active, rel=0.02)
