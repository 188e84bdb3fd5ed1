"""analysis.predict on recorded runs (tests/unit/data/runs): scenarios, refusals, the band, and compare/sweep rows."""
from pathlib import Path

import pytest
from pathprof.analysis import predict as P
from pathprof.analysis.rundir import RunDir
from pathprof.analysis.summary import summarize
from pathprof.errors import UserError

RUNS = Path(__file__).parent / "data" / "runs"


def base(name):
    return P.base_of(RunDir.open(RUNS / name))


@pytest.mark.parametrize("name", ["loopback", "unix", "docker-dnat"])
def test_the_model_reproduces_the_run_it_was_anchored_on(name):
    b = base(name)
    row = P.predict(b, [b.clients])[0]
    assert row["tps"] == pytest.approx(b.measured_tps, rel=0.002)
    assert row["tps_low"] <= row["tps"] <= row["tps_high"]
    assert row["assumptions"] and any(a.startswith("queue: the CPUs") for a in row["assumptions"])


@pytest.mark.parametrize("name", ["pgbouncer-traces", "cross-zone"])
def test_foreign_load_is_anchored_on_then_left_out(name):
    # these runs shared the machine with other processes: anchored on the CPUs they had (which others also kept
    # from idling), predicted for the path with the host to itself, and the assumptions say so
    b = base(name)
    assert b.ncpu == 2 and b.background_util == 0.0
    row = P.predict(b, [b.clients])[0]
    assert any(a.startswith("foreign load:") for a in row["assumptions"])
    assert row["tps"] <= b.measured_tps * 1.002    # idle CPUs wake slower: never faster than with the load


@pytest.mark.parametrize("name", ["loopback", "docker-dnat", "pgbouncer-traces"])
def test_more_clients_never_lower_predicted_tps(name):
    rows = P.predict(base(name), [1, 2, 4, 8, 16, 32, 64, 96])
    tps = [r["tps"] for r in rows]
    # within 0.5 %: where the idle CPUs fill, a woken client's chance of an idle CPU is taken from the population
    # before it (the arrival theorem), a step that can overshoot by a few tenths of a per cent (pgbouncer: 4 -> 8)
    assert all(b >= a * 0.995 for a, b in zip(tps, tps[1:])), tps
    assert rows[-1]["limited_by"] != "latency"       # 96 clients on 2 CPUs: some resource saturates


def test_a_longer_wire_never_raises_tps_and_one_client_pays_it_in_full():
    b = base("cross-zone")
    rows = {us: P.predict(b, [1, 16], P.Scenario(link_us={"wire": us})) for us in (0.0, 500.0, 2000.0)}
    for n in (0, 1):
        assert rows[0.0][n]["tps"] >= rows[500.0][n]["tps"] >= rows[2000.0][n]["tps"]
    # one client, latency-bound: the cycle grows by the added delay (TPS ~ 1/cycle)
    assert rows[2000.0][0]["latency_ms"] - rows[0.0][0]["latency_ms"] == pytest.approx(2.0, abs=0.01)


def test_link_names_come_from_the_topology():
    b = base("cross-zone")
    assert P.parse_link("wire:rtt_us=1000", b) == ("wire", pytest.approx(1000.0 * b.round_trips))
    assert P.parse_link("wire:delay_us=250", b)[1] == pytest.approx(500.0 * b.round_trips)
    assert P.parse_link("pp-cz-c:delay_us=250", b)[1] == pytest.approx(250.0 * b.round_trips)
    with pytest.raises(UserError, match="no link or interface 'nope'"):
        P.parse_link("nope:rtt_us=10", b)
    with pytest.raises(UserError, match="not NAME:delay_us=N"):
        P.parse_link("wire:loss_pct=1", b)


def test_without_a_hop_removes_its_cpu_and_raises_tps():
    b = base("docker-dnat")
    sc = P.Scenario(without=("docker-proxy",))
    m = P.apply(b, sc)
    assert not any(k.startswith("hop.docker-proxy") for k in m.cpu)
    assert m.cpu["softirq.net"] < b.cpu["softirq.net"]        # its second connection's kernel work goes too
    with_hop, without = P.predict(b, [16])[0], P.predict(b, [16], sc)[0]
    assert without["tps"] > with_hop["tps"]
    with pytest.raises(UserError, match="no probed hop 'pgbouncer'"):
        P.apply(b, P.Scenario(without=("pgbouncer",)))


