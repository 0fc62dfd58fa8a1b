"""A training job's parallel layout (the columns of NVIDIA's published performance tables: GPUs, TP, PP, VP,
CP, EP, FSDP, GBS, MBS) and what it costs one GPU beyond its own arithmetic: the pipeline's bubble and the
communication compute does not hide. docs/projection.md states every assumption; the short version:

- ranks are placed Megatron's way, tensor-parallel innermost, then context, data, pipeline outermost, so a
  group of GPUs talks over NVLink when it fits in one NVLink domain and over the scale-out network otherwise;
- collectives run at `COLLECTIVE_EFFICIENCY` of the link's one-way bandwidth, each GPU sending (n-1)/n of
  the data of an n-GPU all-gather or reduce-scatter;
- tensor-parallel traffic is exposed for the fraction `TP_EXPOSED` (Megatron overlaps most of it with the
  GEMMs), context-parallel traffic hides behind attention, data-parallel and FSDP traffic behind one
  microbatch's compute, and pipeline sends and the experts' all-to-all are exposed.
"""

from __future__ import annotations

import dataclasses

from fp4lm.errors import UserError
from fp4lm.hardware import GPUSpec
from fp4lm.project.roofline import (
    CALIBRATION,
    OPTIMIZER_BYTES_PER_PARAM,
    Calibration,
    RecipeCost,
    Workload,
    routed_expert_params,
    step_components,
    workload_params,
)
from fp4lm.project.workload import MAX_TOKENS_PER_GPU

COLLECTIVE_EFFICIENCY = 0.8
"""The share of a link's one-way bandwidth a large NCCL collective reaches (a prior: NCCL's bus bandwidth on
NVLink and InfiniBand sits near 80% of the line rate)."""

TP_EXPOSED = 0.5
"""The share of the tensor-parallel (sequence-parallel) all-gathers and reduce-scatters left on the critical
path after Megatron overlaps them with the GEMMs they feed: a prior. The Megatron-Bridge rows cannot pin it
(fp4lm.project.calibration.layout_report: their mean error moves between 10.9% and 13.9% over 0..1)."""

