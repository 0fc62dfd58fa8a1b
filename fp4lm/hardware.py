"""The one table of GPUs: datasheet peaks and HBM bandwidth, read by the trainer (MFU), the projection
(`fp4lm project`) and the device check."""

from __future__ import annotations

import dataclasses

from fp4lm.errors import UserError


@dataclasses.dataclass(frozen=True)
class GPUSpec:
    """Dense (not 2:4-sparse) tensor-core peaks per GPU in TFLOP/s, HBM bandwidth in TB/s."""

    name: str
    bf16_tflops: float
    fp8_tflops: float
    fp4_tflops: float | None  # None: no FP4 tensor cores
    hbm_tb_per_s: float
    block_scaled_gemm: bool  # tensor cores that consume MXFP8 / MXFP4 / NVFP4 block scales (Blackwell)
    source: str
    nvlink_gb_per_s: float = 0.0  # NVLink bandwidth per GPU, one direction (GB/s); 0: unknown
    nvlink_domain: int = 8  # GPUs one NVLink switch fabric connects (8: an HGX board; 72: an NVL72 rack)
    scaleout_gb_per_s: float = 50.0  # the network between NVLink domains, per GPU, one direction (GB/s)
    board_power_w: float = 0.0  # the GPU's power limit (W), what it draws in a compute-bound training step
    memory_gib: float = 0.0  # HBM per GPU as its datasheet states it ("80 GB": 80 GiB of HBM3); 0: unknown


GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in (
        GPUSpec(
            "h100",
            989,
            1979,
            None,
            3.35,
            False,
            "H100 SXM datasheet: FP8 3,958 / BF16 1,979 TFLOPS with sparsity (half dense); HBM3 3.35 TB/s; "
            "NVLink 4 900 GB/s total (450 each way); DGX H100: 8 GPUs per NVLink domain, one 400 Gb/s "
            "ConnectX-7 per GPU; SXM5 max TDP 700 W; 80 GB HBM3",
            nvlink_gb_per_s=450,
            board_power_w=700,
            memory_gib=80,
        ),
        GPUSpec(
            "h200",
            989,
            1979,
            None,
            4.8,
            False,
            "H200 SXM datasheet: same tensor cores as H100 SXM; HBM3e 4.8 TB/s; NVLink 4 (450 GB/s each way); "
            "HGX H200: 8 GPUs per NVLink domain, 400 Gb/s per GPU; max TDP 700 W; 141 GB HBM3e",
            nvlink_gb_per_s=450,
            board_power_w=700,
            memory_gib=141,
        ),
        GPUSpec(
            "b200",
            2250,
            4500,
            9000,
            8.0,
            True,
            "NVIDIA NVFP4 blog fig. 1 (9 PF FP4 dense, 18 sparse); DGX B200: 64 TB/s HBM3e over 8 GPUs"
            "; NVLink 5 1.8 TB/s total per GPU (900 GB/s each way); DGX B200: 8 GPUs per NVLink domain, one "
            "400 Gb/s ConnectX-7 per GPU; HGX B200 up to 1,000 W per GPU; 1,440 GB HBM3e over 8 GPUs (180 GB each)",
            nvlink_gb_per_s=900,
            board_power_w=1000,
            memory_gib=180,
        ),
        GPUSpec(
            "gb200",
            2500,
            5000,
            10000,
            8.0,
            True,
            "GB200 NVL72: 1,440 PF FP4 sparse / 72 GPUs / 2; 576 TB/s HBM3e / 72 GPUs"
            "; NVLink 5 1.8 TB/s total per GPU (900 GB/s each way), 72 GPUs in one NVLink domain; one 400 Gb/s "
            "ConnectX-7 per GPU for scale-out; ~1,200 W per GPU (the rack's ~132 kW holds 72 GPUs, 36 Grace CPUs "
            "and switches); 13.4 TB HBM3e over 72 GPUs (186 GB each)",
            nvlink_gb_per_s=900,
            nvlink_domain=72,
            board_power_w=1200,
            memory_gib=186,
        ),
        GPUSpec(
            "gb300",
            2500,
            5000,
            15000,
            8.0,
            True,
            "GB300 NVL72 (Blackwell Ultra): 1,080 PF FP4 dense / 72 GPUs; HBM3e 8 TB/s per GPU"
            "; NVLink 5 1.8 TB/s total per GPU (900 GB/s each way), 72 GPUs in one NVLink domain; one 800 Gb/s "
            "ConnectX-8 per GPU for scale-out; ~1,400 W per GPU; 288 GB HBM3e per GPU",
            nvlink_gb_per_s=900,
            nvlink_domain=72,
            scaleout_gb_per_s=100,
            board_power_w=1400,
            memory_gib=288,
        ),
    )
}


def get_gpu(name: str) -> GPUSpec:
    key = name.strip().lower()
    if key not in GPUS:
        raise UserError(f"unknown GPU {name!r}; valid GPUs: {', '.join(GPUS)}")
    return GPUS[key]


def peak_bf16_tflops(device_kind: str) -> float | None:
    """The dense bf16 peak (TFLOP/s) of a GPU named like jax's `device_kind` ("NVIDIA H100 80GB HBM3");
    None for any other device (a CPU). MFU is reported against the bf16 peak for every recipe, so recipes
    compare on one scale."""
    name = device_kind.lower().replace(" ", "")
    for key in sorted(GPUS, key=len, reverse=True):  # "gb200" before "b200"
        if key in name:
            return float(GPUS[key].bf16_tflops)
    return None