def test_a_single_threaded_hop_limits_when_its_thread_saturates():
    b = base("pgbouncer-traces")
    hop = P.centres(b, 16)
    assert any(c.name == "hop.pgbouncer" and c.servers == 1 for c in hop)
    # make the pooler's CPU the largest demand: at many clients it must be what limits
    b.cpu["hop.pgbouncer.sys"] = sum(b.cpu.values())
    assert P.predict(b, [96])[0]["limited_by"] == "hop.pgbouncer"


def test_settings_the_model_cannot_represent_are_refused():
    rd = RunDir.open(RUNS / "loopback")
    s = summarize(rd)
    b = P.base_of(rd, s)
    with pytest.raises(UserError, match="cannot predict this setting"):
        P.parse_pg_set(["work_mem=1GB"], b, s)
    with pytest.raises(UserError, match="--probes deep"):          # basic run: no backend.wal_flush to remove
        P.parse_pg_set(["synchronous_commit=off"], b, s)


def test_a_run_without_cpu_view_is_refused():
    s = summarize(RunDir.open(RUNS / "loopback"))
    s["cpu"] = []
    with pytest.raises(UserError, match="no CPU view"):
        P.base_from_run(s)


def test_the_band_comes_from_the_runs_own_spread():
    s = summarize(RunDir.open(RUNS / "pgbouncer-traces"))
    quiet = P.base_from_run(s, [1000.0] * 6)
    noisy = P.base_from_run(s, [1000.0, 1000.0, 800.0, 1200.0, 900.0, 1100.0])
    assert noisy.band_pct > quiet.band_pct
    assert quiet.band_parts["tps_spread_pct"] == 0.0


def test_compare_rows_predict_a_hop_removed_and_skip_other_paths():
    dnat = summarize(RunDir.open(RUNS / "docker-dnat"))
    no_proxy = {**dnat, "cpu": [c for c in dnat["cpu"] if not c["component"].startswith("hop.")],
                "windows": {"tps_out": 40000.0}, "tps": 40000.0}
    row = P.predict_for(dnat, no_proxy)
    assert row["scenario"] == "without docker-proxy" and row["measured_tps"] == 40000.0
    assert row["error_pct"] == pytest.approx((row["tps"] - 40000.0) / 400.0, abs=0.1)
    assert P.predict_for(dnat, summarize(RunDir.open(RUNS / "unix"))) is None


def _sweep_with_prediction():
    from fixtures_summaries import sweep_runs
    from pathprof.analysis.sweep import sweep_analysis
    sw = sweep_analysis(sweep_runs())
    for p in sw["points"][1:]:
        p["predicted_from_first"] = {"clients": p["clients"], "tps": p["tps"] * 1.1, "tps_low": p["tps"] * 0.95,
                                     "tps_high": p["tps"] * 1.25, "measured_tps": p["tps"], "error_pct": 10.0,
                                     "within_band": True, "limited_by_text": "the CPUs (2.00, 100 % busy)"}
    return sw


def test_sweep_view_prints_prediction_next_to_measurement():
    from pathprof.analysis.report.render import render_to_string, sweep_view
    sw = _sweep_with_prediction()
    text = render_to_string(sweep_view(sw))
    assert "Predicted from the first run" in text and "+10.0 %" in text
    last = sw["points"][-1]
    assert f"{last['tps'] * 1.1:,.0f}" in text


def test_sweep_chart_draws_predicted_curve_and_band():
    from pathprof.analysis.report.charts import sweep_figure
    sw = _sweep_with_prediction()
    ax = sweep_figure(sw).axes[0]
    labels = [ln.get_label() for ln in ax.get_lines()]
    assert "predicted from the first run" in labels and "measured without probes" in labels
    pred = next(ln for ln in ax.get_lines() if ln.get_label() == "predicted from the first run")
    assert list(pred.get_ydata()) == [p["predicted_from_first"]["tps"] for p in sw["points"][1:]]
    assert ax.collections            # the band
    plain = sweep_figure({**sw, "points": [{k: v for k, v in p.items() if k != "predicted_from_first"}
                                           for p in sw["points"]]}).axes[0]
    assert "predicted from the first run" not in [ln.get_label() for ln in plain.get_lines()]


