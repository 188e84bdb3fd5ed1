"""Clock offsets from traffic (pathprof.analysis.clock_offset), on constructed cases whose answer is known:
delays drawn from a floor plus queueing, one host's clock shifted by a known offset (and drift)."""
import numpy as np
import pytest
from pathprof.analysis.clock_offset import InconsistentClocks, drift, exchange_offset, one_way_offset


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
