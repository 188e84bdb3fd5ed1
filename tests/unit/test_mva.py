"""The MVA solver on textbook cases whose answers are known in closed form, and its monotonicity."""
import pytest
from pathprof.analysis.mva import Centre, curve, solve


def test_mm1_as_the_limit_of_a_large_population():
    # N clients each thinking Z = N/lambda: as N grows the arrivals become Poisson at rate lambda and the queue an
    # M/M/1 with R = D / (1 - rho)
    d, lam = 1.0, 0.5
    n = 4000
    s = solve([Centre("q", d)], n, think_us=n / lam)
    assert s.residence_us["q"] == pytest.approx(d / (1 - lam * d), rel=0.01)
    assert s.utilisation["q"] == pytest.approx(lam * d, rel=0.01)


@pytest.mark.parametrize("n, tps, resid", [(1, 0.5, 1.0), (2, 0.8, 1.5), (3, 0.9375, 2.2)])
def test_one_queue_and_a_delay_by_hand(n, tps, resid):
    # D = 1, Z = 1. n=1: R=1, X=1/2, Q=1/2; n=2: R=1.5, X=2/2.5, Q=1.2; n=3: R=2.2, X=3/3.2
    s = solve([Centre("q", 1.0)], n, think_us=1.0)
    assert s.tps / 1e6 == pytest.approx(tps)
    assert s.residence_us["q"] == pytest.approx(resid)


@pytest.mark.parametrize("n, x, r1, r2", [(1, 1 / 3, 1.0, 2.0), (2, 3 / 7, 4 / 3, 10 / 3), (3, 7 / 15, 11 / 7, 34 / 7)])
def test_two_queues_by_hand(n, x, r1, r2):
    s = solve([Centre("a", 1.0), Centre("b", 2.0)], n)
    assert s.tps / 1e6 == pytest.approx(x)
    assert s.residence_us["a"] == pytest.approx(r1)
    assert s.residence_us["b"] == pytest.approx(r2)
    assert s.bottleneck == "b"


def test_multi_server_asymptotes():
    two_cpus = Centre("cpu", 10.0, servers=2)
    one = solve([two_cpus], 1, think_us=5.0)
    assert one.cycle_us == pytest.approx(15.0)          # one client never waits: R = D
    many = solve([two_cpus], 400, think_us=5.0)
    assert many.tps / 1e6 == pytest.approx(2 / 10.0, rel=0.01)   # X -> servers / D
    assert many.utilisation["cpu"] == pytest.approx(1.0, rel=0.01)


def test_overlapping_centre_counts_its_service_once_and_still_limits():
    cpu, hop = Centre("cpu", 10.0, servers=2), Centre("hop", 8.0, overlaps=True)
    assert solve([cpu, hop], 1, think_us=5.0).cycle_us == pytest.approx(15.0)
    # the hop's one thread (1/8 per µs) binds before the two CPUs (2/10 per µs)
    sat = solve([cpu, hop], 500, think_us=5.0)
    assert sat.tps / 1e6 == pytest.approx(1 / 8.0, rel=0.02)
    assert sat.bottleneck == "hop"


def test_idle_scaled_delay_fades_as_the_cpus_fill():
    cs = [Centre("cpu", 10.0, servers=2), Centre("idle_exit", 20.0, servers=0, idle_scaled=True)]
    one = solve(cs, 1, cpu_centre="cpu")
    assert one.cycle_us == pytest.approx(30.0)
    sat = solve(cs, 200, cpu_centre="cpu")
    assert sat.residence_us["idle_exit"] < 1.0


def test_work_beside_the_path_takes_capacity_but_not_the_one_client_cycle():
    cs = [Centre("cpu", 20.0, servers=2, serial_us=12.0)]
    assert solve(cs, 1, cpu_centre="cpu").cycle_us == pytest.approx(12.0)    # the rest ran on the free CPU
    assert solve(cs, 64, cpu_centre="cpu").tps == pytest.approx(2 / 20.0 * 1e6, rel=0.01)   # still 2 / D


def test_a_woken_client_finds_no_idle_cpu_once_the_others_fill_them():
    # 2 CPUs, 20 µs each per transaction, 40 µs of idle exits on an idle machine: with three clients besides it
    # a woken one queues behind them rather than waking an idle CPU (the 1 - utilisation of the CPUs, 75 % here,
    # left 10 µs: a 4-client loopback run measured 0.4 µs of idle exits per transaction)
    cs = [Centre("cpu", 20.0, servers=2), Centre("idle", 40.0, servers=0, idle_scaled=True)]
    assert solve(cs, 1, cpu_centre="cpu").residence_us["idle"] == pytest.approx(40.0)
    assert solve(cs, 4, cpu_centre="cpu").residence_us["idle"] < 2.0


def test_more_clients_never_lower_throughput():
    cs = [Centre("cpu", 30.0, servers=2), Centre("hop", 12.0, overlaps=True), Centre("pgbench", 8.0, servers=2),
          Centre("wire", 50.0, servers=0), Centre("idle", 25.0, servers=0, idle_scaled=True)]
    tps = [s.tps for s in curve(cs, list(range(1, 129)), think_us=4.0, cpu_centre="cpu")]
    assert all(b >= a - 1e-9 for a, b in zip(tps, tps[1:]))


@pytest.mark.parametrize("n", [1, 4, 16, 64])
def test_a_longer_wire_never_raises_throughput(n):
    base = [Centre("cpu", 30.0, servers=2), Centre("hop", 12.0, overlaps=True)]
    tps = [solve(base + [Centre("wire", w, servers=0)], n, cpu_centre="cpu").tps for w in (0, 50, 250, 1000, 5000)]
    assert all(b <= a + 1e-9 for a, b in zip(tps, tps[1:]))


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        solve([Centre("q", 1.0)], 0)
    with pytest.raises(ValueError):
        solve([Centre("q", -1.0)], 1)
