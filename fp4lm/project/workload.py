"""What `fp4lm project` projects: a model preset or config, and the limits of what the projection speaks for."""

from __future__ import annotations

import pathlib

from fp4lm.errors import UserError
from fp4lm.project.roofline import Workload, workload_params


def _config_dirs() -> list[pathlib.Path]:
    import fp4lm

    return [pathlib.Path(fp4lm.__file__).resolve().parent.parent / "configs", pathlib.Path.cwd() / "configs"]


def resolve_model(model: str, overrides=()):
    """A preset name (configs/<name>.yaml beside the package, else ./configs) or a YAML path, plus
    `section.key=value` overrides -> (Config, label)."""
    from fp4lm.config import load_config

    path = pathlib.Path(model)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        return load_config(path, list(overrides)), path.stem
    for folder in _config_dirs():
        if (folder / f"{model}.yaml").is_file():
            return load_config(folder / f"{model}.yaml", list(overrides)), model
    presets = sorted({p.stem for folder in _config_dirs() if folder.is_dir() for p in folder.glob("*.yaml")})
    raise UserError(
        f"unknown model preset {model!r}; valid presets: {', '.join(presets) or '(none found)'}; "
        "or pass a YAML config path"
    )


# What the projection can speak for. Its efficiencies were fitted on 8k-token sequences of 8B..405B models
# with 8k..16k tokens per GPU; far beyond these a step's activations fit on no GPU in `GPUS` and the
# printed times would be arithmetic, not a projection.
MAX_SEQ_LEN = 1 << 20  # 1,048,576 tokens (the attention scores grow with its square)
MAX_TOKENS_PER_GPU = 1 << 22  # --batch x --seq: 4,194,304 tokens per GPU per step
MAX_PARAMS = 10**13  # 10 trillion parameters, 25x the largest calibrated model


def workload_from_config(config, *, seq: int | None = None, batch: int | None = None) -> Workload:
    """--seq defaults to data.seq_len; --batch (sequences per GPU) to project.batch_per_device."""
    for flag, value in (("--seq", seq), ("--batch", batch)):
        if value is not None and value <= 0:
            raise UserError(f"{flag} must be a positive integer, got {value}")
    from fp4lm.tokenizer import planned_model_vocab_size  # here: the data package imports jax and grain

    work = Workload(
        model=config.model,
        vocab_size=planned_model_vocab_size(config.data),
        seq_len=seq or config.data.seq_len,
        batch_per_gpu=batch or config.project.batch_per_device,
        bf16_first_layers=config.precision.bf16_first_layers,
        bf16_last_layers=config.precision.bf16_last_layers,
        expert_parallel=config.mesh.expert,
    )
    check_projectable(work)
    return work


def check_projectable(work: Workload) -> None:
    """Refuses a workload outside what the projection represents (`MAX_SEQ_LEN`, `MAX_TOKENS_PER_GPU`,
    `MAX_PARAMS`), naming the limit and the flag or key to change."""
    if work.seq_len > MAX_SEQ_LEN:
        raise UserError(
            f"--seq {work.seq_len:,} is longer than {MAX_SEQ_LEN:,} tokens, the longest sequence the "
            "projection represents; pass a smaller --seq (or data.seq_len)"
        )
    if work.tokens > MAX_TOKENS_PER_GPU:
        raise UserError(
            f"--batch x --seq = {work.batch_per_gpu:,} x {work.seq_len:,} = {work.tokens:,} tokens per GPU "
            f"per step, more than the {MAX_TOKENS_PER_GPU:,} the projection represents; pass a smaller "
            "--batch or --seq (or project.batch_per_device)"
        )
    params = workload_params(work)
    if params > MAX_PARAMS:
        raise UserError(
            f"the model has {params:,} parameters, more than the {MAX_PARAMS:,} the projection "
            "represents; reduce model.num_layers, model.d_model, model.mlp_dim or data.vocab_size"
        )


def unmodelled_settings(config) -> list[str]:
    """The config's settings the projection does not model, each with what it projects instead, so a plan of a
    config that sets them says so (docs/projection.md): fp8 attention, FSDP's 4-bit weight gathers and a
    capacity factor that drops tokens are all priced as their defaults."""
    p, m = config.precision, config.model
    notes = []
    if p.attention != "bf16":
        notes.append(f"precision.attention={p.attention} is not modelled: attention is projected in bf16")
    if p.fp4_param_gather:
        notes.append("precision.fp4_param_gather=true is not modelled: FSDP's weight gathers are projected in bf16")
    if m.capacity_factor is not None and m.num_experts:
        notes.append(
            f"model.capacity_factor={m.capacity_factor:g} is not modelled: every routed token is projected (dropless)"
        )
    return notes
