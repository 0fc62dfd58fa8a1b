"""The consumer side of the interop tests, run by the interop environment's Python (torch, transformers and
compressed-tensors; no fp4lm, no JAX): it reads an fp4lm export the way a user of those libraries would and
writes what it computed into an .npz file for the test (tests/interop/test_*.py) to compare with fp4lm.

    python consumer.py logits MODEL_DIR TOKENS.npy --greedy-prefix P --greedy-steps S OUT.npz
        transformers' LlamaForCausalLM in float32: the logits of TOKENS, and the greedy continuation of its
        first P tokens for S steps
    python consumer.py loss MODEL_DIR BATCHES.npz OUT.npz
        the model as transformers loads it (a compressed-tensors checkpoint is decompressed by its
        quantizer, in bfloat16): the mean next-token cross-entropy over the batches' inputs and targets
    python consumer.py decompress MODEL_DIR OUT.npz
        compressed-tensors' own NVFP4 decompression of every quantized layer in the checkpoint
    python consumer.py loss-decompressed MODEL_DIR BATCHES.npz OUT.npz
        `loss` of the compressed-tensors checkpoint decompressed by compressed-tensors itself (`decompress`)
        and loaded by transformers as an unquantized checkpoint of the same architecture: for routed
        experts, which transformers 5.24 decompresses without their global scales (transformers#48371)
"""

from __future__ import annotations

import argparse
import json
import pathlib
import tempfile

import numpy as np
import torch
import transformers
from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from safetensors.torch import load_file, save_file

COMPRESSED_SUFFIXES = ("weight_packed", "weight_scale", "weight_global_scale")


def _model(directory: str, dtype: torch.dtype):
    return transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).eval()


def logits(args) -> dict[str, np.ndarray]:
    model = _model(args.model, torch.float32)
    tokens = torch.tensor(np.load(args.tokens), dtype=torch.long)[None]
    with torch.no_grad():
        all_logits = model(tokens).logits[0].numpy()
        sequence = tokens[:, : args.greedy_prefix]
        for _ in range(args.greedy_steps):
            next_token = model(sequence).logits[:, -1].argmax(-1, keepdim=True)
            sequence = torch.cat([sequence, next_token], dim=1)
    return {"logits": all_logits, "greedy": sequence[0].numpy()}


def loss(args) -> dict[str, np.ndarray]:
    model = _model(args.model, torch.bfloat16)  # compressed-tensors decompresses NVFP4 weights to bfloat16
    return {"loss": _mean_loss(model, args.batches)}


def _mean_loss(model, batches_file: str) -> np.float64:
    batches = np.load(batches_file)
    inputs = torch.tensor(batches["inputs"], dtype=torch.long)
    targets = torch.tensor(batches["targets"], dtype=torch.long)
    losses = []
    with torch.no_grad():
        for batch_inputs, batch_targets in zip(inputs, targets, strict=True):
            batch_logits = model(batch_inputs).logits.float()
            losses.append(torch.nn.functional.cross_entropy(batch_logits.flatten(0, 1), batch_targets.flatten()))
    return np.float64(torch.stack(losses).mean())


def loss_decompressed(args) -> dict[str, np.ndarray]:
    directory = pathlib.Path(args.model)
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(file))
    dense = {name: value for name, value in tensors.items() if not name.endswith(COMPRESSED_SUFFIXES)}
    for module, weight in decompress(args).items():
        dense[f"{module}.weight"] = torch.from_numpy(weight).to(torch.bfloat16)
    config = json.loads((directory / "config.json").read_text())
    del config["quantization_config"]
    with tempfile.TemporaryDirectory() as unquantized:
        (pathlib.Path(unquantized) / "config.json").write_text(json.dumps(config))
        save_file(dense, str(pathlib.Path(unquantized) / "model.safetensors"), metadata={"format": "pt"})
        model = _model(unquantized, torch.bfloat16)
    return {"loss": _mean_loss(model, args.batches)}


def _scheme(directory: pathlib.Path) -> QuantizationScheme:
    config = json.loads((directory / "config.json").read_text())["quantization_config"]
    group = config["config_groups"]["group_0"]
    return QuantizationScheme(targets=group["targets"], weights=QuantizationArgs(**group["weights"]))


def decompress(args) -> dict[str, np.ndarray]:
    directory = pathlib.Path(args.model)
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(file))
    scheme = _scheme(directory)
    modules = sorted(name.removesuffix(".weight_packed") for name in tensors if name.endswith(".weight_packed"))
    weights = {}
    for module in modules:
        state = {suffix: tensors[f"{module}.{suffix}"] for suffix in COMPRESSED_SUFFIXES}
        weights[module] = NVFP4PackedCompressor.decompress(state, scheme)["weight"].float().numpy()
    return weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    logits_parser = commands.add_parser("logits")
    logits_parser.add_argument("model")
    logits_parser.add_argument("tokens")
    logits_parser.add_argument("--greedy-prefix", type=int, required=True)
    logits_parser.add_argument("--greedy-steps", type=int, required=True)
    loss_parser = commands.add_parser("loss")
    loss_parser.add_argument("model")
    loss_parser.add_argument("batches")
    decompress_parser = commands.add_parser("decompress")
    decompress_parser.add_argument("model")
    decompressed_parser = commands.add_parser("loss-decompressed")
    decompressed_parser.add_argument("model")
    decompressed_parser.add_argument("batches")
    for sub in (logits_parser, loss_parser, decompress_parser, decompressed_parser):
        sub.add_argument("out")
    args = parser.parse_args()
    commands_run = {"logits": logits, "loss": loss, "decompress": decompress, "loss-decompressed": loss_decompressed}
    result = commands_run[args.command](args)
    np.savez(args.out, **result)


if __name__ == "__main__":
    main()
