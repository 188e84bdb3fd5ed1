"""The run/report document of DESIGN.md, built from a run directory alone: run.json is read through the typed
run model (RunDir.run), the document is written as the dict `--json` prints (analysis.run_model.Summary reads it)."""
from __future__ import annotations

from pathprof.analysis.client import client_of
from pathprof.analysis.run_model import LoadResult, Probes, RunMeta, WindowFigures, load
from pathprof.analysis.rundir import RunDir


def summarize(rd: RunDir) -> dict:
    """The run document (docs/REPORTS.md): the run's headline figures, then the latency and CPU views over the
    transactions the probes measured, then the checks made on them."""
    run = rd.run
    out = _headline(run, rd)
    _notes_from_meta(out, run)
    probes = run.probes
    basis = _basis(run, out)
    stages, cpu = rd.read_frame("stages.parquet"), rd.read_frame("cpu.parquet")
    w = run.workload
    if basis["txns"] and (stages is not None or cpu is not None):
        clients = w.clients or 1
        # The stages tile each connection's timeline, so they must add up to the cycle (clients / TPS);
        # pgbench's own mean latency leaves out its work between transactions (shown as the client leg). A client
        # that finished before the others (the run's end) waits for no transaction: its time ends at its last one
        cycle_us = (basis["client_s"] * 1e6 / basis["txns"] if basis.get("client_s")
                    else clients * 1e6 / basis["tps"] if basis["tps"] else None)
        if stages is not None and basis["mean_ms"]:
            _add_latency_view(out, rd, stages, basis, cycle_us)
        if probes.cost and probes.cost.run_time_ns is not None:
            out["probe_cost_ns_per_txn"] = probes.cost.run_time_ns / basis["txns"]
        elif probes.cost and (probes.cost.doc.get("calibration") or {}).get("rejected"):
            out["notes"].append("the probes' own cost was not measured: every calibration slice was dropped ("
                                + "; ".join((probes.cost.doc["calibration"])["rejected"]) + "), so the processes' CPU "
                                "includes the probes' runs on their behalf")
        if cpu is not None and basis["busy"]:
            _add_cpu_view(out, cpu, basis, clients, probes, client_of(run))
    busy, elapsed, ncpu = basis["busy"], basis["elapsed"], basis["ncpu"]
    if out["regime"] is None and busy and elapsed:
        # Without probes the regime still follows from busy time: near all CPUs busy means CPU-bound.
        out["regime"] = "cpu-bound" if busy / elapsed >= 0.9 * ncpu else "latency-bound"
    if w.connect and "connection_setup" not in out and rd.file("connect.parquet").exists():
        from pathprof.analysis.conn_view import add_connection_setup
        add_connection_setup(out, rd)     # no latency view to fold it into (probes off, no transactions)
    out.update(probe_cost_share(out))
    _add_steal(out, basis)
    from pathprof.analysis.losses import add_to_summary as add_losses
    add_losses(out, probes, stages, cpu)          # after the views: each loss checked against their closure
    _add_checks(out, run)
    from pathprof.analysis.served import add_served_by
    add_served_by(out, rd)
    return out


def _headline(run: RunMeta, rd: RunDir) -> dict:
    """What the run was and what pgbench (or, attached, the probes) measured; the views' keys empty."""
    # a driven run has pgbench's result; an attached one what the probes observed (pathprof.agent.run.attach)
    res = run.load_result or LoadResult()
    w, probes, lat = run.workload, run.probes, res.latency_ms
    return {
        "topology": run.topology.name,
        "clients": w.clients,
        "threads": w.threads,
        "duration_s": w.duration_s,
        "workload": {"mode": w.mode, "script": w.script, "connect": w.connect, "scale": w.scale, "rate": w.rate,
                     "client": client_of(run)},
        "tps": res.tps,
        "transactions": res.transactions,
        "failed": res.failed,
        "latency_ms": {"mean": lat.mean, "p50": lat.p50, "p95": lat.p95, "p99": lat.p99},
        "connection_time_ms": res.connection_time_ms,
        "scripts": res.scripts or [],
        "regime": None,
        "predicted_tps": None,
        "stages": [],
        "cpu": [],
        "closure": {"latency_error_pct": None, "cpu_error_pct": None},
        "probe_cost_ns_per_txn": None,
        "probe_overhead_pct": probes.probe_overhead_pct,
        "probes": probes.level,
        "lost_events": probes.lost or {},
        "probe_hooks": (probes.doc or {}).get("hooks"),   # the way each event was measured (agent.probing.hooks)
        "host": run.host.doc,
        "topology_options": run.topology.options or {},
        "postgres_version": run.postgres.version,
        "pathprof_version": run.pathprof_version,
        "status": run.status,
        "setup_s": run.setup_s,
        "notes": list(probes.notes or []),
        "run_dir": str(rd.path),
        # who drove the load: pgbench (run), or clients pathprof only watched (attach: exchanges the probes counted)
        "driver": run.driver,
    }


