"""The memory estimate made before a run is built (fp4lm.train.memory), and the CLI's answer to an
out-of-memory error the estimate let through."""

from __future__ import annotations

import math
import pathlib

import pytest
import yaml

from fp4lm import cli
from fp4lm.config import load_config
from fp4lm.config.tiny import TINY_DATA, TINY_MODEL
from fp4lm.errors import UserError
from fp4lm.hardware import get_gpu
from fp4lm.model.memory_estimate import OVERESTIMATE_MARGIN, estimate_training_memory, exceeds, parameter_count
from fp4lm.sharding import MESH_AXES, mesh_shape
from fp4lm.train import memory
from fp4lm.train.memory import check_training_fits

GIB = 1 << 30
CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
BUNDLED = ("default", "shakespeare", "cpu-large", "moe")
TINY = [*TINY_MODEL, *TINY_DATA]


@pytest.mark.parametrize("tie", [False, True])
def test_parameter_count_matches_the_model(tie):
    from fp4lm.model import param_count
    from fp4lm.quant import Policy
    from fp4lm.train.model_setup import abstract_model

    config = load_config(None, [*TINY, "model.num_layers=2", f"model.tie_embeddings={str(tie).lower()}"])
    model = abstract_model(config, config.data.vocab_size, Policy.from_config(config))
    assert parameter_count(config) == param_count(model)


MOE = ["model.num_experts=8", "model.experts_per_token=2", "model.moe_mlp_dim=32", "model.num_layers=3"]


def test_parameter_count_matches_a_moe_model():
    """Dense first block, shared experts, q/k norms and the routers; their selection biases are no parameters."""
    from fp4lm.model import param_count
    from fp4lm.quant import Policy
    from fp4lm.train.model_setup import abstract_model

    extra = ["model.first_dense_layers=1", "model.num_shared_experts=1", "model.qk_norm=true"]
    config = load_config(None, [*TINY, *MOE, *extra, "model.router_bias_update=0.001"])
    model = abstract_model(config, config.data.vocab_size, Policy.from_config(config))
    assert parameter_count(config) == param_count(model)


def test_a_moe_block_holds_every_expert_but_keeps_activations_of_the_chosen_ones():
    """Weights and optimizer state grow with num_experts; the activations with experts_per_token, and with
    num_experts only through the router's [tokens, X] scores (never [tokens, X, D])."""
    sizes = (1, 1, 1)
    base = [*TINY, *MOE]
    estimate = estimate_training_memory(load_config(None, base), sizes)
    more_experts = estimate_training_memory(load_config(None, [*base, "model.num_experts=16"]), sizes)
    more_chosen = estimate_training_memory(load_config(None, [*base, "model.experts_per_token=4"]), sizes)
    expert_weights = 3 * 32 * 32 * 3  # gate, up, down of one expert (d_model 32, width 32), in 3 blocks
    router = 32 * 3
    assert more_experts.params - estimate.params == 8 * (expert_weights + router)
    tokens = 4 * 32
    # the routers' scores only: kept by the 3 blocks, and again in the working set of the one differentiated
    assert more_experts.activations - estimate.activations == (3 + 1) * tokens * 12 * 8
    assert more_chosen.params == estimate.params
    assert more_chosen.activations - estimate.activations >= 3 * tokens * 2 * (12 * 32 + 16 * 32)


def test_expert_parallelism_counts_the_gathered_batch_and_whole_experts():
    """On 8 devices (fp4lm/model/expert_parallel.py) each device gathers the batch's 256 tokens and runs one
    whole expert over the up to 256 pairs routed to it: far more than its own 32 tokens' 64 pairs, and the
    same whichever axes make up the 8 devices (each runs one expert either way)."""
    config = load_config(None, [*TINY, *MOE, "train.batch_size=8"])  # 8 x 32 tokens, d_model 32, width 32
    d, width, k, batch_tokens = 32, 32, 2, 8 * 32
    moe_rows = 3 * batch_tokens * (12 * d + 16 * width)  # 3 MoE blocks, each expert's worst case: every token
    gathered = 3 * batch_tokens * (6 * d + 8 * k)
    for sizes, expert in (((2, 1, 1), 4), ((8, 1, 1), 1), ((1, 2, 2), 2)):
        estimate = estimate_training_memory(config, sizes, expert)
        assert estimate.activations >= moe_rows + gathered, (sizes, expert)
    assert len({estimate_training_memory(config, s, e).activations for s, e in (((2, 1, 1), 4), ((8, 1, 1), 1))}) == 1


