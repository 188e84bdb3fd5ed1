"""Commands over several runs: compare (topologies), sweep (client counts), diff (two run directories), export."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from pathprof.agent.cli import args as cli_args
from pathprof.errors import UserError


def _out_json(doc) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")


def _print(renderable) -> None:
    from pathprof.analysis.report.render import render_to_string
    sys.stdout.write(render_to_string(renderable))


def _one_run(a, topology: str, clients: int | None, label: str, own_options: dict | None = None,
             run_label: str | None = None) -> dict:
    from pathprof.agent.cli.console import PlainReporter
    from pathprof.agent.run import owned as runmod
    from pathprof.topologies import spec
    opts = cli_args.run_options(a, topology, clients)
    # Command-wide --userland-proxy/--target apply to the topologies that declare them, the others ignore them;
    # what a compare entry sets for itself (own_options) was validated against its topology already.
    declared = spec.load(topology).options
    opts.topo_options = {k: v for k, v in opts.topo_options.items() if k in declared or k in (own_options or {})}
    ui = PlainReporter(sys.stderr, opts.workload.duration_s, every_s=5.0)
    ui.phase(f"--- {label} ---")
    from pathprof.agent.host.machine_costs import learn_from_run
    rd = runmod.execute(opts, ui)
    s = rd.summary().doc
    learn_from_run(rd, s)                # what this run showed of the machine, for later predictions
    if run_label:
        s["label"] = run_label
    return s


def _median_run(runs: list[dict]) -> dict:
    from pathprof.analysis.run_model import Summary
    ordered = sorted(runs, key=lambda s: Summary.of(s).tps or 0)
    return ordered[(len(ordered) - 1) // 2]


def compare(a) -> int:
    from pathprof.agent.cli.variants import apply, parse_variant
    from pathprof.analysis.explain import explain
    from pathprof.analysis.repeats import cause_spread, is_real_gap, spread
    from pathprof.analysis.run_model import Summary
    from pathprof.topologies import spec
    if len(a.topologies) < 2:
        raise UserError("compare needs at least two entries (the first is the baseline)")
    variants = [parse_variant(t) for t in a.topologies]
    labels = [v.label for v in variants]
    if len(set(labels)) != len(labels):
        raise UserError("compare entries must differ: " + ", ".join(sorted({x for x in labels if labels.count(x) > 1})))
    planned = []
    for v in variants:   # fail fast on an unknown name or setting, before any run
        ns, own = apply(a, v)
        spec.load(v.topology, own, getattr(ns, "link", None))
        planned.append((v, ns, own))
    runs: dict[str, list[dict]] = {v.label: [] for v in variants}
    total = len(variants) * a.repeat
    n = 0
    for k in range(a.repeat):  # interleaved: A B C A B C, so drift hits every entry alike
        for v, ns, own in planned:
            n += 1
            runs[v.label].append(_one_run(ns, v.topology, None, f"run {n}/{total}: {v.label} (repeat {k + 1})",
                                          own, run_label=v.label if v.settings else None))
    chosen = [_median_run(runs[lb]) for lb in labels]
    base = chosen[0]
    explanations = []
    for lb, s in zip(labels[1:], chosen[1:]):
        real = is_real_gap(runs[labels[0]], runs[lb]) if a.repeat > 1 else None
        # repeats that show the gap stands out of the spread overrule the single-run noise rule
        e = explain(base, s, noise_pct=0.0) if real else explain(base, s)
        if a.repeat > 1:
            e["real_gap"] = real
            cause_spread(e, [explain(b, o, basis=e["basis"], noise_pct=0.0)
                             for b, o in zip(runs[labels[0]], runs[lb])])
        explanations.append(e)
    spreads = {lb: spread(runs[lb]) for lb in labels} if a.repeat > 1 else None
    predictions = predictions_from_first(chosen)
    _learn_from_checks(chosen, predictions)
    lessons = _learn_from_pairs([(b, o) for lb in labels[1:] for b, o in zip(runs[labels[0]], runs[lb])])  # per repeat
    if a.html:
        from pathprof.analysis.report.html import write_html
        write_html(chosen, Path(a.html), explanations=explanations,
                   repeats=[runs[lb] for lb in labels] if a.repeat > 1 else None)
        print(f"pathprof: wrote {a.html}", file=sys.stderr)
    if a.json:
        _out_json({"runs": chosen, "baseline": labels[0], "explanations": explanations,
                   "spread": spreads, "all_runs": {lb: [Summary.of(r).run_dir for r in rs] for lb, rs in runs.items()},
                   "predictions": predictions, "lessons": lessons})
    else:
        from pathprof.analysis.report.render import compare_view, lessons_view, predictions_view
        _print(compare_view(chosen, explanations, spreads))
        _print(predictions_view(predictions))
        _print(lessons_view(lessons))
    return 0


def predictions_from_first(summaries: list[dict]) -> list[dict]:
    """For every run after the first, what analysis.predict says from the first run, next to the measurement:
    every real comparison is also a test of the model. A run the model cannot reach from the first (another
    topology) gets `tps: None` and the reason."""
    from pathprof.analysis.explain import run_label
    from pathprof.analysis.predict import predict_for
    out = []
    for s in summaries[1:]:
        row = predict_for(summaries[0], s)
        if row is None:
            row = {"tps": None, "reason": "not a scenario of the first run (another path, or a change the model "
                                          "does not represent)"}
        row["run"] = run_label(s)      # its label, else its topology
        out.append(row)
    return out


def _learn_from_checks(summaries: list[dict], predictions: list[dict]) -> None:
    """Each prediction from the first run, measured by the run it predicted, tells the machine how far such
    predictions miss (agent.host.machine_costs.learn_from_check): the bands of the next ones."""
    from pathprof.agent.host.machine_costs import learn_from_check
    from pathprof.analysis.run_model import Summary
    from pathprof.analysis.rundir import RunDir
    for s, row in zip(summaries[1:], predictions):
        try:
            rb, ro = RunDir.open(Summary.of(summaries[0]).run_dir), RunDir.open(Summary.of(s).run_dir)
        except (UserError, OSError, TypeError):
            continue
        learn_from_check(rb, summaries[0], ro, s, row)


def _learn_from_pairs(pairs: list[tuple[dict, dict]]) -> list[dict]:
    """Every pair of runs (baseline, other) of one path teaches the machine what it measures
    (agent.host.machine_costs.learn_from_pair): the rest of a path without one of its hops, or the CPU per
    transaction at another client count; after the predictions, which were made with what the machine knew when
    the runs began. What each pair taught, or why nothing (a user who expected the next prediction to know)."""
    from pathprof.agent.host.machine_costs import learn_from_pair
    from pathprof.analysis.run_model import Summary
    from pathprof.analysis.rundir import RunDir
    lessons: list = []
    for b, o in pairs:
        try:
            rb, ro = RunDir.open(Summary.of(b).run_dir), RunDir.open(Summary.of(o).run_dir)
        except (UserError, OSError, TypeError):
            continue
        learn_from_pair(rb, b, ro, o, lessons=lessons)
    return [x.as_dict() for x in lessons]


def parse_clients(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--clients '{text}' is not a comma-separated list of numbers, e.g. 1,4,16") from None
    if not values or any(v <= 0 for v in values):
        raise UserError(f"--clients '{text}' needs positive client counts, e.g. 1,4,16")
    return sorted(set(values))


def sweep(a) -> int:
    from pathprof.analysis.run_model import Summary
    from pathprof.analysis.sweep import sweep_analysis
    from pathprof.topologies import spec
    counts = parse_clients(a.clients)
    spec.load(a.topology, cli_args.topo_options(a), a.link)
    repeat = getattr(a, "repeat", 1) or 1
    runs: dict[int, list[dict]] = {c: [] for c in counts}
    n = 0
    for k in range(repeat):    # interleaved, like compare: drift hits every client count alike
        for c in counts:
            n += 1
            runs[c].append(_one_run(a, a.topology, c, f"{a.topology}: {c} clients ({n}/{len(counts) * repeat})"))
    summaries = [_median_run(runs[c]) for c in counts]
    analysis = sweep_analysis(summaries)
    predictions = predictions_from_first(summaries)
    for p, pred in zip(analysis["points"][1:], predictions):
        p["predicted_from_first"] = pred
    _learn_from_checks(summaries, predictions)
    lessons = _learn_from_pairs([(b, o) for c0, c1 in zip(counts, counts[1:]) for b, o in zip(runs[c0], runs[c1])])
    if repeat > 1:
        for p in analysis["points"]:
            tps = [Summary.of(r).tps or 0.0 for r in runs.get(p["clients"], [])]
            p.update(tps_min=min(tps), tps_max=max(tps), tps_runs=tps)
    if a.html:
        from pathprof.analysis.report.html import write_html
        write_html(summaries, Path(a.html), sweep=analysis)
    if a.json:
        _out_json({"runs": summaries, "sweep": analysis, "lessons": lessons})
    else:
        from pathprof.analysis.report.render import lessons_view, sweep_view
        _print(sweep_view(analysis))
        _print(lessons_view(lessons))
    return 0


def diff(a) -> int:
    from pathprof.analysis.explain import explain
    from pathprof.analysis.host_diff import host_differences
    from pathprof.analysis.rundir import RunDir
    sa, sb = RunDir.open(a.run_a).summary(), RunDir.open(a.run_b).summary()
    expl = explain(sa, sb)
    hosts = host_differences(sa, sb)
    if a.json:
        _out_json({"runs": [sa.doc, sb.doc], "baseline": sa.run_dir, "host_differences": hosts,
                   "explanations": [expl]})
    else:
        from pathprof.analysis.report.render import diff_view
        _print(diff_view(sa, sb, expl, hosts))
    return 0


def export(a) -> int:
    from pathprof.analysis.export import files as ex
    from pathprof.analysis.rundir import RunDir
    rd = RunDir.open(a.run)
    if a.format == "openmetrics":
        return _export_openmetrics(rd, a.output)
    if a.format == "otlp":
        return _export_otlp(rd, getattr(a, "endpoint", None), a.output, getattr(a, "protocol", None))
    if getattr(a, "protocol", None):
        raise UserError("--protocol is for --format otlp")
    if getattr(a, "endpoint", None):
        raise UserError("--endpoint is for --format otlp")
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


def _export_openmetrics(rd, output: str | None) -> int:
    from pathprof.analysis.client import client_of
    from pathprof.analysis.export.openmetrics import render, stage_histograms
    run_id = rd.run.run_id or rd.path.name
    summary = {**rd.summary().doc, "run_id": run_id}
    text = render([summary], {run_id: stage_histograms(rd.read_frame("stages.parquet"), client_of(rd.run))})
    if output:
        Path(output).write_text(text)
        print(output)
    else:
        sys.stdout.write(text)
    return 0


def _export_otlp(rd, endpoint: str | None, output: str | None, protocol: str | None) -> int:
    from pathprof.analysis.export import otlp, otlp_send
    if protocol and not endpoint:
        raise UserError("--protocol is for sending to --endpoint (-o writes the OTLP/HTTP request body)")
    built = otlp.build_from_run(rd)
    what = (f"{built.traces} traces ({built.complete} complete transactions), {len(built.spans)} spans; "
            f"{built.wire_ids} trace ids from the wire")
    if endpoint:
        n = otlp_send.send(built.spans, endpoint, protocol=protocol or "http")
        to = (f"over OTLP/gRPC to {endpoint.rstrip('/')}" if protocol == "grpc"
              else f"to {otlp_send.traces_url(endpoint)}")
        print(f"pathprof: sent {what} {to} in {n} request(s)", file=sys.stderr)
    if output or not endpoint:
        out = Path(output or rd.path / "trace.otlp.pb")
        size = otlp_send.write(built.spans, out)
        print(f"pathprof: wrote {what} ({size} bytes)", file=sys.stderr)
        print(out)
    return 0
