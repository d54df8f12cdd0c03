"""The verdicts of the reproductions (asyncfl_jax.reproduce.verdicts): a gap within the noise is never a win, the
flattened-curve check, the share of uploads of the fastest clients, equal-budget comparisons."""

import math

import numpy as np
import pytest

from asyncfl_jax.reproduce import verdicts as V


def run(values, axis=None, key="uploads"):
    x = np.arange(1, len(values) + 1, dtype=float) * 10 if axis is None else np.asarray(axis, float)
    return {key: x, "accuracy": np.asarray(values, float)}


def flat_runs(level, seeds_offsets, n=20):
    return [run(np.full(n, level + d)) for d in seeds_offsets]


def test_seed_spread_is_the_pooled_sample_std():
    assert V.seed_spread([1.0, 3.0], [2.0, 2.0]) == pytest.approx(math.sqrt((2.0 + 0.0) / 2))
    assert math.isnan(V.seed_spread([1.0], [1.0, 2.0]))


@pytest.mark.parametrize("gap, spread, expected", [(0.05, 0.01, "holds"), (0.019, 0.01, "within noise"),
                                                   (-0.019, 0.01, "within noise"), (-0.03, 0.01, "reversed"),
                                                   (0.05, math.nan, "one seed"), (math.nan, 0.01, "diverged")])
def test_outcome_needs_twice_the_noise(gap, spread, expected):
    assert V.outcome(gap, spread) == expected


def test_a_gap_within_the_noise_is_not_a_win():
    # method above the baseline by 1 point with a seed spread of about 1 point: direction holds, no win
    method = flat_runs(0.81, [-0.01, 0.0, 0.01])
    baseline = flat_runs(0.80, [-0.01, 0.0, 0.01])
    v = V.compare("CA2FL above FedBuff", method, baseline)
    assert v.direction_holds and v.gap == pytest.approx(0.01)
    assert v.gap_in_spread == pytest.approx(1.0)
    assert v.outcome == "within noise" and v.needs_more_seeds
    row = V.verdict_row(v)
    assert "within noise (needs 5 seeds)" in row and "holds |" in row  # direction column, not the verdict
    # the same gap with five times less noise is a win, and needs no more seeds
    v = V.compare("c", flat_runs(0.81, [-0.002, 0.0, 0.002]), flat_runs(0.80, [-0.002, 0.0, 0.002]))
    assert v.outcome == "holds" and not v.needs_more_seeds


def test_five_seeds_within_noise_need_no_more_seeds():
    offsets = [-0.02, -0.01, 0.0, 0.01, 0.02]
    v = V.compare("c", flat_runs(0.805, offsets), flat_runs(0.80, offsets))
    assert v.outcome == "within noise" and v.seeds == 5 and not v.needs_more_seeds


def test_lower_is_better_flips_the_gap():
    v = V.compare("lower loss", flat_runs(0.3, [0.0, 0.001]), flat_runs(0.5, [0.0, 0.001]), higher_is_better=False)
    assert v.gap == pytest.approx(0.2) and v.outcome == "holds"


def test_curve_flattened():
    x = np.linspace(0, 1000, 51)
    assert V.curve_flattened(x, 0.8 - 0.3 * np.exp(-x / 50))  # saturated long before the end
    assert not V.curve_flattened(x, 0.5 + 0.0003 * x)  # still rising 6 points over the last 20%
    rng = np.random.default_rng(0)
    assert V.curve_flattened(x, 0.8 + 0.004 * rng.standard_normal(x.size))  # level with noise
    assert V.curve_flattened(x, 0.9 - 0.0001 * x)  # falling
    assert not V.curve_flattened(x[:2], [0.1, 0.2])  # no evidence


def test_compare_reports_unflattened_curves():
    x = np.linspace(10, 1000, 40)
    rising = [{"uploads": x, "accuracy": 0.5 + 0.0003 * x + d} for d in (0.0, 0.001)]
    flat = [{"uploads": x, "accuracy": np.full(x.size, 0.6 + d)} for d in (0.0, 0.001)]
    assert not V.compare("c", rising, flat).flattened
    assert V.compare("c", flat, flat).flattened


def test_equal_budget_is_the_smallest_end_of_the_runs():
    # a method that reaches time 50 and one that reaches time 100: both read at time 50
    fast = [{"times": np.arange(1, 11) * 5.0, "accuracy": np.linspace(0.1, 0.6, 10) + d} for d in (0, 0.001)]
    slow = [{"times": np.arange(1, 11) * 10.0, "accuracy": np.linspace(0.1, 0.9, 10) + d} for d in (0, 0.001)]
    v = V.compare("c", slow, fast, axis="times")
    assert v.budget == "equal virtual time"
    assert v.baseline == pytest.approx((0.1 + 0.5 * 8 / 9 + 0.6) / 2 + 0.0005)  # its evaluations at times 45, 50
    assert v.method == pytest.approx(0.1 + 0.8 * 4 / 9 + 0.0005)  # the slow one's evaluation at time 50
    with pytest.raises(ValueError, match="axis must be one of"):
        V.compare("c", slow, fast, axis="time")


def test_value_at_budget_diverged_and_empty():
    assert math.isnan(V.value_at_budget([10, 20], [0.5, float("nan")], 20))
    assert math.isnan(V.value_at_budget([10, 20], [0.5, 0.6], 5))


def test_fastest_share():
    counts = np.array([10, 1, 1, 1, 1, 1, 1, 1, 1, 2])
    times = np.array([0.5, 3, 3, 3, 3, 3, 3, 3, 3, 1.0])  # clients 0 and 9 are the fastest 20%
    assert V.fastest_share(counts, times) == pytest.approx(12 / 20)
    assert V.fastest_share(np.ones(10), np.arange(10.0)) == pytest.approx(0.2)  # uniform participation: 20%
    with pytest.raises(ValueError, match="one upload count and one job time per client"):
        V.fastest_share(counts, times[:5])


def test_schedule_fastest_share_follows_the_speeds():
    from asyncfl_jax import make_schedule
    from asyncfl_jax.timing import DelayModel

    delays = DelayModel(speed="exponential", speed_value=30.0, noise="exponential", noise_scale=1.0, comm_time=1.0)
    skewed = make_schedule("all_active", 20, 400, delays, 0)
    share = V.schedule_fastest_share(skewed, delays, 0)
    assert 0.5 < share <= 1.0  # all clients always training: the fast ones upload most
    even = DelayModel.constant(1.0)
    assert V.schedule_fastest_share(make_schedule("all_active", 20, 400, even, 0), even, 0) == pytest.approx(0.2)


def test_verdict_lines_and_json():
    v = V.compare("c", flat_runs(0.9, [0.0, 0.001]), flat_runs(0.8, [0.0, 0.001]), paper="+3.2")
    lines = V.verdict_lines([v])
    assert lines[2].startswith("| claim |") and "| +3.2 |" in lines[4]
    assert V.verdict_json(v)["outcome"] == "holds"
    assert V.verdict_lines([]) == []