def _notes_from_meta(out: dict, run: RunMeta) -> None:
    """A merged run's hosts and clocks, a broken path, checkpoints inside the run, the guest's accelerator: said
    where the figures are read."""
    if run.clock_offsets is not None:     # a merged run (pathprof.analysis.merge): its hosts and clocks
        out["hosts"] = [{k: h.get(k) for k in ("name", "run_dir", "transactions", "tps", "clock_offset_us",
                                                      "outside_common_pct")}
                        for h in run.hosts or []]
        out["clock_offsets"] = [{k: v for k, v in o.items()} for o in run.clock_offsets]
    if run.failure:
        out["failure"] = list(run.failure)
        out["notes"].insert(0, "THE PATH BROKE DURING THIS RUN: " + "; ".join(run.failure) + " — its figures "
                            "cover a broken system")
    cps = run.postgres.checkpoints
    if cps.during_run:
        out["checkpoints"] = cps.doc
        out["notes"].append(f"{cps.during_run} checkpoint(s) ran during the measured interval ({cps.timed} "
                            f"timed, {cps.requested} requested by WAL volume): their writes and fsyncs are in "
                            "these figures")
    for svc in run.services:
        if svc.accelerator:
            out["accelerator"] = svc.accelerator
            out["vhost"] = svc.vhost


def _basis(run: RunMeta, out: dict) -> dict:
    """What the views are divided by and closed against: the whole run's transactions, rate, latency and busy
    CPU time, or, with probe windows, those of the windows alone. Also sets the headline TPS figures."""
    res, cpu_time = run.load_result or LoadResult(), run.cpu
    b = {"txns": res.transactions or 0, "tps": res.tps or 0, "mean_ms": res.latency_ms.mean,
         "busy": cpu_time.busy_ns, "elapsed": cpu_time.elapsed_ns,
         "ncpu": cpu_time.ncpu or run.host.cpus or 1,
         "busy_source": cpu_time.busy_source or "tick", "busy_tick": cpu_time.busy_tick_ns or cpu_time.busy_ns,
         "steal": cpu_time.steal_ns}
    if b["busy"] and b["elapsed"]:
        out["busy_cpus"] = b["busy"] / b["elapsed"]
    win = _windows(run.probes, out)
    out.update(headline_tps(res.tps, run.probes))
    if win:
        # The probe tables cover only the measurement windows (analysis.windows): divide by the
        # transactions that ended inside them, close against their rate and latency and the CPUs' busy
        # time while they were open.
        b.update(txns=win.txns, tps=win.tps or 0, mean_ms=win.latency_ms_mean or b["mean_ms"],
                 busy=win.busy_ns or b["busy"], elapsed=win.elapsed_ns or b["elapsed"], client_s=win.client_s)
        if win.busy_ns:
            b.update(busy_source=win.busy_source or "tick", busy_tick=win.busy_tick_ns or win.busy_ns,
                     steal=win.steal_ns)
    if res.client_s:     # attach: the connections' own time, idle ones left out (agent.run.observed.clients_time)
        b["client_s"] = res.client_s
    return b


