"""`fp4lm compare --seeds`: the paired gap statistics (checked by hand) and the orchestration (fake trainer)."""

import json
import math

import pytest

from fp4lm.errors import UserError
from fp4lm.report import stats
from fp4lm.report.results import aggregate
from tests.compare.helpers_report import main_compare
from tests.report.synthetic_runs import SMALL_MODEL
from tests.report.test_report_records import make_record


def test_paired_gap_matches_a_hand_computation():
    """bf16 on seeds 0, 1, 2: 4.00, 4.10, 3.90; nvfp4: 4.04, 4.10, 3.9585.

    Paired gaps d = 100 * (nvfp4 - bf16) / bf16 = 1.0, 0.0, 1.5 (%).
    mean = 2.5 / 3 = 0.83333; deviations 0.16667, -0.83333, 0.66667; squares 0.027778 + 0.694444 + 0.444444
    = 1.166667; sd = sqrt(1.166667 / 2) = 0.763763; standard error = sd / sqrt(3) = 0.440959;
    t(0.975, 2 dof) = 4.302653 (tables); half width = 1.897291; interval [-1.06396, 2.73062]: contains 0,
    within noise.
    """
    interval = stats.paired_gap({0: 4.04, 1: 4.10, 2: 3.9585}, {0: 4.00, 1: 4.10, 2: 3.90})
    assert interval is not None and interval.seeds == (0, 1, 2)
    assert interval.per_seed_pct == pytest.approx((1.0, 0.0, 1.5))
    assert interval.mean_pct == pytest.approx(0.833333, abs=1e-5)
    assert interval.sd_pct == pytest.approx(0.763763, abs=1e-5)
    assert (interval.low_pct, interval.high_pct) == pytest.approx((-1.06396, 2.73062), abs=1e-4)
    assert interval.within_noise is True


def test_five_seeds_outside_noise_one_seed_no_interval_and_the_noise_band():
    """Five seeds, gaps 1.0, 1.2, 0.8, 1.1, 0.9 (%): mean 1.0, squares 0 + .04 + .04 + .01 + .01 = 0.1,
    sd = sqrt(0.1 / 4) = 0.158114, se = 0.0707107, t(4) = 2.776445, half width 0.196324: [0.80368, 1.19632],
    worse than bf16.

    Noise band pooled with the three-seed recipe above (squares 1.166667, 2 dof): sqrt((1.166667 + 0.1) / 6)
    = 0.459468, t(6) = 2.446912: band 1.124278. One seed: no interval.
    """
    base = {s: 4.0 for s in range(5)}
    five = stats.paired_gap({s: 4.0 * (1 + g / 100) for s, g in enumerate((1.0, 1.2, 0.8, 1.1, 0.9))}, base)
    assert five is not None
    assert (five.low_pct, five.high_pct) == pytest.approx((0.80368, 1.19632), abs=1e-4)
    assert five.within_noise is False
    three = stats.paired_gap({0: 4.04, 1: 4.10, 2: 3.9585}, {0: 4.00, 1: 4.10, 2: 3.90})
    assert three is not None
    single = stats.paired_gap({0: 4.02}, base)
    assert single is not None and single.low_pct is None and single.within_noise is None
    assert single.mean_pct == pytest.approx(0.5)
    band = stats.noise_band([five, three, single])
    assert band is not None and band["dof"] == 6
    assert band["band_pct"] == pytest.approx(1.124278, abs=1e-4)
    assert stats.noise_band([single]) is None


def seeded(tmp_path, group, recipe, seed, val_loss, *, single_seed=False):
    """A synthetic record of `group` on `seed` whose final validation loss is `val_loss`."""
    record = make_record(tmp_path, f"{group}_seed-{seed}", recipe, offset=0.0)
    record.update(group=group, seed=seed, single_seed=single_seed)
    record["final"]["val_loss"] = val_loss
    return record


def test_results_give_mean_per_seed_interval_and_verdicts(tmp_path):
    records = [
        seeded(tmp_path, "bf16", "bf16", 0, 4.00),
        seeded(tmp_path, "bf16", "bf16", 1, 4.10),
        seeded(tmp_path, "bf16", "bf16", 2, 3.90),
        seeded(tmp_path, "nvfp4", "nvfp4", 0, 4.04),
        seeded(tmp_path, "nvfp4", "nvfp4", 1, 4.10),
        seeded(tmp_path, "nvfp4", "nvfp4", 2, 3.9585),
        seeded(tmp_path, "fp8", "fp8", 0, 4.08, single_seed=True),  # +2.0%
    ]
    results = aggregate(records, command="c", preset=None)
    assert results["order"] == ["bf16", "nvfp4", "fp8"]
    nvfp4 = results["recipes"]["nvfp4"]
    assert nvfp4["seeds"] == [0, 1, 2]
    assert nvfp4["final"]["val_loss"] == pytest.approx((4.04 + 4.10 + 3.9585) / 3)
    assert [p["val_loss"] for p in nvfp4["per_seed"]] == [4.04, 4.10, 3.9585]
    assert nvfp4["gap"]["ci95_pct"] == pytest.approx([-1.06396, 2.73062], abs=1e-4)
    assert nvfp4["verdict"] == "within noise"
    # The band from nvfp4 alone: t(2) * 0.763763 = 3.28620; fp8's single-seed +2.0% lies inside it.
    assert results["noise"]["band"]["band_pct"] == pytest.approx(3.28620, abs=1e-4)
    assert results["recipes"]["fp8"]["gap"]["ci95_pct"] is None
    assert results["recipes"]["fp8"]["verdict"] == "1 seed: inside noise band"
    assert results["noise"]["bf16_spread_pct"] == pytest.approx(100 * 0.1 / 4.0)
    rows = {row["label"]: row for row in results["table"]}
    assert rows["fp8"]["seeds"] == "0 (single seed)" and rows["fp8"]["gap_ci"] == "none (1 seed)"
    assert rows["bf16"]["verdict"] == "baseline"
    json.dumps(results, allow_nan=False)