GRADIENT_BYTES = 4.0  # gradients are reduced in fp32 (Megatron's grad_reduce_in_fp32, on in its bf16 mixed precision)
PARAM_GATHER_BYTES = 2.0  # parameters are gathered in bf16


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a job spreads over `gpus` GPUs; data parallelism takes what TP x PP x CP leaves."""

    gpus: int
    gbs: int  # sequences per step, all GPUs together
    seq: int
    mbs: int = 1  # sequences per microbatch
    tp: int = 1
    pp: int = 1
    vp: int = 1  # virtual pipeline stages per GPU (interleaved 1F1B); 1: none
    cp: int = 1
    ep: int = 1  # expert parallelism, carved out of the data- and context-parallel GPUs
    fsdp: bool = False  # parameters sharded over the data-parallel GPUs and gathered for every microbatch

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp * self.cp)

    @property
    def microbatches(self) -> int:
        """Microbatches each pipeline runs per step."""
        return self.gbs // (self.dp * self.mbs)

    @property
    def tokens_per_gpu(self) -> float:
        return self.gbs * self.seq / self.gpus

    def describe(self) -> str:
        parts = [f"TP{self.tp}", f"PP{self.pp}", f"VP{self.vp}", f"CP{self.cp}", f"EP{self.ep}", f"DP{self.dp}"]
        return " ".join([*parts, *(["FSDP"] if self.fsdp else []), f"MBS{self.mbs}", f"GBS{self.gbs}"])


def check_layout(layout: Layout, work: Workload) -> None:
    """Refuses a layout the model or the GPU count cannot take, naming the flag to change."""
    flags = {"--gpus": layout.gpus, "--gbs": layout.gbs, "--seq": layout.seq, "--mbs": layout.mbs}
    flags |= {"--tp": layout.tp, "--pp": layout.pp, "--vp": layout.vp, "--cp": layout.cp, "--ep": layout.ep}
    for flag, value in flags.items():
        if value < 1:
            raise UserError(f"{flag} must be a positive integer, got {value}")
    m, model_parallel = work.model, layout.tp * layout.pp * layout.cp
    if layout.gpus % model_parallel:
        raise UserError(
            f"--gpus {layout.gpus} is not a multiple of TP x PP x CP = {model_parallel}; "
            "change --gpus, --tp, --pp or --cp"
        )
    if layout.tokens_per_gpu > MAX_TOKENS_PER_GPU:
        raise UserError(
            f"--gbs x --seq / --gpus = {layout.gbs:,} x {layout.seq:,} / {layout.gpus:,} = "
            f"{layout.tokens_per_gpu:,.0f} tokens per GPU per step, more than the {MAX_TOKENS_PER_GPU:,} the "
            "projection represents; pass a smaller --gbs or more --gpus"
        )
    if layout.gbs % (layout.dp * layout.mbs):
        raise UserError(
            f"--gbs {layout.gbs} is not a multiple of data parallel x MBS = {layout.dp} x {layout.mbs}; "
            "change --gbs or --mbs"
        )
    if m.num_heads % layout.tp or m.mlp_dim % layout.tp:
        raise UserError(
            f"--tp {layout.tp} does not divide the model's {m.num_heads} heads and MLP width {m.mlp_dim}; pick a "
            "divisor of both"
        )
    if m.num_kv_heads % layout.tp and layout.tp % m.num_kv_heads:
        raise UserError(
            f"--tp {layout.tp} neither divides nor is a multiple of the model's {m.num_kv_heads} key/value heads"
        )
    if layout.vp > 1 and layout.pp == 1:
        raise UserError("--vp needs pipeline parallelism: give --pp > 1 or drop --vp")
    if layout.pp * layout.vp > m.num_layers + 2:
        raise UserError(
            f"--pp x --vp = {layout.pp * layout.vp} stages for {m.num_layers} blocks, the embedding and the loss; "
            "a stage needs one of them: lower --pp or --vp"
        )
    if layout.seq % (2 * layout.cp) and layout.cp > 1:
        raise UserError(f"--seq {layout.seq} is not a multiple of 2 x CP = {2 * layout.cp} (balanced causal chunks)")
    if layout.ep > 1 and not m.num_experts:
        raise UserError("--ep needs a mixture of experts (model.num_experts > 0); drop --ep for a dense model")
    if m.num_experts and (m.num_experts % layout.ep or (layout.dp * layout.cp) % layout.ep):
        raise UserError(
            f"--ep {layout.ep} must divide the {m.num_experts} experts and data x context parallel = "
            f"{layout.dp * layout.cp} GPUs"
        )


@dataclasses.dataclass(frozen=True)
class Network:
    """The links between GPUs: NVLink inside a domain of `nvlink_domain` GPUs, a scale-out network beyond."""

    nvlink_domain: int
    nvlink_gb_per_s: float
    scaleout_gb_per_s: float

    @classmethod
    def of(cls, gpu: GPUSpec, nvlink_domain: int | None = None, scaleout_gb_per_s: float | None = None) -> Network:
        """The GPU's system (GPUSpec), with the domain size or scale-out bandwidth overridden where given."""
        domain = nvlink_domain or gpu.nvlink_domain
        scaleout = scaleout_gb_per_s or gpu.scaleout_gb_per_s
        if domain < 1 or scaleout <= 0:
            raise UserError("--nvlink-domain and --scaleout-gbps must be positive")
        return cls(domain, gpu.nvlink_gb_per_s or scaleout, scaleout)

    def link(self, span: int) -> str:
        """The link a group of GPUs spanning `span` consecutive ranks talks over."""
        return "nvlink" if span <= self.nvlink_domain else "scale-out"

    def bytes_per_s(self, span: int) -> float:
        gb = self.nvlink_gb_per_s if self.link(span) == "nvlink" else self.scaleout_gb_per_s
        return gb * 1e9 * COLLECTIVE_EFFICIENCY


@dataclasses.dataclass(frozen=True)
class Traffic:
    """One kind of communication, per GPU per step: bytes sent, seconds on its link, seconds exposed."""

    name: str  # tensor, context, pipeline, expert, data
    collective: str
    group: int  # GPUs in the group
    link: str  # nvlink | scale-out
    bytes: float
    seconds: float
    exposed_s: float


@dataclasses.dataclass(frozen=True)
class LayoutStep:
    """One step of one GPU under a layout: its components (seconds, summing to the step) and its traffic."""

    components: dict[str, float]
    traffic: tuple[Traffic, ...]

    @property
    def step_time_s(self) -> float:
        return sum(self.components.values())


def microbatch_workload(work: Workload, layout: Layout) -> Workload:
    """One microbatch on one GPU: MBS sequences of `seq` tokens, split by the layout's TP, CP and EP."""
    return dataclasses.replace(
        work,
        seq_len=layout.seq,
        batch_per_gpu=layout.mbs,
        tensor_parallel=layout.tp,
        context_parallel=layout.cp,
        expert_parallel=layout.ep,
    )


