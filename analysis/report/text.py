"""What every terminal view (rich) is drawn with: bars, number formats, the closure line, plain-text output."""
from __future__ import annotations

import io

from pathprof.analysis.explain import _num
from rich.console import Console
from rich.text import Text

LEG_ORDER = ("request", "server", "response")
# Above this closure error a view's per-stage figures should not be trusted to add up; say so next to them.
CLOSURE_WARN_PCT = 5.0
_EIGHTHS = " ▏▎▍▌▋▊▉"


def bar(value: float, max_value: float, width: int = 30) -> str:
    """A horizontal bar with eighth-block resolution; negative or missing values give an empty bar."""
    if not max_value or value is None or value <= 0:
        return ""
    cells = min(value / max_value, 1.0) * width
    full = int(cells)
    frac = int((cells - full) * 8)
    return "█" * full + (_EIGHTHS[frac] if frac and full < width else "")


def render_to_string(renderable, width: int = 120) -> str:
    """Plain text (no colour codes) of a renderable at a fixed width: for tests, files and non-terminals."""
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False,
                      highlight=False, emoji=False, legacy_windows=False)
    console.print(renderable)
    return console.file.getvalue()


def _fmt(x, spec: str = ",.1f", none: str = "–") -> str:
    return none if x is None else format(_num(x), spec)


def _closure_text(err, view: str) -> Text:
    if err is None:
        return Text(f"{view}: closure not measured", style="yellow")
    style = "yellow" if abs(_num(err)) > CLOSURE_WARN_PCT else "green"
    warn = " — does not close; per-stage figures are approximate" if style == "yellow" else ""
    return Text(f"{view} closes within {_num(err):+.1f} %{warn}", style=style)


