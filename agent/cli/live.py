"""The live view shown on stderr during a run.

It must cost well under 2 % of a CPU, because it shares the machine with the workload it measures. So a frame is
one rich Text built by hand (no tables, no layout engine), frames are rate-limited in `update` whatever the
caller's polling rate, and rich's own refresh thread is off (auto_refresh=False), so nothing redraws an unchanged
frame. `bench/live_view_cost` measures the cost per frame.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from pathprof.analysis.report.render import bar
from rich.console import Console
from rich.live import Live
from rich.text import Text

MAX_STAGES = 12          # a frame taller than a laptop terminal scrolls and flickers
MAX_COMPONENTS = 8
BAR_WIDTH = 30


@dataclass
class LiveState:
    """What one frame shows. `latency_ms` is a mean in ms or a dict like the summary's {mean, p50, p95, p99};
    `stages`/`cpu` are the summary's lists ([{name, leg, us_per_txn}], [{component, us_per_txn}]) or plain
    {name: us_per_txn} dicts, so the agent can pass `ProbeSession.snapshot()` pieces without reshaping."""
    elapsed_s: float = 0.0
    duration_s: float | None = None
    tps: float | None = None
    latency_ms: Any = None
    stages: Any = field(default_factory=list)
    cpu: Any = field(default_factory=list)
    probe_cost_ns_per_txn: float | None = None
    lost_events: int = 0
    phase: str = ""
    title: str = ""


def _us(value) -> float | None:
    """µs from a number or a {us_per_txn: …} dict; None for anything else, so one odd entry cannot break a frame."""
    if isinstance(value, dict):
        value = value.get("us_per_txn")
    try:
        return float(value or 0.0)
    except (TypeError, ValueError):
        return None


def _pairs(items, key: str) -> list[tuple[str, float]]:
    if isinstance(items, dict):
        return [(str(k), us) for k, v in items.items() if (us := _us(v)) is not None]
    out = []
    items = list(items or [])
    seen: dict[str, int] = {}
    for it in items:
        seen[str(it.get(key, "?"))] = seen.get(str(it.get(key, "?")), 0) + 1
    for it in items:
        name = str(it.get(key, "?"))
        if seen[name] > 1 and it.get("leg"):
            name = f"{name} ({it['leg']})"     # a hop sits on both legs; two identical labels would confuse
        us = _us(it)
        if us is not None:
            out.append((name, us))
    return out


def _latency(state: LiveState) -> tuple[float | None, float | None]:
    lat = state.latency_ms
    if isinstance(lat, dict):
        return lat.get("mean"), lat.get("p99")
    return lat, None


def _progress(state: LiveState) -> float | None:
    if not state.duration_s:
        return None
    return max(0.0, min(1.0, state.elapsed_s / state.duration_s))


def render_live(state: LiveState) -> Text:
    """One frame: progress, TPS/latency, stage bars, CPU per component, probe cost, lost events."""
    t = Text()
    t.append("pathprof", style="bold")
    if state.title:
        t.append(f" · {state.title}")
    if state.phase:
        t.append(f" · {state.phase}", style="cyan")
    t.append("\n")
    frac = _progress(state)
    if frac is not None:
        done = int(frac * 40)
        t.append("█" * done, style="green")
        t.append("░" * (40 - done), style="dim")
        t.append(f" {state.elapsed_s:5.1f}/{state.duration_s:g} s\n")
    else:
        t.append(f"{state.elapsed_s:.1f} s\n")
    mean, p99 = _latency(state)
    t.append("TPS ", style="bold")
    t.append(f"{state.tps:,.0f}" if state.tps is not None else "–")
    t.append("   latency ", style="bold")
    t.append(f"mean {mean:.3f} ms" if mean is not None else "–")
    if p99 is not None:
        t.append(f"  p99 {p99:.3f} ms")
    t.append("\n")

    stages = _pairs(state.stages, "name")
    if stages:
        total = sum(v for _, v in stages) or 1.0
        top = sorted(stages, key=lambda kv: -kv[1])[:MAX_STAGES]
        keep = {n for n, _ in top}
        biggest = max(v for _, v in top)
        width = max(len(n) for n, _ in top)
        t.append("\nstages (µs per transaction)\n", style="bold")
        for name, us in stages:                      # path order, but only the biggest MAX_STAGES
            if name in keep:
                t.append(f"  {name:<{width}} {us:9.1f} {us / total * 100:5.1f} % ")
                t.append(bar(us, biggest, BAR_WIDTH), style="cyan")
                t.append("\n")
        if len(stages) > len(top):
            t.append(f"  … {len(stages) - len(top)} smaller stages\n", style="dim")
    cpu = sorted(_pairs(state.cpu, "component"), key=lambda kv: -kv[1])
    if cpu:
        biggest = cpu[0][1]
        width = max(len(n) for n, _ in cpu[:MAX_COMPONENTS])
        t.append("\nCPU (µs per transaction)\n", style="bold")
        for name, us in cpu[:MAX_COMPONENTS]:
            t.append(f"  {name:<{width}} {us:9.1f} ")
            t.append(bar(us, biggest, BAR_WIDTH), style="magenta")
            t.append("\n")
    t.append("\nprobe cost ")
    t.append(f"{state.probe_cost_ns_per_txn:,.0f} ns/txn" if state.probe_cost_ns_per_txn is not None else "–")
    t.append("   lost events ")
    t.append(f"{state.lost_events:,}", style="bold red" if state.lost_events else "green")
    return t


def plain_line(state: LiveState) -> str:
    """One line for a stderr that is not a terminal (CI logs, `2> file`)."""
    parts = [f"[pathprof]{' ' + state.phase if state.phase else ''}"]
    frac = _progress(state)
    parts.append(f"{state.elapsed_s:.0f}/{state.duration_s:g}s ({frac * 100:.0f}%)" if frac is not None
                 else f"{state.elapsed_s:.0f}s")
    parts.append(f"tps={state.tps:.0f}" if state.tps is not None else "tps=-")
    mean, p99 = _latency(state)
    parts.append(f"lat_mean={mean:.3f}ms" if mean is not None else "lat_mean=-")
    if p99 is not None:
        parts.append(f"p99={p99:.3f}ms")
    stages = sorted(_pairs(state.stages, "name"), key=lambda kv: -kv[1])[:3]
    if stages:
        parts.append("top=" + ",".join(f"{n}:{v:.1f}us" for n, v in stages))
    if state.probe_cost_ns_per_txn is not None:
        parts.append(f"probe={state.probe_cost_ns_per_txn:.0f}ns/txn")
    parts.append(f"lost={state.lost_events}")
    return " ".join(parts)


class LiveView:
    """`with LiveView() as lv: lv.update(state)` — redraws at most `hz` times a second on a terminal, else prints
    `plain_line` every `plain_interval_s`. Never touches stdout, which `--json` owns."""

    def __init__(self, stream: TextIO | None = None, hz: float = 2, plain_interval_s: float = 5.0,
                 clock=time.monotonic):
        self.stream = stream if stream is not None else sys.stderr
        self.min_interval = 1.0 / hz if hz > 0 else 0.0
        self.plain_interval = plain_interval_s
        self.clock = clock
        # TERM=dumb (emacs shells, some CI) cannot move the cursor: rich would show only the last frame, so such
        # a terminal gets the periodic plain lines instead.
        self._console = Console(file=self.stream, highlight=False)
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) and not self._console.is_dumb_terminal
        self._live: Live | None = None
        self._last_draw = float("-inf")
        self._pending: LiveState | None = None     # newest state not yet shown, drawn on exit
        self._last_phase: str | None = None
        self.frames = 0

    def __enter__(self) -> "LiveView":
        if self.tty:
            self._live = Live(console=self._console, auto_refresh=False, redirect_stdout=False, redirect_stderr=False,
                              transient=False)
            self._live.start()
        return self

    def update(self, state: LiveState, force: bool = False) -> None:
        now = self.clock()
        interval = self.min_interval if self.tty else self.plain_interval
        # A new phase ("starting postgres", "measuring") is news: show it now, not at the next periodic frame.
        force = force or state.phase != self._last_phase
        if not force and now - self._last_draw < interval:
            self._pending = state
            return
        self._draw(state)
        self._last_draw = now

    def console_print(self, text: str) -> None:
        """A message (a note, a warning) printed above the live frame, or as its own line on a non-terminal."""
        if self._live is not None:
            self._live.console.print(text, highlight=False, markup=False)
        else:
            print(text, file=self.stream, flush=True)

    def _draw(self, state: LiveState) -> None:
        self._last_phase = state.phase
        self._pending = None
        self.frames += 1
        if self._live is not None:
            self._live.update(render_live(state), refresh=True)
        else:
            print(plain_line(state), file=self.stream, flush=True)

    def __exit__(self, *exc) -> None:
        # The last frame a user sees should be the final numbers, not whatever the rate limit let through.
        if self._pending is not None:
            self._draw(self._pending)
        if self._live is not None:
            self._live.stop()
            self._live = None
