"""Will a training run fit? A per-device memory estimate from the config alone, made before anything is built.

Impossible sizes would otherwise crash late (a C++ abort inside XLA, RESOURCE_EXHAUSTED after minutes of
compiling); this is integer arithmetic on the config, so it answers at once for any size. What each term
counts is in docs/memory_estimate.md; how it compares with measured runs (it errs high, which
`OVERESTIMATE_MARGIN` allows for) is in BENCHMARKS.md. `train.check_memory=false` skips the check.
"""

from __future__ import annotations

import os

from fp4lm.config import Config
from fp4lm.errors import UserError
from fp4lm.model.memory_estimate import OVERESTIMATE_MARGIN, MemoryEstimate, estimate_training_memory, exceeds


def host_available_bytes() -> int | None:
    """RAM the host can still give (MemAvailable), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def device_memory_limit() -> tuple[int | None, str]:
    """(bytes one device may use, what that limit is); None when neither the device nor the host says."""
    import jax

    from fp4lm.sharding import all_devices

    device = all_devices()[0]
    if device.platform == "cpu":
        available = host_available_bytes()
        if available is None:
            return None, ""
        shared = max(1, jax.local_device_count())
        per_device = available // shared
        where = f"the host's available RAM, {_gib(available)}" + (f", over {shared} CPU devices" if shared > 1 else "")
        return per_device, where
    try:
        stats = device.memory_stats() or {}
    except Exception:  # a backend without memory statistics
        stats = {}
    limit = stats.get("bytes_limit")
    return (int(limit), f"the memory of one {device.device_kind}") if limit else (None, "")


def check_training_fits(config: Config, *, limit: tuple[int | None, str] | None = None) -> MemoryEstimate:
    """Refuses (UserError, one line) a run whose per-device estimate exceeds the device's memory by more than
    the estimate's calibrated over-estimate (`OVERESTIMATE_MARGIN`); nothing when train.check_memory is off.

    Call it before building the model: it needs only the config and the device count. `limit` is
    (bytes, description); by default the device's (see `device_memory_limit`).
    """
    from fp4lm.sharding import all_devices, mesh_shape

    data, fsdp, expert, tensor = mesh_shape(config.mesh, len(all_devices()))
    estimate = estimate_training_memory(config, (data, fsdp, tensor), expert)
    if not config.train.check_memory:
        return estimate
    limit_bytes, where = limit if limit is not None else device_memory_limit()
    if limit_bytes is None or not exceeds(estimate.total, limit_bytes):
        return estimate
    raise UserError(
        f"this run needs about {_gib(estimate.total)} per device ({estimate.params:,} parameters: "
        f"{_gib(estimate.state)} of weights and AdamW state; {_gib(estimate.activations)} of activations; "
        f"{_gib(estimate.logits)} of logits), more than {where} even allowing for the estimate erring "
        f"{OVERESTIMATE_MARGIN:g}x high; {_FIXES[estimate.largest_part()]}; or set train.check_memory=false to try "
        "anyway"
    )


_FIXES = {
    "state": "reduce model.num_layers, model.d_model, model.mlp_dim or data.vocab_size, or shard the model over "
    "more devices (mesh.fsdp)",
    "activations": "reduce train.batch_size, data.seq_len (the attention scores grow with its square), "
    "model.num_layers or model.d_model, or set model.remat=full",
    "logits": "reduce data.vocab_size, train.batch_size or data.seq_len",
}


def _gib(n: int) -> str:
    """Bytes in GiB, or TiB above 1024 GiB (huge sizes in scientific notation)."""
    if n < 1 << 40:
        return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 27 else f"{n / (1 << 20):.1f} MiB"
    return f"{n / (1 << 40):.3g} TiB"