def _add_latency_view(out: dict, rd: RunDir, stages, basis: dict, cycle_us: float | None) -> None:
    """The stages per transaction and their closure against the cycle; retransmissions, disk, -C setup."""
    from pathprof.analysis import stages as views
    run, txns, mean_ms = rd.run, basis["txns"], basis["mean_ms"]
    lv = views.latency_view(stages, txns, mean_ms * 1000.0, cycle_us=cycle_us, client=client_of(run))
    out["stages"] = lv["stages"]
    out["closure"]["latency_error_pct"] = lv.get("closure_error_pct")
    out["closure"]["latency_basis"] = lv.get("closure_basis")
    out["closure"]["cycle_us"] = cycle_us
    out["closure"]["stages_sum_us"] = lv.get("total_us")
    out["closure"]["txns"] = txns
    out["scheduler"] = lv.get("scheduler")
    if lv.get("tcp_retransmits"):
        out["tcp_retransmits"] = tcp_retransmits(lv["tcp_retransmits"], out["stages"], txns)
        kernel = run.tcp_counters or {}
        if kernel:       # the kernel's own count in the path's namespaces, over the same run
            out["tcp_retransmits"]["kernel_retrans_segs"] = sum(v.get("RetransSegs", 0) for v in kernel.values())
    out["disk"] = views.disk_view(stages, txns)
    if lv.get("execute_split"):
        out["closure"]["execute_split"] = lv["execute_split"]   # deep: backend.execute's parts vs it
    if run.workload.connect and rd.file("connect.parquet").exists():
        _add_connection_setup(out, rd, lv.get("setup_retx"), txns)
    # pgbench's latency leaves out its own work between transactions and, with -C, the connection's set-up
    client_us = sum(x["us_per_txn"] for x in out["stages"]
                    if x.get("leg") in ("client", "connect") and not x.get("parent"))
    setup = " and its connections' set-up" if run.workload.connect else ""
    if cycle_us and mean_ms * 1000.0 < 0.5 * (cycle_us - client_us):
        out["notes"].append(
            f"pgbench's logged latency (mean {mean_ms * 1000:.1f} µs) is far below what its own throughput "
            f"allows (cycle {cycle_us:.1f} µs, of which {client_us:.1f} µs is pgbench's own work{setup}): pgbench "
            "takes timestamps lazily, so very short transactions are logged too short. Trust the cycle and "
            "the latency view's request/server/response legs.")


def _add_cpu_view(out: dict, cpu, basis: dict, clients: int, probes: Probes, client: str) -> None:
    """CPU per transaction per component, its closure against busy time, the regime and the model's TPS."""
    from pathprof.analysis import stages as views
    txns, busy, mean_ms = basis["txns"], basis["busy"], basis["mean_ms"]
    cv = views.cpu_view(cpu, txns, busy, basis["elapsed"], basis["ncpu"], clients=clients,
                        # the stages' cycle (they tile it), else pgbench's mean latency
                        latency_us=(out["closure"].get("stages_sum_us")
                                    or (mean_ms * 1000.0 if mean_ms else None)),
                        probe_us=(out["probe_cost_ns_per_txn"] or 0.0) / 1e3, client=client)
    out["cpu"] = cv["components"]
    # What the components close against (busy CPU over the same transactions): explanations use it.
    out["cpu_us_per_txn"] = busy / 1e3 / txns
    out["closure"]["cpu_error_pct"] = cv.get("closure_error_pct")
    out["closure"]["cpu_reference"] = basis.get("busy_source", "tick")
    if basis.get("busy_source") == "nohz" and basis.get("busy_tick"):
        out["closure"]["cpu_error_tick_pct"] = views.tick_closure_pct(cv, txns, basis["busy_tick"])
    out["regime"] = cv.get("regime")
    out["predicted_tps"] = cv.get("predicted_tps")
    out["predicted_probed_tps"] = cv.get("predicted_probed_tps")
    out["prediction"] = _prediction(out["predicted_tps"], probes)


def _add_steal(out: dict, basis: dict) -> None:
    """The hypervisor's steal time over the same interval as the views (analysis.steal), and its note."""
    from pathprof.analysis.steal import steal_figures, steal_note
    fig = steal_figures(basis.get("steal"), basis["elapsed"], basis["ncpu"], basis["txns"])
    if fig is None:
        return
    out["steal"] = fig
    note = steal_note(fig, out["closure"].get("cycle_us"))
    if note:
        out["notes"].append(note)


