"""One-line notes, printed at export time, on the consumer bugs that an export runs into and that a release has
not fixed yet (tests/interop pins each as a strict xfail, which fails once a release fixes it: then the note
goes). Checked against transformers 5.24.0 (the pin) and 5.25.0 (the newest), compressed-tensors 0.20.1."""

from __future__ import annotations

TRANSFORMERS_CHECKED = "transformers 5.24-5.25"


def compressed_tensors_notes(*, quantized_expert_blocks: list[int], bf16_expert_blocks: list[int]) -> list[str]:
    """The notes for an nvfp4-ct export of a mixture of experts whose routed experts are NVFP4 in
    `quantized_expert_blocks` and bf16 in `bf16_expert_blocks`. transformers' compressed-tensors loading turns
    every block's per-expert tensors into its fused expert parameters through one NVFP4 decompression: it leaves
    out each expert's weight_global_scale, and it gathers nothing from experts written unquantized, whatever
    `ignore` names them (the load fails: "Concatenate on tensors destined for ...experts.gate_up_proj")."""
    if bf16_expert_blocks:  # the load fails: the other bug is moot
        blocks = ", ".join(str(b) for b in bf16_expert_blocks)
        return [
            f"note: {TRANSFORMERS_CHECKED} cannot load this nvfp4-ct export: its compressed-tensors loading drops the "
            f"bf16 routed experts of block(s) {blocks}; decompress the NVFP4 tensors with compressed-tensors first "
            "(docs/export.md), or export --format hf for transformers"
        ]
    if quantized_expert_blocks:
        return [
            f"note: {TRANSFORMERS_CHECKED} loads this export's NVFP4 experts without their weight_global_scale "
            "(huggingface/transformers#48371), so their weights come out scaled wrong; decompress them with "
            "compressed-tensors first (docs/export.md), or export --format hf for transformers"
        ]
    return []
