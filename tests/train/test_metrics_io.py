"""metrics.jsonl writing, throughput arithmetic, and trimming records after a resume point."""

import json
import math

import numpy as np

from fp4lm.jsonio import json_value
from fp4lm.train.metrics import METRICS_FILE, MetricsWriter, drop_records_after
from fp4lm.train.throughput import throughput


def test_json_value_makes_plain_json():
    value = json_value({"a": np.float32(1.5), "b": np.int32(3), "c": float("nan"), "d": [np.float64(np.inf), True]})
    assert value == {"a": 1.5, "b": 3, "c": None, "d": [None, True]}
    json.dumps(value, allow_nan=False)


def test_throughput_arithmetic():
    t = throughput(step_time_s=0.5, tokens_per_step=1000, flops_per_step=4e12, num_devices=2, peak_tflops=2.0)
    assert t["tokens_per_sec"] == 2000
    assert math.isclose(t["tflops_per_sec"], 4.0)  # 4e12 FLOPs / 2 devices / 0.5 s
    assert math.isclose(t["mfu"], 2.0)


def test_writer_appends_lines_and_tensorboard(tmp_path):
    writer = MetricsWriter(tmp_path, tensorboard=True)
    writer.write({"step": 1, "loss": np.float32(2.5), "lr": 0.1})
    writer.write({"step": 1, "quant_stats": {"blocks.0.attn.q": {"x": {"amax": 3.0, "rel_err": float("nan")}}}})
    writer.write({"step": 2, "val_loss": 2.0})
    writer.close()
    lines = [json.loads(line) for line in (tmp_path / METRICS_FILE).read_text().splitlines()]
    assert lines[0] == {"step": 1, "loss": 2.5, "lr": 0.1}
    assert lines[1]["quant_stats"]["blocks.0.attn.q"]["x"] == {"amax": 3.0, "rel_err": None}
    assert lines[2] == {"step": 2, "val_loss": 2.0}
    assert list(tmp_path.glob("events.out.tfevents.*"))


class _Board:
    """Stands in for tensorboardX's SummaryWriter: remembers each scalar's tag."""

    def __init__(self):
        self.scalars = {}

    def add_scalar(self, tag, value, step):
        self.scalars[tag] = (value, step)

    def close(self):
        pass


def test_routing_of_a_moe_model_reaches_the_file_and_tensorboard(tmp_path):
    writer = MetricsWriter(tmp_path, tensorboard=False)
    board = writer._tensorboard = _Board()
    routing = {"blocks.1.mlp": {"max_over_mean_tokens": np.float32(1.5), "entropy": 2.0, "z_loss": float("nan")}}
    writer.write({"step": 10, "loss": 2.5, "routing": routing})
    writer.close()
    line = json.loads((tmp_path / METRICS_FILE).read_text())
    assert line["routing"] == {"blocks.1.mlp": {"max_over_mean_tokens": 1.5, "entropy": 2.0, "z_loss": None}}
    assert board.scalars == {
        "train/loss": (2.5, 10),
        "moe/blocks.1.mlp/max_over_mean_tokens": (1.5, 10),
        "moe/blocks.1.mlp/entropy": (2.0, 10),
    }


def test_disabled_writer_writes_nothing(tmp_path):
    writer = MetricsWriter(tmp_path, tensorboard=True, enabled=False)
    writer.write({"step": 1, "loss": 1.0})
    writer.close()
    assert list(tmp_path.iterdir()) == []


def test_drop_records_after(tmp_path):
    path = tmp_path / METRICS_FILE
    path.write_text('{"step": 1, "loss": 3}\n{"step": 2, "val_loss": 2}\n{"step": 3, "loss": 1}\n{"step": 4, "lo')
    drop_records_after(tmp_path, 2)
    assert path.read_text() == '{"step": 1, "loss": 3}\n{"step": 2, "val_loss": 2}\n'
    drop_records_after(tmp_path / "missing", 1)  # no file: nothing to do
