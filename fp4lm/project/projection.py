"""A projection's result: per recipe, the step time, throughput and where the time goes, as a table or JSON."""

from __future__ import annotations

import dataclasses

from fp4lm.errors import UserError
from fp4lm.flops import training_flops_per_step
from fp4lm.hardware import GPUSpec, get_gpu
from fp4lm.project import units
from fp4lm.project.layout import (
    Layout,
    LayoutStep,
    Network,
    Traffic,
    check_layout,
    layout_step,
    microbatch_workload,
)
from fp4lm.project.roofline import (
    CALIBRATION,
    DEFAULT_RECIPES,
    GROUPED_GEMM_EFFICIENCY,
    RECIPE_COSTS,
    Calibration,
    Workload,
    active_params,
    runs_natively,
    step_components,
    workload_params,
)


@dataclasses.dataclass(frozen=True)
class RecipeProjection:
    recipe: str
    step_time_s: float
    tflops_per_gpu: float  # MaxText accounting (fp4lm.flops) / projected step time
    tokens_per_sec: float  # per GPU
    speedup_vs_fp8: float
    speedup_vs_bf16: float
    components: dict  # seconds: gemm, quantization, attention, elementwise, lm_head, optimizer[, communication, bubble]
    traffic: tuple[Traffic, ...] = ()  # with a layout: each kind of communication, per GPU per step

    @property
    def breakdown(self) -> dict[str, float]:
        """Seconds in GEMM, quantization, attention, exposed communication, the pipeline bubble and everything
        else; they sum to step_time_s."""
        c = self.components
        return {
            "gemm": c["gemm"],
            "quantization": c["quantization"],
            "attention": c["attention"],
            "communication": c.get("communication", 0.0),
            "bubble": c.get("bubble", 0.0),
            "other": c["lm_head"] + c["elementwise"] + c["optimizer"],
        }


@dataclasses.dataclass(frozen=True)
class Projection:
    label: str
    gpu: GPUSpec
    workload: Workload
    rows: tuple[RecipeProjection, ...]
    layout: Layout | None = None
    network: Network | None = None

    def _heading(self) -> list[str]:
        w, gpu = self.workload, self.gpu.name.upper()
        if self.layout is None:
            return [
                f"projected training step: {self.label} on one {gpu} "
                f"({w.batch_per_gpu} x {w.seq_len} = {w.tokens:,} tokens per GPU per step); communication "
                "assumed overlapped",
                "  calibrated on NVIDIA's MaxText NVFP4/FP8 speedups (Llama 3 8B, 3.1 405B; GB200, GB300) to within 6%",
            ]
        lay, net = self.layout, self.network
        assert net is not None
        return [
            f"projected training step: {self.label} on {lay.gpus:,} {gpu}s, {lay.describe()}, sequences of "
            f"{lay.seq:,} ({lay.microbatches} microbatches per step, {lay.tokens_per_gpu:,.0f} tokens per GPU)",
            f"  NVLink domains of {net.nvlink_domain} GPUs at {net.nvlink_gb_per_s:,.0f} GB/s, scale-out "
            f"{net.scaleout_gb_per_s:,.0f} GB/s per GPU; one-GPU efficiencies calibrated on NVIDIA's MaxText "
            "NVFP4/FP8 speedups, the layout's errors against Megatron-Bridge in BENCHMARKS.md",
        ]

    def _traffic_lines(self) -> list[str]:
        """Per kind of communication: bytes per GPU per step, its link, and time on it (the first recipe's)."""
        if not self.rows or not self.rows[0].traffic:
            return []
        lines = ["", "communication per GPU per step (exposed: not hidden behind compute, first recipe):"]
        for t in self.rows[0].traffic:
            lines.append(
                f"  {t.name:<9} {t.collective:<35} {t.group:>5} GPUs over {t.link:<9} {units.data_bytes(t.bytes):>9} "
                f"{units.seconds(t.seconds):>10}, exposed {units.seconds(t.exposed_s)}"
            )
        return lines

    def moe_summary(self) -> dict | None:
        """A mixture of experts' active parameters per token, tokens per expert (per microbatch under a layout),
        and its expert-parallel all-to-all per GPU per step: bytes, and without a layout the seconds at the GPU's
        NVLink bandwidth, were it not overlapped (a layout prices it in its traffic); None for a dense model."""
        w = self.workload if self.layout is None else microbatch_workload(self.workload, self.layout)
        if not w.model.num_experts:
            return None
        nvlink = self.gpu.nvlink_gb_per_s * 1e9
        if self.layout is None:
            bytes_sent, seconds = w.all_to_all_bytes(), (w.all_to_all_bytes() / nvlink if nvlink else None)
        else:
            expert = [t for t in (self.rows[0].traffic if self.rows else ()) if t.name == "expert"]
            bytes_sent, seconds = (expert[0].bytes if expert else 0.0), None
        return {
            "active_params": active_params(w),
            "params": workload_params(w),
            "expert_parallel": w.expert_parallel,
            "tokens_per_expert": w.expert_parallel * w.local_tokens * w.model.experts_per_token / w.model.num_experts,
            "all_to_all_bytes_per_gpu": bytes_sent,
            "all_to_all_s_at_nvlink": seconds,
        }

    def as_json(self) -> dict[str, dict]:
        result = {
            r.recipe: {
                "step_time_s": r.step_time_s,
                "tflops_per_gpu": r.tflops_per_gpu,
                "tokens_per_sec": r.tokens_per_sec,
                "speedup_vs_fp8": r.speedup_vs_fp8,
                "speedup_vs_bf16": r.speedup_vs_bf16,
                "breakdown": r.breakdown,
                **({"communication": {t.name: _traffic_json(t) for t in r.traffic}} if self.layout else {}),
            }
            for r in self.rows
        }
        if self.layout is not None and self.network is not None:
            result["layout"] = {
                **dataclasses.asdict(self.layout),
                "dp": self.layout.dp,
                "microbatches": self.layout.microbatches,
                "tokens_per_gpu_per_step": self.layout.tokens_per_gpu,
                **dataclasses.asdict(self.network),
            }
        moe = self.moe_summary()
        return result if moe is None else {**result, "moe": moe}

    def table(self) -> str:
        w = self.workload
        bf16_layers = w.model.num_layers - w.quantized_blocks
        lines = [*self._heading(), ""]
        columns = ("GEMM", "quant", "attn", "comm", "bubble", "other")
        shown = [c for c in columns if self.layout is not None or c not in ("comm", "bubble")]
        lines[1:1] = [
            f"  {bf16_layers} of {w.model.num_layers} blocks kept in bf16; embeddings, LM head and attention "
            "core in bf16"
        ]
        lines.append(
            f"{'recipe':<7} {'step':>10} {'TFLOP/s/GPU':>12} {'tokens/s/GPU':>13} {'vs fp8':>7} {'vs bf16':>8}  "
            + " ".join(f"{c:>6}" for c in shown)
        )
        for r in self.rows:
            shares = [100 * v / r.step_time_s for c, v in zip(columns, r.breakdown.values(), strict=True) if c in shown]
            lines.append(
                f"{r.recipe:<7} {units.seconds(r.step_time_s):>10} {units.figure(r.tflops_per_gpu):>12} "
                f"{units.figure(r.tokens_per_sec):>13} {r.speedup_vs_fp8:>6.2f}x {r.speedup_vs_bf16:>7.2f}x  "
                + " ".join(f"{s:>5.0f}%" for s in shares)
            )
        moe = self.moe_summary()
        if moe is not None:
            a2a = moe["all_to_all_s_at_nvlink"]
            lines.append(
                f"  mixture of experts: {moe['active_params'] / 1e9:.2f}B of {moe['params'] / 1e9:.2f}B parameters "
                f"active per token; {moe['tokens_per_expert']:,.0f} tokens per expert per block (balanced), grouped "
                f"GEMMs at {GROUPED_GEMM_EFFICIENCY:.0%} of dense efficiency (a prior)"
            )
            if self.layout is None:  # with a layout, the all-to-all is among the traffic above
                lines.append(
                    f"  expert parallelism over {moe['expert_parallel']} GPUs: all-to-all "
                    f"{units.data_bytes(moe['all_to_all_bytes_per_gpu'])} per GPU per step"
                    + (f", {units.seconds(a2a)} at NVLink bandwidth (assumed overlapped)" if a2a else "")
                )
        native = [r.recipe for r in self.rows if not runs_natively(self.gpu, RECIPE_COSTS[r.recipe])]
        if native:
            lines.append(
                f"  {', '.join(native)}: no tensor cores for this format on {self.gpu.name}; "
                "projected as dequantize + bf16 GEMM"
            )
        return "\n".join(lines + self._traffic_lines())


