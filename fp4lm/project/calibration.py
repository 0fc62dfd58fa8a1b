"""The published measurements the projection was fitted on, and how far it lands from each."""

from __future__ import annotations

import dataclasses

from fp4lm.project.layout import Layout
from fp4lm.project.projection import project
from fp4lm.project.roofline import CALIBRATION, Calibration
from fp4lm.project.workload import resolve_model, workload_from_config

# NVIDIA, "Train Models Faster with JAX and MaxText Using NVFP4 on NVIDIA Blackwell" (2026-06), seq 8192,
# same batch and parallelism for both recipes: (preset, gpu, NVFP4/FP8 speedup, FP8 and NVFP4 TFLOP/s/GPU).
# The speedups are the blog's; the absolute TFLOP/s come from secondary summaries (docs/numerics.md §14).
PUBLISHED = (
    ("llama3-8b", "gb200", 1.35, 149.7, 201.7),
    ("llama3-8b", "gb300", 1.31, 175.9, 230.1),
    ("llama3.1-405b", "gb200", 1.43, 155.7, 222.4),
    ("llama3.1-405b", "gb300", 1.73, 210.3, 363.3),
)


@dataclasses.dataclass(frozen=True)
class CalibrationRow:
    model: str
    gpu: str
    quantity: str
    published: float
    projected: float
    fitted: bool  # False: shown for comparison only

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.projected - self.published) / self.published


def calibration_report(calibration: Calibration = CALIBRATION) -> list[CalibrationRow]:
    """Published vs projected for every point in `PUBLISHED`, with the presets' per-GPU batch.

    Only the four speedups are fitted. The absolute TFLOP/s are listed but not fitted: they would put the
    FP8 GEMMs under 5% of peak (Llama 3 8B, GB200: 149.7 TFLOP/s is 344 us per token, and a 1.35x speedup
    needs >= 89 us of it saved, which only the quantized GEMMs can give and by at most half their time on
    GB200, so FP8 GEMMs would take >= 178 us for 41.9 GFLOP per token, <= 235 TFLOP/s), which no physical
    model reconciles with GEMMs being the part NVFP4 speeds up. They look like a unit or transcription slip.
    """
    rows = []
    for preset, gpu, speedup, fp8_tflops, nvfp4_tflops in PUBLISHED:
        config, _ = resolve_model(preset)
        result = project(workload_from_config(config), gpu, ("fp8", "nvfp4"), calibration=calibration)
        fp8, nvfp4 = result.rows
        rows += [
            CalibrationRow(preset, gpu, "nvfp4/fp8 speedup", speedup, nvfp4.speedup_vs_fp8, True),
            CalibrationRow(preset, gpu, "fp8 TFLOP/s/GPU", fp8_tflops, fp8.tflops_per_gpu, False),
            CalibrationRow(preset, gpu, "nvfp4 TFLOP/s/GPU", nvfp4_tflops, nvfp4.tflops_per_gpu, False),
        ]
    return rows


@dataclasses.dataclass(frozen=True)
class PublishedRun:
    """One dense pre-training row of NVIDIA's Megatron-Bridge performance summary (sequences of 8192 tokens):
    the system, recipe and parallel layout it ran with, and the tokens/s per GPU it measured."""

    release: str
    gpu: str
    recipe: str  # fp4lm's name: "fp8" is the summary's FP8 (current scaling), "mxfp8", "nvfp4"
    model: str  # fp4lm's preset
    gpus: int
    gbs: int
    mbs: int
    fsdp: int  # sharding group size; 0: DDP
    tp: int
    pp: int
    cp: int
    vp: int  # virtual pipeline stages; 1: none
    tokens_per_sec: float

    @property
    def layout(self) -> str:
        parts = [f"TP{self.tp}", f"PP{self.pp}", f"CP{self.cp}", f"VP{self.vp}", f"MBS{self.mbs}"]
        return " ".join(parts + ([f"FSDP{self.fsdp}"] if self.fsdp else []))

    def as_layout(self) -> Layout:
        return Layout(
            gpus=self.gpus,
            gbs=self.gbs,
            seq=8192,
            mbs=self.mbs,
            tp=self.tp,
            pp=self.pp,
            vp=self.vp,
            cp=self.cp,
            fsdp=bool(self.fsdp),
        )


