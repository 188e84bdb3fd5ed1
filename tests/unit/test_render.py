"""Terminal renderings checked as plain text: names, order, numbers."""
from fixtures_summaries import bridge, connect_run, dnat, summary, sweep_runs
from pathprof.analysis.explain import explain
from pathprof.analysis.host_diff import host_differences
from pathprof.analysis.repeats import spread
from pathprof.analysis.report.render import bar, compare_view, diff_view, render_to_string, report_view, sweep_view
from pathprof.analysis.sweep import sweep_analysis


def test_bar():
    assert bar(10, 10, 8) == "█" * 8
    assert bar(5, 10, 8) == "█" * 4
    assert bar(0, 10) == "" and bar(-1, 10) == "" and bar(1, 0) == ""
    assert bar(1.5, 10, 10) == "█▌"                          # one full cell and a half-block


def test_report_view_header_and_views():
    out = render_to_string(report_view(dnat()))
    assert "\x1b[" not in out                                # plain text, no colour codes
    for text in ("docker-dnat", "26,232 TPS measured", "26,757 predicted", "mean 0.429", "p99 1.073",
                 "cpu-bound", "850 ns per transaction", "latency view closes within +1.2 %",
                 "CPU view closes within -0.5 %", "16 clients", "kernel 6.18.0"):
        assert text in out, text
    # legs in request → server → response order, stages in path order within a leg
    assert out.index("request") < out.index("server") < out.index("response")
    assert out.index("send.pgbench") < out.index("runqueue.backend") < out.index("backend.execute") \
        < out.index("runqueue.pgbench")
    assert "180.0" in out and "42.0 %" in out                # hop.docker-proxy row and its share
    # CPU view sorted by cost, with the measured total next to the sum
    cpu_part = out[out.index("CPU view:"):]
    assert cpu_part.index("hop.docker-proxy") < cpu_part.index("backend") < cpu_part.index("other")
    assert "75.9" in cpu_part and "76.3" in cpu_part
    assert "userland-proxy on" in out                        # notes
    assert "Connection setup" not in out


def test_report_view_connection_setup_and_closure_warning():
    s = connect_run()
    s["closure"]["latency_error_pct"] = 12.0
    out = render_to_string(report_view(s))
    assert "Connection setup" in out and "postmaster.fork" in out and "2,770.0" in out and "330 TPS" in out
    assert "does not close" in out
    assert "new connection per transaction" in out


def test_report_view_tolerates_missing_keys():
    out = render_to_string(report_view({"topology": "unix", "tps": 100.0}))
    assert "unix" in out and "100 TPS" in out and "closure not measured" in out and "not measured" in out


def test_unknown_names_and_legs_are_rendered():
    s = summary("odd", stages={"custom.stage": 3.0}, cpu={"hop.pgpool": 9.0})
    s["stages"][0]["leg"] = "sideways"
    out = render_to_string(report_view(s))
    assert "custom.stage" in out and "sideways" in out and "hop.pgpool" in out


def test_compare_view():
    b, d = bridge(), dnat()
    out = render_to_string(compare_view([b, d], [explain(b, d)], spreads={"docker-bridge": spread([b, b])}),
                           width=160)
    assert out.index("docker-bridge") < out.index("docker-dnat")
    assert "baseline" in out and "-59.5 %" in out and "64,765" in out and "26,232" in out
    assert "docker-dnat is 60 % slower than docker-bridge" in out
    expl = out[out.index("basis: "):]                      # the ranked table, after the sentence
    # the cause first, then the items under it by size, then the remainder
    assert expl.index("hop docker-proxy") < expl.index("hop.docker-proxy") < expl.index("softirq.net") \
        < expl.index("netfilter") < expl.index("unexplained")
    assert "+45.0" in expl and "99.1 %" in expl and "+40.0" in expl and "88.1 %" in expl and "n=2" in out


def test_unranked_explanation_shows_moves_without_shares():
    from fixtures_summaries import plus_stage, summary
    a = summary("loopback")
    b = plus_stage(a, "recv.backend", 1.0, topology="nic", tps=63000.0)      # -2.7 %: within single-run noise
    out = render_to_string(compare_view([a, b], [explain(a, b)]), width=160)
    table = out[out.index("basis: "):]
    assert "not ranked" in out and "recv.backend" in table and "–" in table and "unexplained" not in table


def test_sweep_view():
    out = render_to_string(sweep_view(sweep_analysis(sweep_runs())), width=140)
    lines = [ln for ln in out.splitlines() if "◀ knee" in ln]
    assert len(lines) == 1 and lines[0].split()[0] == "4"
    assert "60,000" in out and "runqueue.backend" in out and "+790.0" in out


def test_diff_view_lists_host_differences_first():
    a = summary("loopback")
    b = summary("loopback", host={"kernel": "6.1.0", "cpus": 4, "hostname": "vm1"}, tps=50000.0,
                run_dir="runs/x-loopback")
    out = render_to_string(diff_view(a, b, explain(a, b), host_differences(a, b)))
    assert out.index("kernel: 6.18.0 → 6.1.0") < out.index("Runs")
    assert "CPUs: 2 → 4" in out and "A: 20250101-120000-loopback" in out and "B: x-loopback" in out
    same = render_to_string(diff_view(a, a, explain(a, a), []))
    assert "Same host" in same and "no gap to explain" in same
