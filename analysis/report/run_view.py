"""The terminal view of one run (`pathprof run`, `pathprof report`): the header, the latency, CPU and
connection-setup tables, statements, disk, retransmissions, the pooler's counters and the notes. Each reads the
report document through the typed run model (analysis.run_model.Summary; a summary dict is read through it)."""
from __future__ import annotations

from pathprof.analysis.explain import _num, measured_cpu_us, run_label
from pathprof.analysis.report.text import LEG_ORDER, _closure_text, _fmt, bar
from pathprof.analysis.run_model import Stage, Summary, TcpRetransmits, load
from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text


def _legs(summary: Summary) -> list[tuple[str, list[Stage]]]:
    """Stages grouped by leg in request/server/response order, stages kept in path order within a leg."""
    groups: dict[str, list[Stage]] = {}
    for st in summary.stages:
        groups.setdefault(str(st.leg or "other"), []).append(st)
    order = [leg for leg in LEG_ORDER if leg in groups] + [leg for leg in groups if leg not in LEG_ORDER]
    return [(leg, groups[leg]) for leg in order]


def header(summary: dict | Summary) -> Panel:
    summary = Summary.of(summary)
    lat, closure = summary.latency_ms, summary.closure
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    tps_line = _throughput_text(summary)
    if summary.status not in (None, "complete"):
        grid.add_row("status", Text(f"{summary.status}" + (": " + "; ".join(summary.failure)
                                                           if summary.failure else ""), style="bold red"))
    grid.add_row("throughput", tps_line)
    pred = summary.prediction
    if pred and pred.error_pct is not None:
        outside = _fmt(pred.measured_outside_tps, ",.0f")
        grid.add_row("truth check", f"the model's TPS without probes against the {outside} measured outside the "
                                    f"probe windows: {_num(pred.error_pct):+.1f} %")
    grid.add_row("latency (ms)", "  ".join(f"{k} {_fmt(v, '.3f')}" for k, v in (
        ("mean", lat.mean), ("p50", lat.p50), ("p95", lat.p95), ("p99", lat.p99))))
    regime = summary.regime or "unknown"
    why = {"cpu-bound": "CPUs saturated: the CPU view explains throughput",
           "latency-bound": "CPUs not saturated: the latency view explains throughput"}.get(regime, "")
    grid.add_row("regime", f"{regime}" + (f" ({why})" if why else ""))
    grid.add_row("probe cost", _probe_cost_text(summary))
    grid.add_row("closure", Text.assemble(_closure_text(closure.latency_error_pct, "latency view"), "; ",
                                          _closure_text(closure.cpu_error_pct, "CPU view")))
    gap = closure.gap
    if gap:
        text = (f"{gap.short_us_per_txn:,.1f} µs per transaction in no stage: {gap.statement}"
                if gap.short_us_per_txn > 0 else gap.statement)
        if gap.evidence:
            text += f" (probe counters: {gap.evidence})"
        grid.add_row("where", Text(text, style="yellow"))
    divisors = closure.connect_divisors
    if divisors and not (gap and gap.link == "divisor"):
        grid.add_row("divisors", Text(divisors["statement"], style="yellow"))
    grid.add_row("workload", _workload_text(summary))
    host = summary.host
    if host.doc:
        grid.add_row("host", ", ".join(f"{k} {v}" for k, v in (
            ("hostname", host.hostname), ("kernel", host.kernel), ("cpus", host.cpus)) if v))
    if summary.accelerator:
        grid.add_row("accelerator", str(summary.accelerator))
    if summary.setup_s:
        grid.add_row("set-up", setup_text(summary.setup_s))
    if summary.run_dir:
        grid.add_row("run", str(summary.run_dir))
    return Panel(grid, title=f"pathprof — {run_label(summary)}", title_align="left")


def _throughput_text(summary: Summary) -> str:
    """TPS and what it was measured on (outside the probe windows, or observed), and the model's figure."""
    tps_line = f"{_fmt(summary.tps, ',.0f')} TPS measured"
    if summary.tps_basis:
        tps_line += f" ({summary.tps_basis}"
        if summary.tps_in_windows and "outside" in summary.tps_basis:
            tps_line += f"; {_fmt(summary.tps_in_windows, ',.0f')} inside them, what the stages are divided by"
        tps_line += ")"
    if summary.driver == "observed":
        tps_line = f"{_fmt(summary.tps, ',.0f')} exchanges/s observed by the probes"
    if summary.predicted_tps is not None:
        tps_line += f", {_fmt(summary.predicted_tps, ',.0f')} predicted by the model without probes"
    return tps_line


