"""pathprof's command line. Each subcommand is a small function; rendering lives in analysis.report.render."""
from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

from pathprof.agent.cli import args as cli_args
from pathprof.errors import UserError


def _print_json(doc) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")


def cmd_run(a) -> int:
    from pathprof.agent.cli.console import make_reporter
    from pathprof.agent.run import owned as runmod
    opts = cli_args.run_options(a, a.topology)
    from pathprof.agent.cli.metrics_live import serving
    labels = {"topology": getattr(opts, "topology", None) or a.topology, "clients": opts.workload.clients,
              "run_id": "live"}
    with make_reporter(a, opts.workload.duration_s) as ui, serving(a.metrics_port, ui, labels) as ui:
        rd = runmod.execute(opts, ui)
    return _print_summary(a, rd)


def cmd_attach(a) -> int:
    from pathprof.agent.cli.console import make_reporter
    from pathprof.agent.run.attach import AttachOptions, execute_attach
    opts = AttachOptions(port=a.port, server_pid=a.server_pid, dsn=a.dsn, duration_s=a.duration, probes=a.probes,
                         trace_sample=a.trace_sample, runs_dir=Path(a.runs_dir), netns=a.netns, remote=a.remote,
                         host_name=a.host_name, start_at=a.start_at)
    from pathprof.agent.cli.metrics_live import serving
    with make_reporter(a, opts.duration_s) as ui, serving(a.metrics_port, ui, {"topology": "attached",
                                                                            "run_id": "live"}) as ui:
        rd = execute_attach(opts, ui)
    return _print_summary(a, rd)


def _print_summary(a, rd) -> int:
    """A finished run's report on stdout: the JSON document with --json, else the terminal view."""
    from pathprof.agent.host.machine_costs import learn_from_run
    summary = rd.summary()
    learn_from_run(rd, summary.doc)      # what this run showed of the machine, for later predictions
    if a.json:
        _print_json(summary.doc)
    else:
        from pathprof.agent.cli.console import print_report
        print_report(summary)
    return 0


def cmd_report(a) -> int:
    from pathprof.analysis.rundir import RunDir
    rundirs = [RunDir.open(p) for p in a.runs]
    summaries = [rd.summary() for rd in rundirs]
    docs = [s.doc for s in summaries]
    if a.html:
        from pathprof.analysis.report.html import write_html
        path = write_html(docs, Path(a.html), latency_samples=latency_samples(rundirs, summaries))
        print(f"wrote {path}", file=sys.stderr)
    if a.json:
        _print_json(docs[0] if len(docs) == 1 else {"runs": docs})
    elif not a.html:
        from pathprof.agent.cli.console import print_report
        for s in summaries:
            print_report(s)
    return 0


def latency_samples(rundirs, summaries, limit: int = 20000) -> dict[str, list[float]]:
    """Per-run pgbench latencies (ms), subsampled, for the HTML report's CDF."""
    from pathprof.agent.postgres.pgbench import iter_log_chunks
    from pathprof.analysis.explain import run_label
    out = {}
    for rd, s in zip(rundirs, summaries):
        kept = []                 # a bounded sample of every chunk, so a long run's log is never held whole
        for chunk in iter_log_chunks(rd.path / "pgbench" / "log"):
            lat = chunk["latency_us"]
            kept.append(lat.sample(limit, random_state=0) if len(lat) > limit else lat)
        if kept:
            import pandas as pd
            lat = pd.concat(kept, ignore_index=True)
            lat = lat.sample(limit, random_state=0) if len(lat) > limit else lat
            out[run_label(s)] = (lat / 1000.0).tolist()
    return out


def cmd_doctor(a) -> int:
    from pathprof.agent.probing import doctor
    caps = doctor.check_capabilities()
    if a.json:
        _print_json({"capabilities": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in caps]})
    else:
        print(doctor.render_capabilities(caps))
    missing = [c for c in caps if c.required and not c.ok]
    return 1 if missing else 0