MEGATRON_BRIDGE_SOURCE = (
    "NVIDIA-NeMo/Megatron-Bridge, docs/performance-summary-archive.md at commit 4ab94dfad366 (2026-08-11): "
    "the newest release of each dense model, Llama 3 70B (26.04.01) and Llama 3.1 405B (26.06); no BF16 row exists"
)
_70B, _405B = ("26.04.01", "llama3-70b", 64, 256), ("26.06", "llama3.1-405b", 256, 1536)
# (release, model, GPUs, GBS) + (gpu, recipe, MBS, FSDP, TP, PP, CP, VP, tokens/s/GPU), as published.
MEGATRON_BRIDGE = tuple(
    PublishedRun(release, gpu, recipe, model, gpus, gbs, *layout)
    for (release, model, gpus, gbs), (gpu, recipe, *layout) in (
        (_70B, ("gb300", "nvfp4", 1, 0, 1, 4, 1, 5, 7296)),
        (_70B, ("gb300", "mxfp8", 1, 0, 1, 4, 1, 5, 4864)),
        (_70B, ("gb300", "fp8", 2, 64, 1, 1, 1, 1, 5248)),
        (_70B, ("gb200", "nvfp4", 1, 0, 2, 4, 1, 5, 4864)),
        (_70B, ("gb200", "mxfp8", 1, 0, 2, 4, 1, 5, 3712)),
        (_70B, ("gb200", "fp8", 2, 64, 1, 1, 1, 1, 4224)),
        (_70B, ("h100", "fp8", 1, 0, 4, 8, 1, 5, 1664)),
        (_405B, ("gb300", "nvfp4", 1, 0, 4, 8, 1, 4, 1413)),
        (_405B, ("gb300", "mxfp8", 1, 0, 2, 8, 2, 4, 952)),
        (_405B, ("gb300", "fp8", 1, 0, 4, 8, 1, 4, 1048)),
        (_405B, ("gb200", "nvfp4", 1, 0, 4, 16, 1, 8, 1166)),
        (_405B, ("gb200", "mxfp8", 1, 0, 4, 16, 1, 8, 783)),
        (_405B, ("gb200", "fp8", 1, 0, 4, 16, 1, 4, 843)),
    )
)


def layout_report(calibration: Calibration = CALIBRATION, with_layout: bool = True) -> list[CalibrationRow]:
    """The projection of every `MEGATRON_BRIDGE` row, under the row's layout (with_layout) or as one GPU's step
    over the same tokens per GPU (GBS x 8192 / GPUs), against what it measured in tokens/s/GPU; and of each
    ratio of two recipes the summary ran with the same layout on the same system."""
    rows, projected = [], {}
    for run in MEGATRON_BRIDGE:
        config, _ = resolve_model(run.model)
        work = workload_from_config(config, seq=8192, batch=run.gbs // run.gpus)
        layout = run.as_layout() if with_layout else None
        (result,) = project(work, run.gpu, (run.recipe,), calibration=calibration, layout=layout).rows
        projected[run] = result.tokens_per_sec
        quantity = f"{run.recipe} tokens/s/GPU, {run.gpus} GPUs {run.layout}"
        rows.append(CalibrationRow(run.model, run.gpu, quantity, run.tokens_per_sec, result.tokens_per_sec, False))
    for faster in MEGATRON_BRIDGE:
        for slower in MEGATRON_BRIDGE:
            same = (faster.model, faster.gpu, faster.layout) == (slower.model, slower.gpu, slower.layout)
            if same and faster.tokens_per_sec > slower.tokens_per_sec:
                rows.append(
                    CalibrationRow(
                        faster.model,
                        faster.gpu,
                        f"{faster.recipe}/{slower.recipe}, {faster.layout}",
                        faster.tokens_per_sec / slower.tokens_per_sec,
                        projected[faster] / projected[slower],
                        False,
                    )
                )
    return rows