def layout_step(
    work: Workload, layout: Layout, network: Network, gpu: GPUSpec, cost: RecipeCost, cal: Calibration = CALIBRATION
) -> LayoutStep:
    """One GPU's step: `microbatches` microbatches through its pipeline stage (each weight quantized once per
    step), the interleaved 1F1B bubble of (PP-1)/VP microbatches, the exposed communication, and AdamW on its
    1/GPUs share of the parameters (the distributed optimizer). A stage does 1/PP of the blocks' and the LM
    head's work: the split counts the embedding and the loss as layers (Megatron's
    account_for_embedding/loss_in_pipeline_split, which its large-model recipes use), so the stages balance."""
    mb = microbatch_workload(work, layout)
    parts = step_components(mb, gpu, cost, cal, weight_passes=1 / layout.microbatches)
    compute = {k: v / layout.pp for k, v in parts.items() if k != "optimizer"}
    traffic = _traffic(mb, layout, network, compute)
    exposed_per_microbatch = sum(t.exposed_s for t in traffic if t.name in ("tensor", "context", "expert"))
    microbatch = sum(compute.values()) + exposed_per_microbatch / layout.microbatches
    steps = layout.microbatches
    components = {k: v * steps for k, v in compute.items()}
    components["communication"] = sum(t.exposed_s for t in traffic)
    components["bubble"] = (layout.pp - 1) / layout.vp * microbatch
    components["optimizer"] = OPTIMIZER_BYTES_PER_PARAM * workload_params(work) / layout.gpus / _hbm(gpu, cal)
    return LayoutStep(components, traffic)


def _hbm(gpu: GPUSpec, cal: Calibration) -> float:
    return gpu.hbm_tb_per_s * 1e12 * cal.memory_efficiency


def local_params(work: Workload, layout: Layout) -> float:
    """Parameters one GPU holds: the routed experts split over EP and PP, the rest over TP and PP."""
    experts = routed_expert_params(work)
    return (workload_params(work) - experts) / (layout.tp * layout.pp) + experts / (layout.ep * layout.pp)


def _traffic(mb: Workload, layout: Layout, network: Network, compute: dict[str, float]) -> tuple[Traffic, ...]:
    """Every kind of communication the layout has, per GPU per step (see the module doc for the overlaps)."""
    m, steps = mb.model, layout.microbatches
    tp, cp, dp, pp = layout.tp, layout.cp, layout.dp, layout.pp
    stage_blocks = m.num_layers / pp
    activation = 2.0 * mb.tokens * m.d_model  # one microbatch's bf16 activations on this context rank
    microbatch_compute = sum(compute.values())
    out = []

    def add(name, collective, group, span, bytes_per_microbatch, exposed_of):
        seconds = steps * bytes_per_microbatch / network.bytes_per_s(span)
        out.append(
            Traffic(
                name, collective, group, network.link(span), steps * bytes_per_microbatch, seconds, exposed_of(seconds)
            )
        )

    if tp > 1:  # sequence parallel: 2 all-gathers + 2 reduce-scatters per block forward, as many backward
        per_block = 8 * (tp - 1) / tp * activation
        add("tensor", "all-gather + reduce-scatter", tp, tp, per_block * stage_blocks, lambda s: TP_EXPOSED * s)
    if cp > 1:  # ring attention: K and V go round the ring forward; K, V and their gradients backward
        kv_heads = -(-m.num_kv_heads // tp)
        chunk = 2.0 * mb.tokens * 2 * kv_heads * m.resolved_head_dim
        hidden = steps * compute["attention"]
        add(
            "context",
            "ring send/recv",
            cp,
            tp * cp,
            3 * (cp - 1) * chunk * stage_blocks,
            lambda s: max(0.0, s - hidden),
        )
    if pp > 1:  # each virtual stage sends its output forward and receives its gradient back
        add("pipeline", "send/recv", pp, layout.gpus, 2 * layout.vp * activation / tp, lambda s: s)
    if layout.ep > 1 and m.num_experts:
        add("expert", "all-to-all", layout.ep, tp * layout.ep, mb.all_to_all_bytes() / pp, lambda s: s)
    n = dp * cp
    if n > 1:  # gradients reduce-scattered in fp32, parameters all-gathered in bf16
        share = (n - 1) / n * local_params(mb, layout)
        if layout.fsdp:  # gathered for the forward and again for the backward of every microbatch
            per_microbatch = share * (2 * PARAM_GATHER_BYTES + GRADIENT_BYTES)
            add(
                "data",
                "all-gather + reduce-scatter (FSDP)",
                n,
                tp * n,
                per_microbatch,
                lambda s: max(0.0, s - steps * microbatch_compute),
            )
        else:  # once per step, behind the last microbatch's backward and the next step's first forward
            per_step = share * (PARAM_GATHER_BYTES + GRADIENT_BYTES)
            add(
                "data",
                "reduce-scatter + all-gather",
                n,
                tp * n,
                per_step / steps,
                lambda s: max(0.0, s - microbatch_compute),
            )
    return tuple(out)
