"""Against the real consumer: transformers' LlamaForCausalLM loads the float32 Hugging Face export and gives
fp4lm's logits (max abs difference 1e-4) and the same greedy continuation. Skipped, with the reason, where torch
or transformers is not installed (they are not fp4lm dependencies; install them into the environment to run it)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from fp4lm.export import hf
from fp4lm.export.source import load_source
from fp4lm.model import blocks, layers, llama
from tests.export import fp4lm_forward

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch transformers to run this)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")


def test_transformers_llama_reproduces_fp4lm_logits_and_greedy_tokens(trained_run, tmp_path, monkeypatch):
    for module in (layers, blocks, llama):  # fp4lm in float32, to compare with a float32 torch model
        monkeypatch.setattr(module, "COMPUTE_DTYPE", jnp.float32)
    source = load_source(str(trained_run))
    hf.export_hf(source, tmp_path, dtype="float32")
    model = transformers.LlamaForCausalLM.from_pretrained(str(tmp_path), torch_dtype=torch.float32).eval()
    tokens = np.random.default_rng(0).integers(0, 256, size=24)
    with torch.no_grad():
        theirs = model(torch.tensor(tokens)[None]).logits[0].numpy()
    ours = fp4lm_forward.logits(source.config, source.params, tokens)
    assert np.abs(ours - theirs).max() <= 1e-4
    sequence = list(tokens[:8])
    for _ in range(8):
        next_ours = int(fp4lm_forward.logits(source.config, source.params, np.array(sequence))[-1].argmax())
        with torch.no_grad():
            next_theirs = int(model(torch.tensor(sequence)[None]).logits[0, -1].argmax())
        assert next_ours == next_theirs
        sequence.append(next_ours)