def _add_checks(out: dict, run: RunMeta) -> None:
    """Where the latency view falls short, and the pooler's own counters against its timed wait."""
    from pathprof.analysis.gap import connect_divisors, locate_gap
    divisors = connect_divisors(out)
    if divisors:
        out["closure"]["connect_divisors"] = divisors
    gap = locate_gap(out)
    if gap:
        out["closure"]["gap"] = gap
    if run.pooler_counters:
        from pathprof.analysis.pooler import pooler_check
        out["pooler_counters"] = pooler_check(run, out)
    if run.cpu_quotas:
        from pathprof.analysis.quota import quota_check, quota_note
        out["cpu_quotas"] = quota_check(run.cpu_quotas, out)
        out["notes"] += [quota_note(q) for q in out["cpu_quotas"]]


def tcp_retransmits(counts: list[dict], stages: list[dict], txns: int) -> dict:
    """Retransmissions of the run's sockets by leg and kind, and what the messages they delivered waited for them
    (retx_* stages), as a share of the cycle: what loss on a link costs each transaction."""
    rows = sorted(counts, key=lambda r: (r["leg"], r["kind"], r["sender"]))
    wait = sum(s["us_per_txn"] for s in stages if s["name"].startswith("retx_") and not s.get("parent"))
    total = sum(s["us_per_txn"] for s in stages if not s.get("parent"))
    return {"by_leg": rows, "count": sum(r["count"] for r in rows),
            "per_txn": round(sum(r["count"] for r in rows) / txns, 4) if txns else None,
            "wait_us_per_txn": round(wait, 1), "wait_share_pct": round(100.0 * wait / total, 1) if total else None}


def probe_cost_share(out: dict) -> dict:
    """The probes' cost in the unit that limits the run: on a CPU-bound run a share of the CPU per transaction
    (the share of throughput they take), on a latency-bound one a share of the cycle (clients / TPS). A share
    of mean latency understates it on a CPU-bound run, where every probe nanosecond is a nanosecond of CPU
    the transactions did not get."""
    cost = out.get("probe_cost_ns_per_txn")
    cpu_us, cycle_us = out.get("cpu_us_per_txn"), (out.get("closure") or {}).get("cycle_us")
    if cost is None:
        return {}
    if out.get("regime") == "cpu-bound" and cpu_us:
        return {"probe_cost_share_pct": round(cost / 10.0 / cpu_us, 2), "probe_cost_share_of": "cpu"}
    if cycle_us:
        return {"probe_cost_share_pct": round(cost / 10.0 / cycle_us, 2), "probe_cost_share_of": "cycle"}
    return {}


def _add_connection_setup(out: dict, rd: RunDir, setup_retx: list | None = None, txns: int = 0) -> None:
    """A new connection per transaction (-C): the connection probe's setup steps join the latency view (leg
    `connect`), so the stages tile the client's whole cycle, connect to close. The per-message stages leave the
    setup exchange to that probe (probes/msg.bpf.h), so nothing is counted twice; the latency-bound prediction
    (cpu_view, from stages_sum_us) then includes the setup too."""
    from pathprof.analysis.conn_view import add_connection_setup, connect_retransmits, setup_stages, split_setup_retx
    add_connection_setup(out, rd)
    if out.get("connection_setup"):
        out["connection_setup"] = split_setup_retx(out["connection_setup"], setup_retx, txns)
    rows = setup_stages(out.get("connection_setup") or [])
    if not rows:
        return
    out["stages"] = out["stages"] + rows
    cl = out["closure"]
    total = round((cl.get("stages_sum_us") or 0.0) + sum(r["us_per_txn"] for r in rows), 3)
    cl["stages_sum_us"] = total
    ref = cl.get("cycle_us")
    if ref:
        cl["latency_error_pct"] = round((total - ref) / ref * 100.0, 2)
    hs = connect_retransmits(out, rd.meta.get("tcp_counters") or {}, setup_retx)
    if hs:
        out["connect_retransmits"] = hs
    win = out.get("windows") or {}
    charged = ((out.get("connection_probe") or {}).get("counters") or {}).get("window_charged")
    if (ref and not charged and win.get("window_s") and not win.get("always_on")
            and ref > 0.02 * win["window_s"] * 1e6):
        # a run recorded before the setup steps were charged by their overlap with the windows
        # (probes/conn_win.bpf.h): a wait that began before a window opened was not counted
        out["notes"].append(f"each client's cycle ({ref / 1e3:.0f} ms) is long against the {win['window_s']:g} s "
                            "measurement windows: waits cut by a window's edge are lost, so the stages may add up "
                            "to a few % less than the cycle; longer windows (--probe-window) or --probe-duty 100 "
                            "close it")