def _probe_cost_text(summary: Summary) -> str | Text:
    """The probes' own cost per transaction, as a share of what limits the run (its CPU, or its cycle)."""
    cost = summary.probe_cost_ns_per_txn
    if cost is None:
        return Text("not measured", style="yellow")
    of = {"cpu": "of the CPU per transaction: CPU-bound, so about that share of throughput",
          "cycle": "of the cycle: latency-bound"}.get(summary.probe_cost_share_of)
    share = f" ({_num(summary.probe_cost_share_pct):.2f} % {of})" if of else ""
    return f"{_fmt(cost, ',.0f')} ns per transaction{share}; carved out of the CPU view as `probes`"


def _workload_text(summary: Summary) -> str:
    wl = summary.workload
    bits = [f"{summary.clients} clients"]
    bits += [f"{wl.threads} threads"] if wl.threads else []
    bits += [str(v) for v in (wl.mode, wl.script) if v]
    bits += ["new connection per transaction"] if wl.connect else []
    bits += [f"{_fmt(summary.duration_s, 'g')} s"] if summary.duration_s is not None else []
    return ", ".join(bits)


def setup_text(setup: dict) -> str:
    """Where the run's wall-clock time went outside pgbench (run.json `setup_s`)."""
    total, bench = setup.get("total"), setup.get("pgbench")
    parts = [f"{k} {v:.2f}" for k, v in setup.items() if k not in ("total", "pgbench") and v >= 0.005]
    if total is not None:
        other = total - sum(v for k, v in setup.items() if k != "total")
        parts += [f"other {other:.2f}"] if other >= 0.005 else []
    head = f"{total:.1f} s end to end" if total is not None else ""
    if total is not None and bench is not None:
        head += f", {total - bench:.1f} s outside pgbench's {bench:.1f} s"
    return head + (": " if head and parts else "") + ", ".join(parts)


def _no_data(summary: Summary, view: str) -> Text:
    level = summary.probes if isinstance(summary.probes, str) else None
    why = f" (probes: {level})" if level else ""
    return Text(f"{view}: no per-stage figures in this run{why}; only pgbench's totals above.", style="yellow")


def latency_table(summary: dict | Summary, bar_width: int = 30) -> Table | Text:
    summary = Summary.of(summary)
    stages = summary.stages
    if not stages:
        return _no_data(summary, "Latency view")
    # parts of a stage (backend.execute's deep split) are inside it: shown under it, not summed again
    total = sum(_num(st.us_per_txn) for st in stages if not st.parent)
    biggest = max((_num(st.us_per_txn) for st in stages), default=0.0)
    t = Table(title="Latency view: µs per transaction per stage", title_justify="left", show_edge=False)
    for col, kw in (("leg", {}), ("stage", {}), ("µs/txn", {"justify": "right"}), ("p99 µs", {"justify": "right"}),
                    ("share", {"justify": "right"}), ("", {"no_wrap": True})):
        t.add_column(col, **kw)
    for i, (leg, rows) in enumerate(_legs(summary)):
        if i:
            t.add_section()
        for j, st in enumerate(rows):
            us = _num(st.us_per_txn)
            part = bool(st.parent)      # phases (deep: parse/plan/executor) overlap the parts: "·"
            t.add_row(leg if j == 0 else "", ("  · " if st.phase else "  ↳ " if part else "")
                      + str(st.name), _fmt(us),
                      _fmt(st.p99_us), f"{us / total * 100:.1f} %" if total else "–",
                      Text(bar(us, biggest, bar_width), style="dim cyan" if part else "cyan"),
                      style="dim" if part else None)
    t.add_section()
    mean_us = summary.latency_ms.mean
    cycle = summary.closure.cycle_us
    split = summary.closure.execute_split
    if split:   # the ↳ parts of backend.execute are exclusive: they add up to it (other = what they leave)
        t.add_row("", "↳ backend.execute's waits and I/O", _fmt(_num(split.parts_us)), "",
                  f"{_num(split.parts_pct):.1f} % of it", "", style="dim")
    t.add_row("", "sum of stages", _fmt(total), "", "", "", style="bold")
    if cycle:
        # The stages tile each connection's timeline: they close against the cycle, clients / TPS.
        t.add_row("", "measured cycle (clients ÷ TPS)", _fmt(_num(cycle)), "", "", "", style="bold")
    if mean_us is not None:
        label = "observed mean latency" if summary.driver == "observed" else "pgbench mean latency"
        t.add_row("", label, _fmt(_num(mean_us) * 1000), "", "", "", style="dim")
    return t