def test_compare_prints_a_prediction_for_each_run_after_the_first():
    from pathprof.agent.cli.multi import predictions_from_first
    from pathprof.analysis.report.render import predictions_view, render_to_string
    dnat = summarize(RunDir.open(RUNS / "docker-dnat"))
    no_proxy = {**dnat, "label": "docker-dnat:userland-proxy=off", "windows": {"tps_out": 40000.0}, "tps": 40000.0,
                "cpu": [c for c in dnat["cpu"] if not c["component"].startswith("hop.")]}
    unix = summarize(RunDir.open(RUNS / "unix"))
    rows = predictions_from_first([dnat, no_proxy, unix])
    assert [r["run"] for r in rows] == ["docker-dnat:userland-proxy=off", "unix"]
    assert rows[0]["scenario"] == "without docker-proxy" and rows[0]["tps"] > 0
    assert rows[1]["tps"] is None and "not a scenario" in rows[1]["reason"]
    text = render_to_string(predictions_view(rows))
    assert f"{rows[0]['tps']:,.0f}" in text and "40,000" in text and "not a scenario" in text


def test_a_row_lock_serialises_and_synchronous_commit_off_shortens_its_hold():
    # a real deep tpcb-like run at scale 1, 8 clients: every transaction waits for the one branch row
    rd = RunDir.open(RUNS / "tpcb-deep-lock")
    s = summarize(rd)
    b = P.base_of(rd, s)
    assert b.lock_us == pytest.approx(1e6 / b.measured_tps) and 0 < b.lock_holds_wal < b.lock_us
    as_run = P.predict(b, [8, 16])
    assert all(r["limited_by"] == "backend.lock" for r in as_run)        # more clients only queue for the lock
    assert as_run[0]["tps"] == pytest.approx(as_run[1]["tps"], rel=0.01)
    off = P.predict(b, [8], P.Scenario(pg_set=P.parse_pg_set(["synchronous_commit=off"], b, s)))[0]
    assert off["tps"] > 2 * as_run[0]["tps"]                              # the flush no longer holds the lock
    assert not any(a.startswith("queue: the backend's WAL flush") for a in off["assumptions"])


def test_an_unthrottled_wal_device_shortens_the_flush_to_the_devices_own_time():
    # the deep tpcb-like run at scale 1, as if its WAL had been on a throttled device whose own time was 50 µs
    rd = RunDir.open(RUNS / "tpcb-deep-lock")
    s = summarize(rd)
    b = P.base_of(rd, s)
    with pytest.raises(UserError, match="throttled device"):             # its WAL had no device of its own
        P.parse_wal_limit("none", b)
    b.wal_device = {"device": "loop3", "limit": {"wiops": 200}, "device_us": 50.0}
    with pytest.raises(UserError, match="only 'none'"):
        P.parse_wal_limit("wiops=400", b)
    sc = P.Scenario(wal_unthrottled=P.parse_wal_limit("none", b))
    m = P.apply(b, sc)
    assert m.wal_us == pytest.approx(50.0)
    # the lock is held for less: what the flush took beyond the device's own time is gone from its hold
    assert m.lock_us == pytest.approx(b.lock_us - min(b.wal_us - 50.0, b.lock_holds_wal))
    as_run, fast = P.predict(b, [8])[0], P.predict(b, [8], sc)[0]
    off = P.predict(b, [8], P.Scenario(pg_set={"synchronous_commit": "off"}))[0]
    assert as_run["tps"] < fast["tps"] <= off["tps"]                     # a fast flush is still a flush
    assert any("WAL device unthrottled" in a for a in fast["assumptions"])


def test_the_wal_device_is_found_in_the_disk_view_by_its_name():
    from pathprof.analysis.predict_inputs import wal_device
    meta = {"postgres": {"wal_device": {"device": "/dev/loop7", "limit": {"wiops": 200}}}}
    # two writes per transaction issued together (80 µs each), then one cache flush (130 µs): 210 µs, not 290
    disk = [{"device": "loop7", "op": "write", "requests_per_txn": 2.0, "us_per_txn": 160.0, "mean_us": 80.0},
            {"device": "loop7", "op": "flush", "requests_per_txn": 1.0, "us_per_txn": 130.0, "mean_us": 130.0},
            {"device": "vda", "op": "write", "requests_per_txn": 3.0, "us_per_txn": 99.0, "mean_us": 33.0}]
    assert wal_device(meta, {"disk": disk})["device_us"] == pytest.approx(210.0)
    no_flush = [d for d in disk if d["op"] != "flush"]           # fsync'ed without cache flushes: every request
    assert wal_device(meta, {"disk": no_flush})["device_us"] == pytest.approx(160.0)
    assert wal_device(meta, {"disk": []})["device_us"] is None
    assert wal_device({"postgres": {"wal_device": None}}, {"disk": disk}) is None
