"""Does a planned layout fit on its GPUs? The trainer's memory estimate (fp4lm.model.memory_estimate,
docs/memory_estimate.md) applied to one GPU of the layout, so `fp4lm plan` never prices a run that cannot run.

The trainer has no pipeline or context parallelism; the layout maps onto its estimate thus: each GPU holds a
microbatch of MBS sequences of seq/CP tokens; the parameters and their AdamW state are split over TP, over
the DP x CP GPUs with --fsdp (the trainer's mesh.fsdp; without it each data-parallel GPU holds all of its
stage's, as the trainer's mesh.data does) and, as the trainer's mesh.expert does, over EP; a pipeline stage
holds 1/PP of them, and under 1F1B the first stage keeps min(PP, microbatches) microbatches' activations of its
1/PP of the blocks; the logits are the last stage's, one microbatch's. Activations are counted with every block
recomputed (model.remat=full), the least the estimate allows, so a row marked "does not fit" cannot fit however
its activations are kept; one that fits may still need recomputation."""

from __future__ import annotations

import dataclasses

from fp4lm.hardware import GPUSpec
from fp4lm.project.layout import Layout
from fp4lm.project.units import binary_bytes


@dataclasses.dataclass(frozen=True)
class Fit:
    """One GPU's estimated bytes under a layout, against the GPU's memory."""

    bytes_per_gpu: float
    gpu_bytes: float
    fits: bool

    def describe(self) -> str:
        """ "does not fit (6.63 TiB per GPU, the GPU has 80 GiB)" for a layout that cannot run; "" otherwise."""
        if self.fits:
            return ""
        return f"does not fit ({binary_bytes(self.bytes_per_gpu)} per GPU, the GPU has {binary_bytes(self.gpu_bytes)})"


def layout_memory(config, layout: Layout, recipe: str) -> float:
    """Bytes one GPU of `layout` needs to train `config` with `recipe` (the module doc's mapping)."""
    from fp4lm.model.memory_estimate import estimate_training_memory  # here: fp4lm.model imports jax

    sharing_batch = layout.dp * layout.cp  # GPUs holding different tokens of one step
    rest = max(1, sharing_batch // layout.ep)
    mesh = (1, rest, layout.tp) if layout.fsdp else (rest, 1, layout.tp)
    config = dataclasses.replace(
        config,
        train=dataclasses.replace(config.train, batch_size=layout.mbs * rest * layout.ep, grad_accum_steps=1),
        data=dataclasses.replace(config.data, seq_len=max(1, layout.seq // layout.cp)),
        precision=dataclasses.replace(config.precision, recipe=recipe),
        model=dataclasses.replace(config.model, remat="full"),
    )
    estimate = estimate_training_memory(config, mesh, layout.ep)
    in_flight = min(layout.pp, layout.microbatches)
    return estimate.state / layout.pp + estimate.activations * in_flight / layout.pp + estimate.logits


def layout_fit(config, layout: Layout, recipe: str, gpu: GPUSpec) -> Fit:
    """`layout_memory` against the GPU's memory, by the trainer's criterion (`fp4lm.model.memory_estimate.exceeds`);
    a GPU of unknown memory is taken to fit."""
    from fp4lm.model.memory_estimate import exceeds

    needed = layout_memory(config, layout, recipe)
    gpu_bytes = gpu.memory_gib * (1 << 30)
    return Fit(needed, gpu_bytes, not gpu_bytes or not exceeds(round(needed), gpu_bytes))