def compare(out, *args):
    return main_compare(["--out", str(out), *SMALL_MODEL, *args])


def test_seeds_run_every_recipe_per_seed_and_resume(tmp_path, fake_trainer):
    _, calls = fake_trainer
    out = tmp_path / "cmp"
    assert compare(out, "--recipes", "bf16,nvfp4", "--seeds", "2", "--ablations", "fp8") == 0
    assert calls() == ["bf16_seed-0", "bf16_seed-1", "nvfp4_seed-0", "nvfp4_seed-1", "fp8_seed-0"]
    record = json.loads((out / "records" / "nvfp4_seed-1.json").read_text())
    assert record["seed"] == 1 and record["group"] == "nvfp4" and record["config"]["train"]["seed"] == 1
    results = json.loads((out / "results.json").read_text())
    assert results["order"] == ["bf16", "nvfp4", "fp8"]
    nvfp4 = results["recipes"]["nvfp4"]
    # fake_trainer: nvfp4 - bf16 = 0.05 + 0.004 * seed on every loss, so the two paired gaps differ.
    base = [p["val_loss"] for p in results["recipes"]["bf16"]["per_seed"]]
    expected = [100 * (0.05 + 0.004 * s) / base[s] for s in (0, 1)]
    assert nvfp4["gap"]["per_seed_pct"] == pytest.approx(expected)
    half = 12.7062 * abs(expected[1] - expected[0]) / math.sqrt(2) / math.sqrt(2)
    assert nvfp4["gap"]["ci95_pct"] == pytest.approx([sum(expected) / 2 - half, sum(expected) / 2 + half], rel=1e-4)
    assert nvfp4["curves"]["gap"]["low_pct"][-1] == pytest.approx(nvfp4["gap"]["ci95_pct"][0])
    assert results["recipes"]["fp8"]["single_seed"] and results["recipes"]["fp8"]["seeds"] == [0]
    page = (out / "report.html").read_text()
    assert "single seed" in page and "95%" in page

    assert compare(out, "--recipes", "bf16,nvfp4", "--seeds", "0,1,2", "--ablations", "fp8") == 0
    assert calls()[5:] == ["bf16_seed-2", "nvfp4_seed-2"]  # seeds 0 and 1 reused


def test_seed_zero_of_a_one_seed_comparison_is_reused_and_says_so(tmp_path, fake_trainer):
    _, calls = fake_trainer
    first = tmp_path / "first"
    assert compare(first, "--recipes", "bf16") == 0
    out = tmp_path / "seeded"
    assert compare(out, "--recipes", "bf16", "--seeds", "2", "--reuse", str(first)) == 0
    assert calls() == ["bf16", "bf16_seed-1"]
    reused = json.loads((out / "records" / "bf16_seed-0.json").read_text())
    assert reused["reused_from"] == str(first / "records" / "bf16.json")
    assert reused["label"] == "bf16_seed-0" and reused["seed"] == 0
    assert "reused_from" not in json.loads((out / "records" / "bf16_seed-1.json").read_text())


def test_bad_seed_arguments_are_user_errors(tmp_path, fake_trainer):
    _, calls = fake_trainer
    out = tmp_path / "cmp"
    for seeds, message in (("x", "not a count"), ("0", "runs nothing"), ("1,1", "a seed twice")):
        with pytest.raises(UserError, match=message):
            compare(out, "--recipes", "bf16", "--seeds", seeds)
    with pytest.raises(UserError, match="train.seed is set by --seeds"):
        compare(out, "--recipes", "bf16", "--seeds", "2", "train.seed=3")
    with pytest.raises(UserError, match="sets train.seed, which --seeds sets"):
        compare(out, "--recipes", "bf16@train.seed=3", "--seeds", "2")
    with pytest.raises(UserError, match="has no records/ directory"):
        compare(out, "--recipes", "bf16", "--seeds", "2", "--reuse", str(tmp_path / "nowhere"))
    with pytest.raises(UserError, match="name the same run"):
        compare(out, "--recipes", "bf16,nvfp4", "--ablations", "nvfp4", "--seeds", "2")
    assert calls() == [] and not out.exists()


def test_same_seed_gives_every_recipe_the_same_initial_weights_and_batches(tmp_path):
    """What --seeds relies on: the trainer initialises from train.seed whatever the recipe, and the data
    order depends on the data settings and the seed only (fp4lm.data.build takes no precision setting)."""
    import jax
    import numpy as np

    import fp4lm.data
    from fp4lm.config import load_config
    from fp4lm.quant import Policy
    from fp4lm.train.model_setup import init_params

    def weights(recipe, seed):
        config = load_config(None, [*SMALL_MODEL, f"precision.recipe={recipe}", f"train.seed={seed}"])
        policy = Policy(recipe, num_layers=config.model.num_layers, backend="emulated")
        return jax.tree.leaves(init_params(config, 256, policy))

    for a, b in zip(weights("bf16", 0), weights("nvfp4", 0), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert any(not np.array_equal(a, b) for a, b in zip(weights("nvfp4", 0), weights("nvfp4", 1), strict=True))

    def first_batch(seed):
        config = load_config(None, [*SMALL_MODEL, f"train.seed={seed}"])
        data = fp4lm.data.build(config.data, run_dir=None, seed=seed, batch_size=config.train.batch_size)
        return next(data.train_iterator)["inputs"]

    np.testing.assert_array_equal(first_batch(0), first_batch(0))
    assert not np.array_equal(first_batch(0), first_batch(1))
