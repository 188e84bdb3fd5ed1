"""Clock offsets from traffic (pathprof.analysis.clock_offset), on constructed cases whose answer is known:
delays drawn from a floor plus queueing, one host's clock shifted by a known offset (and drift)."""
import numpy as np
import pytest
from pathprof.analysis.clock_offset import (
    InconsistentClocks,
    LinearOffset,
    Offset,
    drift,
    exchange_offset,
    fit,
    one_way_offset,
)


def _trips(rng, n, floor_ns, theta_ns, sign):
    """n one-way trips with true delays floor + exponential queueing, as the two clocks read them."""
    true = floor_ns + rng.exponential(20_000, n)
    return true, true + sign * theta_ns


@pytest.mark.parametrize("theta_ms", [-50.0, -3.7, 0.0, 0.0123, 12.5, 50.0])
def test_an_injected_offset_is_recovered_within_the_bound(theta_ms):
    rng = np.random.default_rng(21)
    theta = theta_ms * 1e6
    # asymmetric paths: 30 µs one way, 45 µs the other (the estimate cannot know; the bound must cover it)
    true_ab, d_ab = _trips(rng, 2000, 30_000, theta, +1)
    true_ba, d_ba = _trips(rng, 2000, 45_000, theta, -1)
    o = one_way_offset(d_ab, d_ba)
    assert o.contains(theta)
    assert abs(o.offset_ns - theta) <= o.bound_ns
    # the bound is half the fastest round trip: ~ (30 + 45) / 2 µs, not more
    assert o.bound_ns == pytest.approx((true_ab.min() + true_ba.min()) / 2)
    assert o.bound_ns < 40_000
    # the asymmetry is the error: (30 - 45) / 2 µs off, and no more
    assert o.offset_ns - theta == pytest.approx((true_ab.min() - true_ba.min()) / 2)
    # corrected wire delays are never negative
    assert o.corrected_ab(d_ab).min() >= 0 and o.corrected_ba(d_ba).min() >= 0
    assert o.corrected_ab(d_ab).min() == pytest.approx(o.bound_ns)


def test_symmetric_fastest_trips_give_the_exact_offset():
    theta = 7_654_321.0
    d_ab = np.array([10_000.0, 12_000.0, 50_000.0]) + theta
    d_ba = np.array([10_000.0, 90_000.0]) - theta
    o = one_way_offset(d_ab, d_ba)
    assert o.offset_ns == pytest.approx(theta) and o.bound_ns == pytest.approx(10_000.0)
    assert (o.n_ab, o.n_ba) == (3, 2)


def test_ntp_exchanges_agree_and_are_never_tighter_than_the_one_way_minima():
    rng = np.random.default_rng(5)
    theta, n = -20e6, 500
    t1 = np.sort(rng.uniform(0, 1e9, n))
    up = 25_000 + rng.exponential(15_000, n)
    server = 5_000 + rng.exponential(3_000, n)
    down = 35_000 + rng.exponential(15_000, n)
    t2 = t1 + up + theta
    t3 = t2 + server
    t4 = t3 - theta + down
    ex = exchange_offset(t1, t2, t3, t4)
    ow = one_way_offset(t2 - t1, t4 - t3)
    assert ex.contains(theta) and ow.contains(theta)
    assert ow.bound_ns <= ex.bound_ns
    assert ex.bound_ns == pytest.approx(((t4 - t1) - (t3 - t2)).min() / 2)


def test_contradicting_directions_and_missing_data_are_refused():
    with pytest.raises(InconsistentClocks):
        one_way_offset([10_000.0], [-30_000.0])
    with pytest.raises(ValueError):
        one_way_offset([10_000.0], [])
    with pytest.raises(InconsistentClocks):
        exchange_offset([100.0], [50.0], [60.0], [90.0])    # t4 - t1 < t3 - t2


