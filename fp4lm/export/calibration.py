"""W4A4 calibration for `fp4lm export --activations nvfp4 --calibration-batches N`: each quantized layer's
input amax over N of the run's fixed validation batches, run through the forward pass the checkpoint's step
used (its own quantization telemetry, fp4lm.quant.stats: the amax of the operand the fprop GEMM quantizes).
Layers that read the same activation (q/k/v, gate/up: `LinearLayer.reads`) share it, as fused GEMMs need; a
mixture of experts' routed experts each have their own (their own tokens'), per expert and gate/up shared."""

from __future__ import annotations

import jax
import numpy as np

import fp4lm.data
from fp4lm.errors import UserError
from fp4lm.export.source import ExportSource
from fp4lm.linear_layers import linear_layers
from fp4lm.tokenizer import tokenizer_from_json
from fp4lm.train import model_setup
from fp4lm.train.step import make_stats_step, model_stats

MAX_CALIBRATION_BATCHES = 10_000  # far past where an amax stops moving; each batch is a forward pass


def check_calibration_batches(activations: str, batches: int) -> None:
    """`--activations nvfp4` needs at least one calibration batch, and at most MAX_CALIBRATION_BATCHES
    (checked before the run is read)."""
    if activations == "nvfp4" and batches < 1:
        raise UserError(
            "--activations nvfp4 needs calibration data to set the input scales; pass --calibration-batches N "
            "(N >= 1 validation batches), or export weights only (--activations none)"
        )
    if batches > MAX_CALIBRATION_BATCHES:
        raise UserError(
            f"--calibration-batches {batches:,} is more than {MAX_CALIBRATION_BATCHES:,} (a forward pass each, and "
            "the input amax settles within a few dozen); pass e.g. --calibration-batches 32"
        )


def input_amaxes(source: ExportSource, batches: int, log=print) -> dict[str, float]:
    """{layer path: input amax} of the quantized layers, shared within the groups that read one activation;
    a validation split with fewer than `batches` batches calibrates on all it has, with a note."""
    config = source.config
    tokenizer = tokenizer_from_json(source.tokenizer_json, origin=f"{source.run_dir} checkpoint tokenizer")
    data = fp4lm.data.build(
        config.data,
        run_dir=source.run_dir,
        seed=config.train.seed,
        batch_size=config.train.batch_size,
        tokenizer=tokenizer,
    )  # reads only
    calibration = data.eval_batches(batches)
    if not calibration:
        raise UserError(
            f"{source.run_dir} has no validation data to calibrate on; export weights only (--activations none)"
        )
    if len(calibration) < batches:
        log(f"note: --calibration-batches {batches}: the validation data holds {len(calibration)}; calibrated on those")
    vocab = int(source.params["embed"]["table"].shape[0])
    graphdef = model_setup.graphdef_of(model_setup.abstract_model(config, vocab, source.policy))
    stats_step = jax.jit(make_stats_step(model_stats(graphdef)))
    rng = jax.random.key_data(jax.random.key(0))  # the forward pass rounds to nearest: no random bits drawn
    amax: dict[str, float] = {}
    for batch in calibration:
        stats = jax.device_get(stats_step(source.params, batch, rng, source.step))
        for path, operands in stats.items():
            amax[path] = max(amax.get(path, 0.0), float(np.asarray(operands["x"]["amax"])))
    return shared_input_amaxes(config.model, amax)


def shared_input_amaxes(model, amax: dict[str, float]) -> dict[str, float]:
    """{layer path: input amax} with the layers that read one activation sharing the largest: q/k/v, gate/up,
    and each routed expert's gate/up (`{experts path}.{e}`, one pair per expert). An expert that calibration
    routed no token to (amax 0, which would make an infinite scale) takes the largest of its block's experts."""
    paths = {}  # path -> the key of the activation it reads
    for layer in linear_layers(model):
        block = layer.path.split(".")[1]
        if layer.experts:
            paths.update({f"{layer.path}.{e}": (block, layer.reads, e) for e in range(layer.experts)})
        else:
            paths[layer.path] = (block, layer.reads, None)
    shared: dict[tuple, float] = {}
    for path, key in paths.items():
        if path in amax:
            shared[key] = max(shared.get(key, 0.0), amax[path])
    for key, value in list(shared.items()):
        block, reads, expert = key
        if expert is not None and value == 0.0:
            shared[key] = max(v for (b, r, e), v in shared.items() if (b, r) == (block, reads) and e is not None)
    return {path: shared[key] for path, key in paths.items() if path in amax}