def cpu_table(summary: dict | Summary, bar_width: int = 30) -> Table | Text:
    summary = Summary.of(summary)
    rows = sorted(summary.cpu, key=lambda c: -_num(c.us_per_txn))
    if not rows:
        return _no_data(summary, "CPU view")
    total = sum(_num(c.us_per_txn) for c in rows)
    biggest = max((_num(c.us_per_txn) for c in rows), default=0.0)
    t = Table(title="CPU view: CPU µs per transaction per component", title_justify="left", show_edge=False)
    hosts = any(c.host for c in rows)          # a merged run: where each component ran
    for col, kw in (("component", {}), *((("host", {}),) if hosts else ()), ("µs/txn", {"justify": "right"}),
                    ("share", {"justify": "right"}), ("", {"no_wrap": True})):
        t.add_column(col, **kw)
    pad = ("",) if hosts else ()
    for c in rows:
        us = _num(c.us_per_txn)
        t.add_row(str(c.component), *((str(c.host or ""),) if hosts else ()), _fmt(us),
                  f"{us / total * 100:.1f} %" if total else "–", Text(bar(us, biggest, bar_width), style="magenta"))
    t.add_section()
    t.add_row("sum of components", *pad, _fmt(total), "", "", style="bold")
    if rows and summary.closure.cpu_error_pct is not None:
        ref = "no-HZ idle time" if summary.closure.cpu_reference == "nohz" else "tick-sampled"
        t.add_row(f"measured (busy CPU / txn, {ref})", *pad, _fmt(measured_cpu_us(summary)), "", "", style="bold")
    return t


def connection_table(summary: dict | Summary, bar_width: int = 30) -> Table | None:
    rows = Summary.of(summary).connection_setup
    if not rows:
        return None
    total = sum(_num(r.us_per_conn) for r in rows)
    biggest = max((_num(r.us_per_conn) for r in rows), default=0.0)
    t = Table(title="Connection setup: µs per connection", title_justify="left", show_edge=False)
    for col, kw in (("step", {}), ("µs/conn", {"justify": "right"}), ("share", {"justify": "right"}),
                    ("", {"no_wrap": True})):
        t.add_column(col, **kw)
    for r in rows:
        us = _num(r.us_per_conn)
        t.add_row(str(r.name), _fmt(us), f"{us / total * 100:.1f} %" if total else "–",
                  Text(bar(us, biggest, bar_width), style="yellow"))
    t.add_section()
    t.add_row("total", _fmt(total), "", "", style="bold")
    return t


def _notes(summary: Summary) -> Text | None:
    notes = summary.notes
    if not notes:
        return None
    notes = [notes] if isinstance(notes, str) else list(notes)
    return Text("Notes:\n" + "\n".join(f"  • {n}" for n in notes), style="italic")


def disk_table(summary: dict | Summary) -> Table | None:
    """The block devices' own time during the probe windows (all requests on the machine)."""
    rows = [d for d in Summary.of(summary).disk if d.requests_per_txn]
    if not rows:
        return None
    t = Table(title="Disk: block device time while probed (every request on the machine)", title_justify="left",
              show_edge=False)
    for col in ("device", "op", "requests/txn", "µs/txn", "mean µs", "p99 µs"):
        t.add_column(col, justify="left" if col in ("device", "op") else "right")
    for d in rows:
        t.add_row(str(d.device), str(d.op), _fmt(d.requests_per_txn, ",.3f"), _fmt(d.us_per_txn),
                  _fmt(d.mean_us), _fmt(d.p99_us))
    return t


def script_label(name) -> str:
    """A script file's transaction type (tpcc_new_order.sql -> new_order); builtin names as pgbench gives them."""
    name = str(name or "")
    if name.startswith("<") or "/" not in name:
        return name
    return name.rsplit("/", 1)[1].removesuffix(".sql").removeprefix("tpcc_")