def cmd_topology(a) -> int:
    from pathprof.topologies import spec
    if a.action == "list":
        rows = []
        for name in spec.builtin_names():
            t = spec.load(name)
            rows.append({"name": name, "description": t.description, "options": t.options})
        if a.json:
            _print_json({"topologies": rows})
        else:
            width = max(len(r["name"]) for r in rows)
            for r in rows:
                opts = "  [" + ", ".join(f"{k}={v}" for k, v in r["options"].items()) + "]" if r["options"] else ""
                print(f"{r['name']:<{width}}  {r['description']}{opts}")
        return 0
    if not a.name:
        raise UserError(f"pathprof topology {a.action} needs a topology NAME (see `pathprof topology list`)")
    if a.action == "show":
        if a.name in spec.builtin_names():
            sys.stdout.write(spec.builtin_text(a.name))
        else:
            t = spec.load(a.name)
            if a.json:
                _print_json(t.to_dict())
            else:
                sys.stdout.write(t.text)
        return 0
    from pathprof.agent.cli import topology_cmd
    return topology_cmd.up(a) if a.action == "up" else topology_cmd.down(a)


def cmd_cleanup(a) -> int:
    from pathprof.agent.host import cleanup
    report = cleanup.cleanup_all(dry_run=a.dry_run)
    if a.json:
        _print_json(report)
    else:
        for line in report["actions"] or ["nothing to clean up"]:
            print(line)
        for line in report["kept"]:
            print(line)
        for line in report["problems"]:
            print(f"could not remove: {line}", file=sys.stderr)
    return 1 if report["problems"] else 0


def cmd_compare(a) -> int:
    from pathprof.agent.cli import multi
    return multi.compare(a)


def cmd_sweep(a) -> int:
    from pathprof.agent.cli import multi
    return multi.sweep(a)


def cmd_diff(a) -> int:
    from pathprof.agent.cli import multi
    return multi.diff(a)


def cmd_predict(a) -> int:
    from pathprof.agent.cli.predict_cmd import cmd_predict as run
    return run(a)


def cmd_export(a) -> int:
    from pathprof.agent.cli import multi
    return multi.export(a)


def cmd_merge(a) -> int:
    from pathprof.agent.cli.merge_cmd import cmd_merge as run
    return run(a)


COMMANDS = {"merge": cmd_merge,
            "run": cmd_run, "attach": cmd_attach, "report": cmd_report, "doctor": cmd_doctor, "topology": cmd_topology,
            "cleanup": cmd_cleanup, "compare": cmd_compare, "sweep": cmd_sweep, "diff": cmd_diff,
            "export": cmd_export, "predict": cmd_predict}


def _quiet_loop_finalizers(unraisable) -> None:
    """An asyncio loop that a Ctrl-C interrupted inside pyroute2 can fail to close when it is garbage
    collected at exit ("Exception ignored in BaseEventLoop.__del__"): teardown has run by then, and that
    traceback would only alarm. Everything else unraisable is reported as usual."""
    if getattr(unraisable.object, "__qualname__", "") == "BaseEventLoop.__del__":
        return
    sys.__unraisablehook__(unraisable)


def _hide_dsn_secret(a) -> None:
    """A password given in --dsn was on our own command line, where every user of the machine reads it in `ps`:
    show the command with the secret as *** from here on (as psql and mysql do), and hand it to children through
    their environment only (agent.postgres.conninfo)."""
    dsn = getattr(a, "dsn", None)
    if not dsn:
        return
    from pathprof.agent.postgres.conninfo import redact, split_secret
    if not split_secret(dsn)[1]:
        return
    import setproctitle
    shown = [redact(x) if x == dsn else x for x in sys.argv]
    setproctitle.setproctitle(" ".join(shown))


def main(argv: list[str] | None = None) -> int:
    sys.unraisablehook = _quiet_loop_finalizers
    parser = cli_args.build_parser()
    a = parser.parse_args(argv)
    if not a.command:
        parser.print_help()
        return 2
    try:
        _hide_dsn_secret(a)
        return COMMANDS[a.command](a)
    except UserError as e:
        print(f"pathprof: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("pathprof: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:         # `pathprof report RUN | head`: the reader left; an OSError, so caught first
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # the exit's flush must not fail again
        return 1
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            raise                   # anything else is a bug and keeps its traceback
        where = getattr(e, "filename2", None) or getattr(e, "filename", None)
        where = where or (f"under the runs directory {a.runs_dir}" if getattr(a, "runs_dir", None) else "a file")
        print(f"pathprof: error: cannot write {where}: {e.strerror}; the path was torn down, and what was "
              "recorded before that is kept (free space, or pick another --runs-dir)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