@pytest.mark.parametrize("config_file", [None, *(str(CONFIGS / f"{name}.yaml") for name in BUNDLED)])
def test_bundled_configs_are_far_below_any_host(config_file):
    """Calibration: what runs today must pass with a wide margin (under 2 GiB, where hosts have 8+)."""
    estimate = estimate_training_memory(load_config(config_file, []), (1, 1, 1))
    assert estimate.total < 2 * GIB
    check_training_fits(load_config(config_file, []), limit=(4 * GIB, "a 4 GiB test limit"))


SHAPES = sorted({path.stem for path in CONFIGS.glob("*.yaml")} - set(BUNDLED))


@pytest.mark.parametrize("name", SHAPES)
def test_each_shape_config_fits_an_80_gb_gpu_at_the_layout_it_states(name):
    """A shape config states its layout: a mesh over the devices its axes multiply to (a -1 axis counted as
    one device), train.batch_size over them and model.remat. The trainer's own criterion accepts that layout
    on an H100's 80 GiB, and its sequences per device are the ones `fp4lm project` assumes."""
    path = CONFIGS / f"{name}.yaml"
    config = load_config(path, [])
    devices = math.prod(max(1, getattr(config.mesh, axis)) for axis in MESH_AXES)
    data, fsdp, expert, tensor = mesh_shape(config.mesh, devices)
    estimate = estimate_training_memory(config, (data, fsdp, tensor), expert)
    assert not exceeds(estimate.total, get_gpu("h100").memory_gib * GIB), f"{estimate.total / GIB:.0f} GiB"
    if "project" in yaml.safe_load(path.read_text()):
        assert config.train.batch_size // (data * fsdp * expert) == config.project.batch_per_device


def test_tiny_test_config_is_tiny():
    assert estimate_training_memory(load_config(None, TINY), (1, 1, 1)).total < 64 << 20


def test_refusal_names_estimate_limit_and_fix():
    config = load_config(None, [*TINY, "data.seq_len=60000"])
    with pytest.raises(UserError) as info:
        check_training_fits(config, limit=(20 * GIB, "the host's available RAM, 20.0 GiB"))
    message = str(info.value)
    assert "\n" not in message
    for words in (
        "needs about",
        "per device",
        "activations",
        "more than the host's available RAM, 20.0 GiB",
        "; reduce",
        "data.seq_len",
        "model.remat=full",
        "or set train.check_memory=false to try anyway",
    ):
        assert words in message, (words, message)


def test_refuses_only_beyond_the_calibrated_over_estimate():
    """The estimate errs high by up to 60%: a limit it exceeds by less than that is no reason to refuse."""
    assert OVERESTIMATE_MARGIN == 1.6
    config = load_config(None, TINY)
    total = estimate_training_memory(config, (1, 1, 1)).total
    check_training_fits(config, limit=(total - 1, "a little under the estimate"))
    enough = math.ceil(total / OVERESTIMATE_MARGIN)  # the least the run could really need
    check_training_fits(config, limit=(enough, "the estimate less its over-estimate"))
    with pytest.raises(UserError):
        check_training_fits(config, limit=(enough - 1, "one byte short of that"))
    check_training_fits(load_config(None, [*TINY, "model.num_layers=100000000"]), limit=(None, ""))


@pytest.mark.parametrize(
    "override", ["model.d_model=1000000000", "data.vocab_size=1000000000", "model.num_layers=100000000"]
)
def test_check_memory_false_skips_the_check(override):
    refused = load_config(None, [*TINY, override])
    with pytest.raises(UserError):
        check_training_fits(refused, limit=(64 * GIB, "a 64 GiB test limit"))
    allowed = load_config(None, [*TINY, override, "train.check_memory=false"])
    check_training_fits(allowed, limit=(64 * GIB, "a 64 GiB test limit"))


