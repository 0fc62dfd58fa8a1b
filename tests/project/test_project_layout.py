"""fp4lm.project.layout: a job's communication against hand counts, its bubble, its links, its refusals, and
its errors against NVIDIA's published Megatron-Bridge rows."""

import json
import subprocess
import sys

import pytest

from fp4lm.config import ModelConfig
from fp4lm.errors import UserError
from fp4lm.project import Layout, Network, Workload, get_gpu, layout_step, main_project, project, workload_params
from fp4lm.project.layout import COLLECTIVE_EFFICIENCY, TP_EXPOSED, check_layout, microbatch_workload
from fp4lm.project.roofline import RECIPE_COSTS, step_components

MODEL = ModelConfig(num_layers=8, d_model=1024, num_heads=8, num_kv_heads=4, head_dim=128, mlp_dim=2048)
MOE = ModelConfig(
    num_layers=4, d_model=1024, num_heads=8, num_kv_heads=4, head_dim=128, mlp_dim=2048, num_experts=8,
    experts_per_token=2, moe_mlp_dim=512,
)  # fmt: skip
SEQ = 4096
GB200 = get_gpu("gb200")


def _work(model=MODEL):
    return Workload(model=model, vocab_size=32000, seq_len=SEQ, batch_per_gpu=1)


def _step(layout, network=None, model=MODEL, recipe="nvfp4"):
    network = network or Network.of(GB200)
    return layout_step(_work(model), layout, network, GB200, RECIPE_COSTS[recipe])


def _bytes(step):
    return {t.name: t.bytes for t in step.traffic}


def test_every_kind_of_traffic_is_the_hand_counted_volume():
    """TP2 PP2 VP2 DP4 on 16 GPUs, 8 microbatches: per GPU per step, by the formulas of docs/projection.md."""
    layout = Layout(gpus=16, gbs=32, seq=SEQ, tp=2, pp=2, vp=2)
    assert (layout.dp, layout.microbatches) == (4, 8)
    step = _step(layout)
    activation = 2 * SEQ * 1024  # one microbatch's bf16 activations
    # 8 blocks of q, k, v, o, gate, up, down and two norms; embedding, head and the final norm
    params = 8 * 9 * 1024**2 + 2 * 32000 * 1024 + (8 * 2 + 1) * 1024
    assert workload_params(_work()) == params
    assert _bytes(step) == pytest.approx(
        {
            "tensor": 8 * (8 * 1 / 2 * activation) * 4,  # 8 microbatches x 8 collectives x 4 blocks on the stage
            "pipeline": 8 * 2 * 2 * activation / 2,  # 8 microbatches x 2 directions x 2 virtual stages, TP-split
            "data": 3 / 4 * params / 4 * (2 + 4),  # bf16 gather + fp32 reduce-scatter of a quarter of the model
        }
    )
    nvlink = 900e9 * COLLECTIVE_EFFICIENCY
    tensor = next(t for t in step.traffic if t.name == "tensor")
    assert (tensor.link, tensor.group) == ("nvlink", 2)
    assert tensor.seconds == pytest.approx(tensor.bytes / nvlink)
    assert tensor.exposed_s == pytest.approx(TP_EXPOSED * tensor.seconds)
    assert next(t for t in step.traffic if t.name == "data").exposed_s == 0  # hidden behind a microbatch


