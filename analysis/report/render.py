"""Terminal renderings (rich) of reports, comparisons, sweeps and diffs, by what they draw: one run
(report.run_view), several runs (report.compare_view), and what both are drawn with (report.text).

Every view is a pure function of summary documents / explanation dicts and returns a rich renderable; the CLI
prints it, tests turn it into plain text with `render_to_string`. This module is where callers import them from.
"""
from __future__ import annotations

from pathprof.analysis.report.compare_view import (
    compare_view,
    diff_view,
    explanation_view,
    lessons_view,
    predictions_view,
    sweep_view,
)
from pathprof.analysis.report.run_view import (
    connection_table,
    cpu_table,
    disk_table,
    header,
    latency_table,
    report_view,
    retransmit_line,
    script_label,
    setup_text,
    statements_table,
)
from pathprof.analysis.report.text import CLOSURE_WARN_PCT, LEG_ORDER, bar, render_to_string

__all__ = ["CLOSURE_WARN_PCT", "LEG_ORDER", "bar", "compare_view", "connection_table", "cpu_table", "diff_view",
           "disk_table", "explanation_view", "header", "latency_table", "lessons_view", "predictions_view",
           "render_to_string", "report_view", "retransmit_line", "script_label", "setup_text", "statements_table",
           "sweep_view"]
