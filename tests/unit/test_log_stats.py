"""Streaming pgbench's per-transaction log (#19.4): the same percentiles and windows split as the whole-log
computation, with memory that does not grow with the run, and a malformed file that repeats nothing."""
import gzip

import numpy as np
import pytest
from pathprof.agent.postgres import pgbench
from pathprof.analysis.windows import LogStats, split


def _write_log(path, rows):
    with gzip.open(path, "wt") as f:
        for client, lat, s, us in rows:
            f.write(f"{client} 1 {lat} 0 {s} {us}\n")


@pytest.fixture
def logs(tmp_path):
    rng = np.random.default_rng(7)
    n = 50_000
    lat = rng.gamma(2.0, 300.0, n).astype(int)
    lat[rng.choice(n, 300, replace=False)] = rng.integers(100_000, 3_000_000, 300)   # a lossy link's tail
    lat[:5] = -1                                                                     # failed transactions
    t0 = 1_764_000_000 * 1_000_000
    ends = t0 + np.sort(rng.integers(0, 20_000_000, n))
    rows = [(i % 8, int(lat[i]), int(ends[i] // 1_000_000), int(ends[i] % 1_000_000)) for i in range(n)]
    _write_log(tmp_path / "pgbench_log.1.gz", rows[: n // 2])
    _write_log(tmp_path / "pgbench_log.2.gz", rows[n // 2:])
    w = [{f"{k}_realtime_ns": (t0 + off) * 1000 for k, off in
          (("attach", 1_900_000), ("start", 2_000_000), ("end", 4_000_000), ("detached", 4_100_000))},
         {f"{k}_realtime_ns": (t0 + off) * 1000 for k, off in
          (("attach", 9_900_000), ("start", 10_000_000), ("end", 12_000_000), ("detached", 12_100_000))}]
    return tmp_path, ends, lat, w


def test_streamed_split_equals_the_whole_log_split(logs):
    d, ends, lat, w = logs
    clients = np.arange(len(ends)) % 8
    assert pgbench.log_stats(d, w).split() == split(ends, lat.astype(float), w, clients)


def test_a_client_that_finished_early_is_not_counted_waiting_for_the_others():
    # two clients, one window over the whole run (always on): client 0 runs to 10 s, client 1 stops at 4 s (it was
    # done; the run went on while client 0 sat in a SYN retransmission wait). The clients' time is ~9 + ~3 s,
    # not 2 x ~9 s: a latency view divided by the transactions closes against ~12 s of client time
    t0 = 1_764_000_000 * 1_000_000
    ends = t0 + np.array([1, 2, 3, 4, 10, 1, 2, 3, 4]) * 1_000_000
    lat = np.full(len(ends), 1000.0)
    clients = np.array([0, 0, 0, 0, 0, 1, 1, 1, 1])
    w = [{f"{k}_realtime_ns": (t0 + off) * 1000 for k, off in
          (("attach", -500_000), ("start", -400_000), ("end", 11_000_000), ("detached", 11_100_000))}]
    whole = split(ends, lat, w, clients)["in_windows"]
    assert whole["client_s"] == pytest.approx((10.0 - 0.999) + (4.0 - 0.999))   # from the first start (0.999 s)
    assert whole["duration_s"] == pytest.approx(10.0 - 0.999)          # the run's, as before
    s = LogStats(w)
    s.add(ends[:5], lat[:5], clients[:5])
    s.add(ends[5:], lat[5:], clients[5:])
    assert s.split()["in_windows"] == whole
    assert "client_s" not in split(ends, lat, w)["in_windows"]          # a log without client ids: as before


def test_a_transaction_in_flight_at_a_window_opening_is_not_the_clients_time_in_it():
    # two windows, [0.5, 4) and [5, 9) s; client 0's first transaction began at 0.3 s and ended at 0.7 s (a
    # retransmission wait the probes dropped at the opening: no start inside the window), client 1's first began
    # after the opening; in the second window client 1's first began at 4.9 s and ended at 5.1 s. Only those two
    # stretches (0.2 + 0.1 s) leave the clients' time; streamed in chunks that split a client's windows, the same
    t0 = 1_764_000_000 * 1_000_000
    rows = [(0, 0.7, 0.4), (1, 0.8, 0.1), (0, 1.0, 0.001), (1, 2.0, 0.001), (0, 3.5, 0.001), (1, 3.9, 0.001),
            (1, 5.1, 0.2), (0, 5.5, 0.001), (1, 6.0, 0.001), (0, 8.0, 0.001), (1, 8.5, 0.001)]
    clients = np.array([c for c, _, _ in rows])
    ends = t0 + np.array([e for _, e, _ in rows]) * 1e6
    lat = np.array([d for _, _, d in rows]) * 1e6

    def window(a, b):
        return {f"{k}_realtime_ns": (t0 + off * 1e6) * 1000 for k, off in
                (("attach", a - 0.1), ("start", a), ("end", b), ("detached", b + 0.1))}
    w = [window(0.5, 4.0), window(5.0, 9.0)]
    whole = split(ends, lat, w, clients)["in_windows"]
    assert whole["opening_s"] == pytest.approx(0.3)
    uncut = (3.5 + 3.0) + (3.5 + 3.5)            # each client from the first opening to its last end, both windows
    assert whole["client_s"] == pytest.approx(uncut - 0.3)
    for cut in (1, 5, 7, 9):
        s = LogStats(w)
        s.add(ends[:cut], lat[:cut], clients[:cut])
        s.add(ends[cut:], lat[cut:], clients[cut:])
        assert s.split()["in_windows"] == whole, cut


def test_with_a_connection_per_transaction_a_closed_client_waits_until_its_thread_ends(tmp_path):
    # -C, clients 0 and 1 on thread 0, client 2 alone on thread 1 (pgbench writes a file per thread): client 1's
    # last transaction ended at 2 s while client 0 held their thread to 9 s (a lost SYN's retransmissions); the
    # probe counts client 1 closed and waiting for its thread until then (connect.thread_wait), so its time runs
    # to 9 s. Client 2 ended at 3 s with nothing after it on its thread: to 3 s. Without -C, each to its own end
    t0 = 1_764_000_000 * 1_000_000
    files = {"pgbench_log.7.gz": [(0, 1.0), (1, 1.5), (1, 2.0), (0, 9.0)], "pgbench_log.7.1.gz": [(2, 1.0), (2, 3.0)]}
    for name, rows in files.items():
        _write_log(tmp_path / name, [(c, 1000, int(t0 // 1_000_000 + e), int(t0 % 1_000_000)) for c, e in rows])
    w = [{f"{k}_realtime_ns": (t0 + off * 1e6) * 1000 for k, off in
          (("attach", 0.0), ("start", 0.1), ("end", 10.0), ("detached", 10.1))}]
    lo = 1.0 - 0.001
    assert pgbench.log_stats(tmp_path, w, connect=True).split()["in_windows"]["client_s"] == pytest.approx(
        (9.0 - lo) * 2 + (3.0 - lo))
    assert pgbench.log_stats(tmp_path, w).split()["in_windows"]["client_s"] == pytest.approx(
        (9.0 - lo) + (2.0 - lo) + (3.0 - lo))
    rows = [(c, e, t) for t, name in enumerate(sorted(files)) for c, e in files[name]]
    ends = t0 + np.array([e for _, e, _ in rows]) * 1e6
    whole = split(ends, np.full(len(rows), 1000.0), w, np.array([c for c, _, _ in rows]),
                  threads=np.array([t for _, _, t in rows]))["in_windows"]
    assert whole["client_s"] == pytest.approx((9.0 - lo) * 2 + (3.0 - lo))


def test_streamed_percentiles_equal_the_whole_log_ones(logs):
    d, _, _, w = logs
    whole = pgbench.latency_percentiles(pgbench.read_logs(d))
    got = pgbench.log_stats(d, w).percentiles()
    assert got["mean"] == pytest.approx(whole["mean"], rel=1e-12)
    for k in ("p50", "p95"):
        assert got[k] == pytest.approx(whole[k], abs=1e-9)          # exact to the µs below 100 ms
    assert got["p99"] == pytest.approx(whole["p99"], abs=1.0)         # the tail: to the ms


def test_memory_does_not_follow_the_log_length():
    s = LogStats([])
    before = s.exact.nbytes + s.coarse.nbytes
    for _ in range(20):
        s.add(np.arange(100_000, dtype=float), np.full(100_000, 500.0))
    assert s.n == 2_000_000 and s.exact.nbytes + s.coarse.nbytes == before


def test_a_file_that_cannot_be_parsed_repeats_nothing(tmp_path):
    _write_log(tmp_path / "pgbench_log.1.gz", [(0, 100, 1_764_000_000, 5), (1, 200, 1_764_000_000, 9)])
    (tmp_path / "pgbench_log.2").write_text("this is not a pgbench log\n")
    total = sum(len(c) for c in pgbench.iter_log_chunks(tmp_path))
    assert total == 2
