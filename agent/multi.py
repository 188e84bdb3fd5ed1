"""Commands over several runs: compare (topologies), sweep (client counts), diff (two run directories), export."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from . import cli_args
from .errors import UserError


def _out_json(doc) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")


def _print(renderable) -> None:
    from pathprof.analysis.render import render_to_string
    sys.stdout.write(render_to_string(renderable))


def _one_run(a, topology: str, clients: int | None, label: str) -> dict:
    from pathprof.analysis.summary import summarize
    from pathprof.topologies import spec

    from . import run as runmod
    from .console import PlainReporter
    opts = cli_args.run_options(a, topology, clients)
    # --userland-proxy/--target apply to the topologies that declare them; the others ignore them.
    declared = spec.load(topology).options
    opts.topo_options = {k: v for k, v in opts.topo_options.items() if k in declared}
    ui = PlainReporter(sys.stderr, opts.workload.duration_s, every_s=5.0)
    ui.phase(f"--- {label} ---")
    return summarize(runmod.execute(opts, ui))


def _median_run(runs: list[dict]) -> dict:
    ordered = sorted(runs, key=lambda s: s.get("tps") or 0)
    return ordered[(len(ordered) - 1) // 2]


def compare(a) -> int:
    from pathprof.analysis.explain import explain, is_real_gap, spread
    from pathprof.topologies import spec
    if len(a.topologies) < 2:
        raise UserError("compare needs at least two topologies (the first is the baseline)")
    for t in a.topologies:
        spec.load(t)  # fail fast on an unknown name, before any run
    runs: dict[str, list[dict]] = {t: [] for t in a.topologies}
    total = len(a.topologies) * a.repeat
    n = 0
    for k in range(a.repeat):  # interleaved: A B C A B C, so drift hits every topology alike
        for t in a.topologies:
            n += 1
            runs[t].append(_one_run(a, t, None, f"run {n}/{total}: {t} (repeat {k + 1})"))
    chosen = [_median_run(runs[t]) for t in a.topologies]
    base = chosen[0]
    explanations = []
    for t, s in zip(a.topologies[1:], chosen[1:]):
        e = explain(base, s)
        if a.repeat > 1:
            e["real_gap"] = is_real_gap(runs[a.topologies[0]], runs[t])
        explanations.append(e)
    spreads = {t: spread(runs[t]) for t in a.topologies} if a.repeat > 1 else None
    if a.html:
        from pathprof.analysis.html import write_html
        write_html(chosen, Path(a.html), explanations=explanations)
        print(f"pathprof: wrote {a.html}", file=sys.stderr)
    if a.json:
        _out_json({"runs": chosen, "baseline": base["topology"], "explanations": explanations,
                   "spread": spreads, "all_runs": {t: [r["run_dir"] for r in rs] for t, rs in runs.items()}})
    else:
        from pathprof.analysis.render import compare_view
        _print(compare_view(chosen, explanations, spreads))
    return 0


def parse_clients(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--clients '{text}' is not a comma-separated list of numbers, e.g. 1,4,16") from None
    if not values or any(v <= 0 for v in values):
        raise UserError(f"--clients '{text}' needs positive client counts, e.g. 1,4,16")
    return sorted(set(values))


def sweep(a) -> int:
    from pathprof.analysis.sweep import sweep_analysis
    from pathprof.topologies import spec
    counts = parse_clients(a.clients)
    spec.load(a.topology, cli_args.topo_options(a))
    summaries = [_one_run(a, a.topology, c, f"{a.topology}: {c} clients ({i + 1}/{len(counts)})")
                 for i, c in enumerate(counts)]
    analysis = sweep_analysis(summaries)
    if a.html:
        from pathprof.analysis.html import write_html
        write_html(summaries, Path(a.html), sweep=analysis)
    if a.json:
        _out_json({"runs": summaries, "sweep": analysis})
    else:
        from pathprof.analysis.render import sweep_view
        _print(sweep_view(analysis))
    return 0


def diff(a) -> int:
    from pathprof.analysis.explain import explain, host_differences
    from pathprof.analysis.rundir import RunDir
    from pathprof.analysis.summary import summarize
    sa, sb = summarize(RunDir.open(a.run_a)), summarize(RunDir.open(a.run_b))
    expl = explain(sa, sb)
    hosts = host_differences(sa, sb)
    if a.json:
        _out_json({"runs": [sa, sb], "baseline": sa["run_dir"], "host_differences": hosts,
                   "explanations": [expl]})
    else:
        from pathprof.analysis.render import diff_view
        _print(diff_view(sa, sb, expl, hosts))
    return 0


def export(a) -> int:
    from pathprof.analysis import export as ex
    from pathprof.analysis.rundir import RunDir
    rd = RunDir.open(a.run)
    if a.format == "perfetto":
        traces = rd.read_frame("traces.parquet")
        if traces is None or not len(traces):
            raise UserError(f"{rd.path} has no traces; record some with `pathprof run --trace-sample N`")
        out = Path(a.output or rd.path / "trace.perfetto.json")
        ex.write_perfetto(traces, rd.meta, out)
    else:
        stages, cpu = rd.read_frame("stages.parquet"), rd.read_frame("cpu.parquet")
        if stages is None and cpu is None:
            raise UserError(f"{rd.path} has no stage tables (it was run with --probes off)")
        out = Path(a.output or rd.path / "export")
        out.mkdir(parents=True, exist_ok=True)
        write = ex.stages_to_csv if a.format == "csv" else ex.stages_to_parquet
        for name, frame in (("stages", stages), ("cpu", cpu)):
            if frame is not None:
                write(frame, out / f"{name}.{a.format}")
    print(out)
    return 0