def statements_table(summary: dict | Summary) -> Table | None:
    """pgbench -r: per script (transaction type) its share and latency, and each statement's mean latency."""
    scripts = [s for s in Summary.of(summary).scripts if s.statements]
    if not scripts:
        return None
    t = Table(title="Statements (pgbench -r): mean ms per statement", title_justify="left", show_edge=False)
    t.add_column("script / statement", overflow="fold")
    t.add_column("ms", justify="right")
    t.add_column("", justify="right")
    for s in scripts:
        if len(scripts) > 1 or s.name:
            t.add_row(Text(script_label(s.name), style="bold"), _fmt(s.latency_ms.mean, ",.3f"),
                      f"{_fmt(s.tps, ',.0f')} TPS" if s.tps is not None else "")
        for st in s.statements:
            t.add_row(f"  {st.sql[:100]}", _fmt(st.latency_ms, ",.3f"),
                      f"{st.failures} failed" if st.failures else "")
    return t


def retransmit_line(r: dict | TcpRetransmits) -> str:
    """One sentence on packet loss: how many retransmissions, on which legs, and what they cost the cycle."""
    r = r if isinstance(r, TcpRetransmits) else load(TcpRetransmits, r)
    legs: dict[str, int] = {}
    kinds: dict[str, int] = {}
    for row in r.by_leg or []:
        legs[row.leg] = legs.get(row.leg, 0) + row.count
        kinds[row.kind] = kinds.get(row.kind, 0) + row.count
    names = {"rto": "after a timeout", "fast": "in fast recovery", "probe": "as tail loss probes"}
    on_legs = ", ".join(f"{v:,} on the {k} leg" for k, v in legs.items())
    text = (f"TCP retransmissions: {r.count or 0:,} ({on_legs}; "
            f"{', '.join(f'{v:,} {names.get(k, k)}' for k, v in kinds.items())}); the messages they delivered "
            f"waited {r.wait_us_per_txn or 0:,.1f} µs per transaction for them")
    if r.wait_share_pct is not None:
        text += f", {r.wait_share_pct:.1f} % of the stages"
    if r.kernel_retrans_segs is not None:
        text += f"; the kernel counted {r.kernel_retrans_segs:,} (RetransSegs in the path's namespaces)"
    return text


def connect_retransmit_line(h: dict) -> str:
    """One sentence on lost or dropped packets of connection setup under -C: how many, what they cost the cycle."""
    text = (f"Connection setup retransmissions: {h['syn']:,} SYN, {h['synack']:,} SYN-ACK, "
            f"{h.get('setup_messages', 0):,} setup messages; they cost {h['wait_us_per_txn']:,.1f} µs per transaction "
            f"({', '.join(f'{n} {v:,.1f}' for n, v in h['by_stage'].items()) or 'none sampled'})")
    if h.get("wait_share_pct") is not None:
        text += f", {h['wait_share_pct']:.1f} % of the cycle"
    if h.get("kernel_syn_retrans") is not None:
        text += (f"; the kernel counted {h['kernel_syn_retrans']:,} SYN and SYN-ACK "
                 "(TCPSynRetrans in the path's namespaces)")
    if h.get("listen_drops"):
        text += f"; the server's listen queue dropped {h['listen_drops']:,} (ListenDrops)"
    return text


def report_view(summary: dict | Summary):
    summary = Summary.of(summary)
    parts = [header(summary), latency_table(summary), Text(""), cpu_table(summary)]
    conn = connection_table(summary)
    if conn is not None:
        parts += [Text(""), conn]
    for extra in (statements_table(summary), disk_table(summary)):
        if extra is not None:
            parts += [Text(""), extra]
    if summary.tcp_retransmits:
        parts += [Text(""), Text(retransmit_line(summary.tcp_retransmits))]
    if summary.connect_retransmits:
        parts += [Text(""), Text(connect_retransmit_line(summary.connect_retransmits))]
    if summary.pooler_counters:
        from pathprof.analysis.pooler import describe
        parts += [Text(""), Text("\n".join(describe(r) for r in summary.pooler_counters))]
    if summary.served_by:
        from pathprof.analysis.served import describe as served
        parts += [Text(""), Text(served(summary.served_by))]
    notes = _notes(summary)
    if notes is not None:
        parts += [Text(""), notes]
    return Group(*parts)


