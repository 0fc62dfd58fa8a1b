"""Whether an NVFP4 export's weights are the ones the run trained with or were quantized by the export
(post-training quantization): decided once, by `weights_provenance`, and written from that one answer
everywhere an export says it: the output line, the safetensors header (`fp4lm_nvfp4_weights`: the label)
and, for ModelOpt, hf_quant_config.json's producer (`weights_provenance`: the label, `weights`: the text).

trained        every quantized projection holds the codes and scales the forward pass used (a fused group
               re-quantized with its shared amax included: the export says how far that moved it)
post-training  every projection was quantized by the export from its bf16 weights: a run with no NVFP4
               layer, a run past its `precision.bf16_after` switch, or one whose forward weights are not
               NVFP4 (MX or FP8 formats: fp4lm.export.nvfp4_weights.forward_spec)
mixed          some of each (precision.rules mixing such recipes)
"""

from __future__ import annotations

import dataclasses

TRAINED, POST_TRAINING, MIXED = "trained", "post-training", "mixed"
METADATA_KEY = "fp4lm_nvfp4_weights"  # the safetensors header entry that holds the label


@dataclasses.dataclass(frozen=True)
class Provenance:
    label: str  # TRAINED | POST_TRAINING | MIXED
    text: str  # one sentence for the output line and hf_quant_config.json

    @property
    def is_trained(self) -> bool:
        return self.label == TRAINED


def weights_provenance(
    *, recipe: str, step: int, switch_step: int | None, quantized: int, post_training: int
) -> Provenance:
    """The provenance of the export of checkpoint `step`: `quantized` projections written as NVFP4, of which
    `post_training` were quantized by the export; `switch_step` is the run's bf16_after switch (None: none).
    A checkpoint past the switch had at least one bf16 step, so none of its weights are the trained ones."""
    if switch_step is not None and step > switch_step:
        return Provenance(
            POST_TRAINING,
            f"post-training quantization: the run switched to bf16 after step {switch_step} (precision.bf16_after), "
            f"so its step-{step} weights were trained in bf16 and its {quantized} projections were quantized now "
            "with the run's NVFP4 weight recipe",
        )
    if post_training == quantized:
        return Provenance(
            POST_TRAINING,
            f"post-training quantization: the run trained in {recipe} with no NVFP4 weights, so its {quantized} "
            "projections were quantized now from their bf16 weights (16x16 tiles, round-to-nearest)",
        )
    if post_training:
        return Provenance(
            MIXED,
            f"mixed: {post_training} of {quantized} projections were not trained with NVFP4 weights (their "
            "recipe quantizes weights otherwise) and were quantized now with 16x16 tiles (post-training "
            "quantization); the others are the NVFP4 weights the run trained",
        )
    return Provenance(TRAINED, f"trained: the NVFP4 weights the forward pass used, {quantized} projections")