def test_drift_is_seen_as_a_slope_and_a_constant_offset_is_not():
    rng = np.random.default_rng(9)
    n, span = 4000, 10e9                  # 10 s
    ts_ab, ts_ba = np.sort(rng.uniform(0, span, n)), np.sort(rng.uniform(0, span, n))
    for ppm, theta0 in ((0.0, 3e6), (50.0, -2e6)):
        theta = lambda t: theta0 + ppm * 1e-6 * t    # noqa: E731
        d_ab = 30_000 + rng.exponential(10_000, n) + theta(ts_ab)
        d_ba = 30_000 + rng.exponential(10_000, n) - theta(ts_ba)
        d = drift(ts_ab, d_ab, ts_ba, d_ba, segments=20)
        assert d is not None
        assert d.ppm == pytest.approx(ppm, abs=2.0)
        for t_mid, o in d.segments:
            assert abs(o.offset_ns - theta(t_mid)) <= o.bound_ns + ppm * 1e-6 * span / 20
        # 50 ppm moves θ 500 µs over the run, far beyond one segment's ±30 µs: no single θ fits them all
        assert d.constant_fits == (ppm == 0.0)
    assert drift([1.0], [1.0], [], [], 4) is None


@pytest.mark.parametrize("ppm", [50.0, -50.0])
def test_fit_applies_drift_the_constant_offset_cannot_explain(ppm):
    """50 ppm over 10 s moves θ by 500 µs, against trips whose floors are 30 and 45 µs: no constant offset fits
    (the fastest trip each way, at opposite ends of the run, add up to less than zero: without the drift the
    runs were refused as a clock jump); the fitted line gives every trip back within its bound."""
    rng = np.random.default_rng(11)
    n, span, theta0 = 4000, 10e9, -7e6
    ts_ab, ts_ba = np.sort(rng.uniform(0, span, n)), np.sort(rng.uniform(0, span, n))
    theta = lambda t: theta0 + ppm * 1e-6 * t    # noqa: E731
    true_ab, true_ba = 30_000 + rng.exponential(10_000, n), 45_000 + rng.exponential(10_000, n)
    d_ab, d_ba = true_ab + theta(ts_ab), true_ba - theta(ts_ba)
    with pytest.raises(InconsistentClocks):
        one_way_offset(d_ab, d_ba)
    o = fit(ts_ab, d_ab, ts_ba, d_ba)
    assert isinstance(o, LinearOffset)
    assert o.ppm == pytest.approx(ppm, abs=1.0)
    assert all(o.contains(theta(t), t) for t in (0.0, span / 2, span))
    assert o.bound_ns < 60_000
    for got, true in ((o.corrected_ab(d_ab, ts_ab), true_ab), (o.corrected_ba(d_ba, ts_ba), true_ba)):
        assert got.min() >= 0 and np.abs(got - true).max() <= o.bound_ns


def test_fit_keeps_a_constant_offset_when_one_fits():
    rng = np.random.default_rng(12)
    n = 2000
    ts_ab, ts_ba = np.sort(rng.uniform(0, 10e9, n)), np.sort(rng.uniform(0, 10e9, n))
    d_ab = 30_000 + rng.exponential(10_000, n) + 5e6
    d_ba = 30_000 + rng.exponential(10_000, n) - 5e6
    o = fit(ts_ab, d_ab, ts_ba, d_ba)
    assert isinstance(o, Offset) and o.contains(5e6)
    assert o == one_way_offset(d_ab, d_ba)
    with pytest.raises(ValueError):
        fit([1.0], [1.0], [], [])


def test_fit_keeps_a_small_drift_inside_a_constant_offset_and_says_so():
    """5 ppm over 10 s (θ moves 50 µs, less than the 150 µs fastest round trip): a constant offset still fits
    every segment, so none is applied; `drift` still reports the slope."""
    rng = np.random.default_rng(13)
    n = 4000
    ts_ab, ts_ba = np.sort(rng.uniform(0, 10e9, n)), np.sort(rng.uniform(0, 10e9, n))
    d_ab = 75_000 + rng.exponential(10_000, n) + 5e-6 * ts_ab
    d_ba = 75_000 + rng.exponential(10_000, n) - 5e-6 * ts_ba
    assert isinstance(fit(ts_ab, d_ab, ts_ba, d_ba), Offset)
    assert drift(ts_ab, d_ab, ts_ba, d_ba, segments=8).ppm == pytest.approx(5.0, abs=1.0)
