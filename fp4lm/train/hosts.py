"""Many hosts: joining the JAX distributed system, and turning each process's rows into global batches."""

from __future__ import annotations

import os

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from fp4lm.config import DistributedConfig
from fp4lm.errors import UserError


def initialize_distributed(cfg: DistributedConfig) -> bool:
    """Joins the distributed system when this run is one of several processes; returns whether it did.

    Settings come from `distributed.*` in the config; whatever is unset JAX takes from its documented
    environment (JAX_COORDINATOR_ADDRESS, or a Slurm / Open MPI / TPU / Kubernetes job when
    `distributed.auto_detect` is true). With neither, the run is a single process.
    """
    configured = cfg.coordinator_address is not None or cfg.num_processes is not None or cfg.process_id is not None
    from_environment = "JAX_COORDINATOR_ADDRESS" in os.environ
    if not (configured or from_environment or cfg.auto_detect):
        return False
    if jax.distributed.is_initialized():
        return True
    try:
        jax.distributed.initialize(
            coordinator_address=cfg.coordinator_address,
            num_processes=cfg.num_processes,
            process_id=cfg.process_id,
            initialization_timeout=cfg.timeout_s,
        )
    except (ValueError, RuntimeError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UserError(
            f"could not join the distributed run ({reason[:200]}); check distributed.coordinator_address, "
            "distributed.num_processes and distributed.process_id (or JAX_COORDINATOR_ADDRESS)"
        ) from None
    return True


def global_batch(local: dict[str, np.ndarray], sharding: jax.sharding.Sharding, global_batch_size: int) -> dict:
    """This process's rows of a batch -> global arrays [global_batch_size, T] laid out by `sharding`."""
    out = {}
    for name, rows in local.items():
        global_shape = (global_batch_size, *rows.shape[1:])
        out[name] = jax.make_array_from_process_local_data(sharding, rows, global_shape)
    return out


def replicated(mesh: jax.sharding.Mesh, value) -> jax.Array:
    """A value every process holds alike (a step number, a prompt) as one array replicated over `mesh`."""
    value = np.asarray(value)
    return jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec()), value, value.shape)


def use_compilation_cache(directory: str | None) -> None:
    """Turns on JAX's persistent compilation cache in `directory` (None: leave JAX's setting alone)."""
    if directory:
        jax.config.update("jax_compilation_cache_dir", str(directory))


def is_main_process() -> bool:
    return jax.process_index() == 0
