import io
import re

from pathprof.agent.cli.live import LiveState, LiveView, plain_line, render_live
from pathprof.analysis.report.render import render_to_string


def state(**kw):
    base = dict(elapsed_s=12.0, duration_s=30.0, tps=26232.0, latency_ms={"mean": 0.429, "p99": 1.07},
                stages=[{"name": "send.pgbench", "leg": "request", "us_per_txn": 6.0},
                        {"name": "hop.docker-proxy", "leg": "request", "us_per_txn": 90.0},
                        {"name": "hop.docker-proxy", "leg": "response", "us_per_txn": 85.0}],
                cpu={"backend": 12.0, "hop.docker-proxy": 40.0}, probe_cost_ns_per_txn=850.0, lost_events=3,
                phase="measuring", title="docker-dnat")
    base.update(kw)
    return LiveState(**base)


def test_render_live_contents():
    out = render_to_string(render_live(state()), width=100)
    for text in ("docker-dnat", "measuring", "12.0/30 s", "TPS 26,232", "mean 0.429 ms", "p99 1.070 ms",
                 "send.pgbench", "hop.docker-proxy (request)", "hop.docker-proxy (response)", "850 ns/txn",
                 "lost events 3"):
        assert text in out, text
    # stages in path order; CPU by cost
    assert out.index("send.pgbench") < out.index("hop.docker-proxy (request)")
    cpu = out[out.index("CPU"):]
    assert cpu.index("hop.docker-proxy") < cpu.index("backend")
    assert "████████████████░░░░" in out                      # 40 % progress


def test_render_live_empty_state():
    out = render_to_string(render_live(LiveState(phase="starting postgres")), width=80)
    assert "starting postgres" in out and "TPS –" in out and "lost events 0" in out


def test_plain_line():
    line = plain_line(state())
    assert "\n" not in line
    assert line.startswith("[pathprof] measuring 12/30s (40%)")
    assert "tps=26232" in line and "lat_mean=0.429ms" in line and "lost=3" in line
    assert "top=hop.docker-proxy (request):90.0us" in line


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_live_view_plain_mode_rate_limits_and_flushes_last_state():
    stream, clock = io.StringIO(), Clock()
    with LiveView(stream=stream, plain_interval_s=5.0, clock=clock) as lv:
        for i in range(21):                            # 10 s of updates at 2 Hz
            clock.t = i * 0.5
            lv.update(state(elapsed_s=clock.t, tps=1000.0 + i))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3                             # t=0, t=5, t=10
    assert "tps=1020" in lines[-1]                     # the final state is what stays on screen


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_live_view_terminal_mode(monkeypatch):
    monkeypatch.setenv("TERM", "xterm-256color")
    stream, clock = Tty(), Clock()
    with LiveView(stream=stream, hz=2, clock=clock) as lv:
        for i in range(40):                            # 2 s of updates at 20 Hz → about 4 frames, plus the last
            clock.t = i * 0.05
            lv.update(state(tps=5000.0 + i))
    assert 4 <= lv.frames <= 6
    out = stream.getvalue()
    assert "\x1b[" in out                              # cursor control: it really is a live display
    assert "TPS 5,039" in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out)


def test_dumb_terminal_gets_plain_lines(monkeypatch):
    monkeypatch.setenv("TERM", "dumb")
    stream = Tty()
    with LiveView(stream=stream, clock=Clock()) as lv:
        lv.update(state())
    assert not lv.tty
    assert stream.getvalue().startswith("[pathprof] measuring")


def test_phase_change_is_shown_at_once_and_notes_print():
    stream, clock = io.StringIO(), Clock()
    with LiveView(stream=stream, plain_interval_s=5.0, clock=clock) as lv:
        lv.update(state(phase="starting postgres"))
        clock.t = 0.1
        lv.update(state(phase="measuring"))            # inside the interval, but a new phase
        lv.console_print("note: vhost-net is absent")
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("[pathprof] starting postgres") and lines[1].startswith("[pathprof] measuring")
    assert lines[2] == "note: vhost-net is absent"


def test_odd_snapshot_shapes():
    s = state(stages={"send.pgbench": {"us_per_txn": 4.0}, "bad": "x"}, cpu=[{"component": "backend"}])
    out = render_to_string(render_live(s), width=100)
    assert "send.pgbench" in out and "bad" not in out and "backend" in out