def headline_tps(whole_run: float | None, probes: dict | Probes) -> dict:
    """The run's TPS is the unprobed system's: with measurement windows, the rate outside them, where nothing was
    attached (the probes cost the in-window transactions time, and two paths with different probe costs must not
    be compared on it). The in-window rate is what the stage figures are divided by; the whole run's is pgbench's
    own. Always-on runs can only say their TPS is the probed one."""
    probes = _probes(probes)
    schedule, inside, outside = probes.schedule, probes.in_windows, probes.outside_windows
    out = {"tps_whole_run": whole_run, "tps_in_windows": inside.tps if inside else None}
    if probes.level in (None, "off") or (not probes.windows and not schedule):
        return {**out, "tps": whole_run, "tps_basis": "whole run, no probes attached"}
    if schedule and schedule.always_on:
        return {**out, "tps": whole_run, "tps_basis": "whole run, probes always attached (the probed system's)"}
    if outside and outside.tps and outside.txns:
        if _a_reference(outside):
            return {**out, "tps": outside.tps, "tps_basis": "outside the probe windows, nothing attached"}
        return {**out, "tps": whole_run, "tps_basis": f"whole run, mostly probed (outside the windows only "
                f"{outside.txns:,} transactions in {(outside.duration_s or 0) * 1e3:.0f} ms: no reference rate)"}
    return {**out, "tps": whole_run, "tps_basis": "whole run, half probed (no transaction outside the windows)"}


def _a_reference(outside) -> bool:
    """Enough outside the windows to be the unprobed rate: a window whose programs took 1.08 s to attach beside a
    loaded machine (the stretch counts neither in nor out) left a 3-s run 14 ms and 26 transactions outside, the
    tail of pgbench's start-up, and its headline 1,840 TPS against 52,162 (CI round ci53b-2)."""
    from pathprof.analysis.windows import MIN_OUTSIDE_TXNS, MIN_REFERENCE_S
    long_enough = outside.duration_s is None or outside.duration_s >= MIN_REFERENCE_S
    return (outside.txns or 0) >= MIN_OUTSIDE_TXNS and long_enough


def _probes(probes: dict | Probes) -> Probes:
    return probes if isinstance(probes, Probes) else load(Probes, probes)


def _prediction(unprobed_tps: float | None, probes: Probes) -> dict:
    """The run's truth check on itself: the model's TPS without probes next to the TPS measured outside the
    measurement windows, where nothing was attached (None when the probes were always on)."""
    outside = probes.outside_windows.tps if probes.outside_windows and _a_reference(probes.outside_windows) else None
    always_on = probes.schedule.always_on if probes.schedule else None
    measured = None if always_on or not outside else outside
    err = round((unprobed_tps - measured) / measured * 100.0, 1) if unprobed_tps and measured else None
    return {"unprobed_tps": unprobed_tps, "measured_outside_tps": measured, "error_pct": err}


def _windows(probes: Probes, out: dict) -> WindowFigures | None:
    """The in-window figures when the run used measurement windows (None for older runs / no probes);
    also fills out["windows"] with what a reader needs to judge them."""
    inside = probes.in_windows
    if not inside or not probes.windows:
        return None
    outside = probes.outside_windows or WindowFigures()
    out["windows"] = {"count": len(probes.windows), **(probes.schedule.doc if probes.schedule else {}),
                      "txns_in": inside.txns, "tps_in": inside.tps,
                      "txns_out": outside.txns, "tps_out": outside.tps,
                      "probe_overhead_run_pct": probes.probe_overhead_run_pct}
    if not inside.txns:
        out["notes"].append("no transaction ended inside a measurement window: the probe tables are not "
                            "divided per transaction")
        return None
    return inside