def test_context_fsdp_and_expert_traffic_are_the_hand_counted_volume():
    context = _step(Layout(gpus=4, gbs=2, seq=SEQ, cp=2))  # DP2 CP2, one microbatch
    chunk = 2 * (SEQ // 2) * 2 * 4 * 128  # K and V of half the sequence, 4 key/value heads of 128, bf16
    assert _bytes(context)["context"] == pytest.approx(3 * 1 * chunk * 8)
    assert _bytes(context)["data"] == pytest.approx(3 / 4 * workload_params(_work()) * 6)  # over DP x CP = 4

    fsdp = _step(Layout(gpus=8, gbs=16, seq=SEQ, mbs=2, fsdp=True))  # one microbatch of 2 sequences
    assert _bytes(fsdp) == pytest.approx({"data": 7 / 8 * workload_params(_work()) * (2 + 2 + 4)})

    experts = _step(Layout(gpus=8, gbs=16, seq=SEQ, ep=4), model=MOE)  # 2 microbatches
    rows = SEQ * 2  # each token's two experts
    # 2 microbatches x 4 transfers x bf16 rows x 3/4 leaving the GPU x 4 MoE blocks
    assert _bytes(experts)["expert"] == pytest.approx(2 * 4 * 2 * rows * 1024 * 3 / 4 * 4)


def test_the_bubble_is_pp_minus_one_over_vp_microbatches():
    for vp in (1, 4):
        layout = Layout(gpus=16, gbs=64, seq=SEQ, tp=2, pp=4, vp=vp)
        step = _step(layout)
        c = step.components
        compute = sum(v for k, v in c.items() if k not in ("communication", "bubble", "optimizer"))
        hidden_by_microbatch = sum(t.exposed_s for t in step.traffic if t.name == "tensor")
        microbatch = (compute + hidden_by_microbatch) / layout.microbatches
        assert c["bubble"] == pytest.approx(3 / vp * microbatch)
        assert step.step_time_s == pytest.approx(sum(c.values()))


def test_one_gpu_layout_is_the_one_gpu_projection():
    """gpus=1: no communication, no bubble, and the compute of the one-GPU model over the same tokens."""
    alone = step_components(Workload(MODEL, 32000, SEQ, 2), GB200, RECIPE_COSTS["nvfp4"])
    step = _step(Layout(gpus=1, gbs=2, seq=SEQ, mbs=2))
    assert step.traffic == () and step.components["communication"] == step.components["bubble"] == 0
    for name in ("gemm", "quantization", "attention", "elementwise", "lm_head"):
        assert step.components[name] == pytest.approx(alone[name]), name


def test_tensor_parallel_splits_the_gemms_and_context_parallel_the_tokens():
    base = microbatch_workload(_work(), Layout(gpus=1, gbs=1, seq=SEQ))
    split = microbatch_workload(_work(), Layout(gpus=4, gbs=1, seq=SEQ, tp=2, cp=2))
    assert (split.tokens, split.local_tokens) == (base.tokens // 2, base.tokens // 4)
    wide = _work(ModelConfig(num_layers=2, d_model=8192, num_heads=64, num_kv_heads=8, mlp_dim=28672))
    one = project(wide, "gb200", ("bf16",), layout=Layout(gpus=1, gbs=1, seq=SEQ)).rows[0].components
    tp2 = project(wide, "gb200", ("bf16",), layout=Layout(gpus=2, gbs=1, seq=SEQ, tp=2)).rows[0].components
    assert tp2["gemm"] == pytest.approx(one["gemm"] / 2, rel=0.02)  # half of each weight, same tokens
    assert tp2["attention"] == pytest.approx(one["attention"] / 2)  # half of the heads


def test_a_group_beyond_the_nvlink_domain_talks_over_the_scale_out_network():
    layout = Layout(gpus=16, gbs=32, seq=SEQ, tp=2, pp=2, vp=2)
    small = Network.of(GB200, nvlink_domain=4, scaleout_gb_per_s=25)
    links = {t.name: t.link for t in _step(layout, small).traffic}
    assert links == {"tensor": "nvlink", "pipeline": "scale-out", "data": "scale-out"}
    data = next(t for t in _step(layout, small).traffic if t.name == "data")
    assert data.seconds == pytest.approx(data.bytes / (25e9 * COLLECTIVE_EFFICIENCY))
    assert _step(layout, small).step_time_s > _step(layout).step_time_s


@pytest.mark.parametrize(
    "layout, words",
    [
        (Layout(gpus=6, gbs=8, seq=SEQ, tp=4), ["--gpus 6", "TP x PP x CP = 4"]),
        (Layout(gpus=8, gbs=6, seq=SEQ, tp=2), ["--gbs 6", "4 x 1"]),
        (Layout(gpus=16, gbs=16, seq=SEQ, tp=16), ["--tp 16", "8 heads"]),
        (Layout(gpus=8, gbs=8, seq=SEQ, vp=2), ["--vp", "--pp"]),
        (Layout(gpus=64, gbs=64, seq=SEQ, pp=8, vp=2), ["16 stages", "8 blocks"]),
        (Layout(gpus=8, gbs=8, seq=SEQ, ep=2), ["--ep", "dense"]),
        (Layout(gpus=0, gbs=8, seq=SEQ), ["--gpus must be a positive integer"]),
        (Layout(gpus=8, gbs=8, seq=SEQ, cp=3), ["--gpus 8", "CP"]),
    ],
)
def test_a_layout_the_model_cannot_take_is_refused_in_one_line(layout, words):
    with pytest.raises(UserError) as info:
        check_layout(layout, _work())
    assert "\n" not in str(info.value)
    for word in words:
        assert word in str(info.value)


def test_the_megatron_bridge_rows_under_their_layouts():
    """The layout model lands within 35% of every published row and within 12% on average, twice as close as
    one GPU's step over the same tokens: a guard on the shipped constants (the table is in BENCHMARKS.md)."""
    from fp4lm.project.calibration import layout_report

    def absolute_errors(with_layout):
        rows = layout_report(with_layout=with_layout)
        return [abs(r.error_pct) for r in rows if "tokens/s/GPU" in r.quantity]

    with_layout, alone = absolute_errors(True), absolute_errors(False)
    assert max(with_layout) < 35
    mean_with_layout, mean_alone = sum(with_layout) / len(with_layout), sum(alone) / len(alone)
    assert mean_with_layout < 12 and 2 * mean_with_layout < mean_alone


def test_the_cli_prints_the_layout_and_its_communication():
    args = ["project", "--model", "llama3-70b", "--gpu", "gb200", "--gpus", "64", "--tp", "2", "--pp", "4"]
    text = main_project("llama3-70b", "gb200", recipes="fp8,nvfp4", layout=dict(gpus=64, tp=2, pp=4, vp=5, gbs=256))
    assert "64 GB200s, TP2 PP4 VP5 CP1 EP1 DP8 MBS1 GBS256" in text and "32 microbatches" in text
    assert "tensor" in text and "pipeline" in text and "over nvlink" in text
    data = json.loads(
        main_project("llama3-70b", "gb200", recipes="nvfp4", as_json=True, layout=dict(gpus=64, tp=2, pp=4, gbs=256))
    )
    row = data["nvfp4"]
    assert set(row["communication"]) == {"tensor", "pipeline", "data"}
    assert sum(row["breakdown"].values()) == pytest.approx(row["step_time_s"])
    assert row["breakdown"]["bubble"] > 0 and data["layout"]["dp"] == 8
    assert row["tokens_per_sec"] == pytest.approx(256 * 8192 / 64 / row["step_time_s"])
    cli = [sys.executable, "-m", "fp4lm", *args]
    refused = subprocess.run(cli, capture_output=True, text=True)  # --pp without --gbs
    assert refused.returncode == 2 and "--pp needs --gbs" in refused.stderr
    assert "Traceback" not in refused.stderr
    no_gpus = subprocess.run([sys.executable, "-m", "fp4lm", *args[:5], "--tp", "2"], capture_output=True, text=True)
    assert no_gpus.returncode == 2 and "--tp needs --gpus" in no_gpus.stderr


def test_a_mixture_of_experts_under_a_layout_reports_its_microbatch_and_its_all_to_all():
    result = project(_work(MOE), "gb200", ("nvfp4",), layout=Layout(gpus=8, gbs=16, seq=SEQ, ep=4))
    moe = result.moe_summary()
    assert moe is not None
    assert moe["tokens_per_expert"] == 4 * SEQ * 2 / 8  # EP x one sequence's tokens x top-2 / 8 experts
    expert = next(t for t in result.rows[0].traffic if t.name == "expert")
    assert moe["all_to_all_bytes_per_gpu"] == expert.bytes and moe["all_to_all_s_at_nvlink"] is None
    assert "all-to-all" in result.table() and "assumed overlapped" not in result.table()


def test_the_expert_all_to_all_with_pipeline_stages_is_the_stages_share():
    """PP2 VP2 EP4 DP8 on 16 GPUs, 2 microbatches: each GPU holds 2 of the 4 MoE blocks (two virtual stages of
    one), so it sends half of what one stage holding all 4 would (the hand count of the test above, 2 blocks)."""
    layout = Layout(gpus=16, gbs=16, seq=SEQ, pp=2, vp=2, ep=4)
    assert (layout.dp, layout.microbatches) == (8, 2)
    rows = SEQ * 2  # each token's two experts
    # 2 microbatches x 4 transfers x bf16 rows x 3/4 leaving the GPU x 2 MoE blocks on the stage
    assert _bytes(_step(layout, model=MOE))["expert"] == pytest.approx(2 * 4 * 2 * rows * 1024 * 3 / 4 * 2)