def test_sharding_and_remat_reduce_the_estimate():
    config = load_config(None, [*TINY, "model.num_layers=8", "data.seq_len=1024", "train.batch_size=8"])
    one = estimate_training_memory(config, (1, 1, 1))
    fsdp = estimate_training_memory(config, (1, 4, 1))
    assert fsdp.state < one.state and fsdp.activations < one.activations
    remat = estimate_training_memory(
        load_config(None, [*TINY, "model.num_layers=8", "data.seq_len=1024", "train.batch_size=8", "model.remat=full"]),
        (1, 1, 1),
    )
    assert remat.activations < one.activations


def test_attention_scores_grow_with_the_square_of_the_sequence():
    short = estimate_training_memory(load_config(None, [*TINY, "data.seq_len=4096"]), (1, 1, 1)).activations
    long = estimate_training_memory(load_config(None, [*TINY, "data.seq_len=8192"]), (1, 1, 1)).activations
    assert 3.5 < long / short < 4.0


def test_host_limit_is_read():
    available = memory.host_available_bytes()
    assert available is not None and available > 0
    limit, where = memory.device_memory_limit()  # CPU in the test suite: the host's RAM
    assert limit is not None and limit > 0 and "RAM" in where


class XlaRuntimeError(Exception):
    """Stands in for jaxlib's error type (matched by name, so the CLI need not import jax)."""


@pytest.mark.parametrize(
    "error",
    [MemoryError(), XlaRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 115.20GiB.")],
)
def test_out_of_memory_is_one_line_exit_2(monkeypatch, capsys, error):
    def run(argv):
        raise error

    monkeypatch.setattr(cli, "run", run)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train"])
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: out of memory"), lines
    assert "; " in lines[0] and "train.batch_size" in lines[0]


def test_other_xla_errors_are_not_disguised_as_memory(monkeypatch):
    def run(argv):
        raise XlaRuntimeError("INTERNAL: something else")

    monkeypatch.setattr(cli, "run", run)
    with pytest.raises(XlaRuntimeError):
        cli.main(["train"])


ATTENTION = [
    "model.d_model=64",
    "model.num_heads=4",
    "model.num_kv_heads=2",
    "model.mlp_dim=128",
    "data.tokenizer=byte",
    "data.vocab_size=256",
    "train.batch_size=4",
    "data.seq_len=2048",
]
WIDE = [
    "model.num_layers=4",
    "model.d_model=512",
    "model.num_heads=8",
    "model.num_kv_heads=4",
    "model.mlp_dim=2048",
    "data.tokenizer=byte",
    "data.vocab_size=256",
    "train.batch_size=64",
    "data.seq_len=128",
]
LOGITS = [*ATTENTION, "model.num_layers=1", "data.vocab_size=65536", "train.batch_size=16", "data.seq_len=256"]
BF16 = "precision.recipe=bf16"


@pytest.mark.parametrize(
    "overrides, measured_bytes",
    [
        ([*ATTENTION, "model.num_layers=1", BF16], 1.26e9),
        ([*ATTENTION, "model.num_layers=2", BF16], 2.08e9),
        ([*ATTENTION, "model.num_layers=4", BF16], 3.79e9),
        ([*ATTENTION, "model.num_layers=2", "precision.recipe=nvfp4"], 2.2e9),
        ([*WIDE, BF16], 2.76e9),
        ([*WIDE, "precision.recipe=nvfp4"], 4.2e9),
        ([*LOGITS, BF16], 2.2e9),
    ],
)
def test_estimate_is_above_the_measured_peaks(overrides, measured_bytes):
    """The peaks measured on the 2-core CPU (see fp4lm.train.memory's docstring): the estimate errs high, but
    by less than 2x, so it neither lets an out-of-memory run through nor refuses much that would fit."""
    total = estimate_training_memory(load_config(None, overrides), (1, 1, 1)).total
    assert measured_bytes < total < 2 * measured_bytes


def test_quantized_blocks_add_their_emulation_temporaries():
    bf16 = estimate_training_memory(load_config(None, [*WIDE, BF16]), (1, 1, 1)).activations
    nvfp4 = estimate_training_memory(load_config(None, [*WIDE, "precision.recipe=nvfp4"]), (1, 1, 1)).activations
    last_in_bf16 = load_config(None, [*WIDE, "precision.recipe=nvfp4", "precision.bf16_last_layers=1"])
    assert bf16 < estimate_training_memory(last_in_bf16, (1, 1, 1)).activations < nvfp4