def parse_recipes(recipes) -> tuple[str, ...]:
    names = [r.strip().lower() for r in (recipes.split(",") if isinstance(recipes, str) else recipes)]
    names = [n for n in names if n]
    unknown = [n for n in names if n not in RECIPE_COSTS]
    if unknown or not names:
        raise UserError(
            f"unknown recipe(s) {', '.join(unknown) or '(none given)'}; valid for projection: {', '.join(RECIPE_COSTS)}"
        )
    return tuple(dict.fromkeys(names))


def project(
    work: Workload,
    gpu: GPUSpec | str,
    recipes=DEFAULT_RECIPES,
    *,
    label: str = "model",
    calibration: Calibration = CALIBRATION,
    layout: Layout | None = None,
    network: Network | None = None,
) -> Projection:
    """Projects one training step per recipe; speedups are against fp8 and bf16 on the same workload.

    Without a layout: one GPU's step over its `work.tokens`, all communication assumed hidden (what the
    calibration was fitted on). With one: a step of the whole job, per GPU, with its bubble and exposed
    communication (`layout_step`); `network` defaults to the GPU's system."""
    gpu = get_gpu(gpu) if isinstance(gpu, str) else gpu
    recipes = parse_recipes(recipes)
    if layout is not None:
        check_layout(layout, work)
        network = network or Network.of(gpu)
        flops = training_flops_per_step(work.model, work.vocab_size, layout.seq, layout.gbs).total / layout.gpus
        tokens = layout.tokens_per_gpu
    else:
        flops = training_flops_per_step(work.model, work.vocab_size, work.seq_len, work.batch_per_gpu).total
        tokens = work.tokens
    steps = {}
    for name in dict.fromkeys((*recipes, "fp8", "bf16")):
        cost = RECIPE_COSTS[name]
        if layout is not None and network is not None:
            steps[name] = layout_step(work, layout, network, gpu, cost, calibration)
        else:
            steps[name] = LayoutStep(step_components(work, gpu, cost, calibration), ())
    rows = []
    for name in recipes:
        step = steps[name].step_time_s
        rows.append(
            RecipeProjection(
                recipe=name,
                step_time_s=step,
                tflops_per_gpu=flops / step / 1e12,
                tokens_per_sec=tokens / step,
                speedup_vs_fp8=steps["fp8"].step_time_s / step,
                speedup_vs_bf16=steps["bf16"].step_time_s / step,
                components=steps[name].components,
                traffic=steps[name].traffic,
            )
        )
    return Projection(label, gpu, work, tuple(rows), layout, network)


def _traffic_json(t: Traffic) -> dict:
    return {k: v for k, v in dataclasses.asdict(t).items() if k != "name"}
