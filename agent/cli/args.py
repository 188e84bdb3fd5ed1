"""Argument parsing for the pathprof CLI: help that reads like a man page, options shared by run/compare/sweep."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from pathprof.agent.probing.windows import DEFAULT_PERIOD_S, DEFAULT_WINDOW_S
from pathprof.errors import UserError

DESCRIPTION = """\
pathprof builds a PostgreSQL connection path for real (unix socket, loopback, a veth wire, a docker bridge with
DNAT and docker-proxy, a pooler, a qemu guest), drives pgbench through it, and uses eBPF to split every
transaction's latency and CPU cost across the pieces of the path: netfilter, the scheduler, each hop process and
the backend. The latency view and the CPU view each close against what pgbench and the CPUs measured.
"""

EPILOG = """\
examples:
  pathprof doctor                                   what this kernel lets pathprof measure
  pathprof run --topology docker-dnat --clients 16  profile a path, with a live view
  pathprof report runs/20261121-120000-loopback     the same report again, offline
  pathprof compare unix loopback docker-dnat --clients 16
  pathprof diff runs/A runs/B                       explain the gap between two recorded runs
  pathprof predict runs/A --clients 1,16,64         what TPS would be with other clients, from one run
  pathprof topology list                            the built-in paths
  pathprof cleanup                                  remove what a killed run left behind

Every reporting command takes --json and then prints one JSON document on stdout and nothing else there.
Runs need root. Objects pathprof creates are named pp-* and journaled in /var/lib/pathprof/journal.
"""

RUN_EPILOG = """\
stages and components (see README for the full list):
  latency view   per transaction, by leg: request (client -> server), server, response
  CPU view       per transaction, by component: pgbench, backend, each hop, kernel, softirq, netfilter

examples:
  pathprof run --topology loopback --clients 16 --duration 10
  pathprof run --topology unix --clients 1 --connect --mode extended
  pathprof run --topology docker-dnat --userland-proxy off --target published-host
  pathprof run --topology ./my-path.toml --pg-set shared_buffers=256MB --script tpcb-like --scale 10
  pathprof run --dsn 'host=127.0.0.1 port=5432 user=postgres' --probes off
"""


def _whole_number(text: str) -> int:
    """0, 1, 2, ..."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"'{text}' is negative")
    return n


def _positive_int(text: str) -> int:
    """1, 2, ... (a count of clients, threads, ...: 0 is refused here, not deep inside pgbench)"""
    n = _whole_number(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"'{text}' must be at least 1")
    return n


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None


def add_workload_options(p: argparse.ArgumentParser, clients_default: int | None = 16) -> None:
    """The options every command that drives pgbench shares: the workload, the server and path, the probes."""
    _add_pgbench_options(p, clients_default)
    _add_path_options(p)
    _add_probe_options(p)


def _add_pgbench_options(p: argparse.ArgumentParser, clients_default: int | None) -> None:
    g = p.add_argument_group("workload (pgbench)")
    if clients_default is not None:
        g.add_argument("-c", "--clients", type=_positive_int, default=clients_default, metavar="N",
                       help="concurrent connections (default: %(default)s)")
    g.add_argument("-j", "--threads", type=_positive_int, metavar="N",
                   help="pgbench worker threads (default: min(clients, CPUs))")
    g.add_argument("-T", "--duration", type=_positive_int, default=10, metavar="SECONDS",
                   help="measured duration per run (default: %(default)s)")
    g.add_argument("-M", "--mode", choices=["simple", "extended", "prepared"], default="prepared",
                   help="query protocol (default: %(default)s, as the reference measurements)")
    g.add_argument("-C", "--connect", action="store_true",
                   help="open a new connection for every transaction (pgbench -C); adds the connection-setup split")
    g.add_argument("--script", default="select1", metavar="NAME|@FILE",
                   help="select1 (default), tpcb-like, simple-update, select-only, tpcc (TPC-C-like: five "
                        "transaction types in the standard mix, --scale = warehouses), or @FILE for your own script")
    g.add_argument("-s", "--scale", type=_positive_int, default=1, metavar="N",
                   help="pgbench scale factor for scripts that use its tables; warehouses for tpcc "
                        "(default: %(default)s)")
    g.add_argument("-R", "--rate", type=_number, metavar="TPS", help="throttle to this many transactions per second")


def _add_path_options(p: argparse.ArgumentParser) -> None:
    s = p.add_argument_group("server and path")
    s.add_argument("--pg-set", action="append", default=[], metavar="KEY=VALUE",
                   help="a postgresql.conf setting for the owned server (repeatable), e.g. fsync=off")
    s.add_argument("--wal-device", type=_whole_number, default=0, metavar="MB",
                   help="put the owned server's WAL on a block device of its own: a loop device of this size over "
                        "a file in the run's state directory (0, the default: with the data)")
    s.add_argument("--wal-device-limit", metavar="KEY=N[,...]",
                   help="make that WAL device slow: the kernel's block I/O throttle (a pp- cgroup holding the "
                        "server) on it, KEY one of riops, wiops (requests/s), rbps, wbps (bytes/s, K/M/G), e.g. "
                        "wiops=200; each commit's write and cache flush then wait their turn, inside "
                        "backend.wal_flush (needs --wal-device)")
    s.add_argument("--cpu-quota", metavar="WHO=Q/P[,...]",
                   help="cap a process of the path with a CPU quota, as a Kubernetes CPU limit, systemd CPUQuota= "
                        "or docker --cpus do: a pp- cgroup allowing Q ms of CPU every P ms (CFS bandwidth control), "
                        "WHO server (the owned postmaster and its backends), client (pgbench) or hop (the path's "
                        "pooler or proxy processes), e.g. server=25/100; the waits it causes are "
                        "throttled.<process>, checked against the cgroup's own cpu.stat. Quotas a run's "
                        "processes already have are found and reported without it")
    s.add_argument("--userland-proxy", choices=["on", "off"],
                   help="docker topologies: carry published ports with docker-proxy (on, dockerd's default) or "
                        "hairpin NAT only (off)")
    s.add_argument("--target", metavar="NAME",
                   help="what pgbench connects to, when the topology offers several (e.g. docker-dnat: "
                        "published-localhost, published-host, container)")
    s.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="set any option a topology spec declares in its [options] table")
    s.add_argument("--link", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                   help="impair a link (repeatable): NAME is a link's name (both directions) or one end's interface "
                        "(its egress only); keys delay_us, jitter_us, loss_pct, rate_mbit, and rtt_us (link names: "
                        "delay_us = rtt_us/2 each way). E.g. --link wire:delay_us=250,jitter_us=20 or --link "
                        "pp-nic-c:delay_us=200 (request leg only); in compare entries nic:link=wire:delay_us=250. "
                        "Delays show as the stage delay.<device> (pathprof's NFQUEUE delay line: this kernel has no "
                        "netem), rate limits as qdisc.<device> (tbf)")


def _add_probe_options(p: argparse.ArgumentParser) -> None:
    pr = p.add_argument_group("probes and output")
    pr.add_argument("--probes", choices=["off", "basic", "deep"], default="basic",
                    help="off: pgbench only; basic: scheduler, syscalls, netfilter, devices (default); "
                         "deep: + PostgreSQL USDT (parse/plan/execute, locks, WAL)")
    pr.add_argument("--trace-sample", type=_whole_number, default=0, metavar="N",
                    help="inside measurement windows, record 1 in N messages of each connection as spans "
                         "(traces.parquet) for `pathprof export`")
    pr.add_argument("--probe-window", type=_number, default=DEFAULT_WINDOW_S, metavar="SECONDS",
                    help="attach the detailed probes for this long... (default: %(default)s)")
    pr.add_argument("--probe-period", type=_number, default=DEFAULT_PERIOD_S, metavar="SECONDS",
                    help="...once every this long, fully detached in between: the run reports TPS in vs out of the "
                         "windows and checks its model of the unprobed system against the TPS outside them "
                         "(default: %(default)s)")
    pr.add_argument("--probe-lo-device", action="store_true",
                    help="time the loopback device as a stage of its own (dev.lo). Off by default: lo's share of "
                         "the wire (~0.5 us per message here) stays inside wire.<receiver>, and two BPF programs "
                         "per packet on lo are not run; devices other than lo (veth, bridge, tap) are always timed")
    pr.add_argument("--probe-duty", type=_number, metavar="PCT",
                    help="share of the run the detailed probes are attached, instead of --probe-period "
                         "(period = window * 100 / PCT); 100 = always on, every transaction measured")
    pr.add_argument("--status-every", type=_number, default=10.0, metavar="SECONDS",
                    help="while pgbench runs, rewrite <run dir>/status.json this often: pathprof's own memory, "
                         "its BPF maps' entries and memory, lost/unpaired events so far (0: off; default: "
                         "%(default)s)")
    pr.add_argument("--runs-dir", default=os.environ.get("PATHPROF_RUNS", "runs"), metavar="DIR",
                    help="where run directories are written (default: ./runs or $PATHPROF_RUNS)")
    pr.add_argument("--json", action="store_true", help="print one JSON document on stdout, progress on stderr")
    pr.add_argument("--no-live", action="store_true", help="plain progress lines instead of the live view")


class ArgumentParser(argparse.ArgumentParser):
    """Bad arguments read like every other user error: one `pathprof: error:` line naming the command, and
    where to look (the usage block is one --help away), exit 2."""

    def error(self, message: str):
        self.exit(2, f"pathprof: error: {self.prog}: {message} (see {self.prog} --help)\n")


ATTACH_EPILOG = """examples:
  pathprof attach --port 5432 --duration 30          # whatever talks to the server on port 5432
  pathprof attach --port 6432                         # a pgbouncer's port: the pooler is a hop of the path
  pathprof attach --server-pid $(head -1 $PGDATA/postmaster.pid)
  pathprof attach --dsn 'host=127.0.0.1 port=49155 user=postgres'   # through Docker's published port

The report has the same latency and CPU views as a driven run; TPS is exchanges per second as the probes
counted them. Clients on other machines are counted (their connections) but their side is not measured.

several machines (one agent per host, then `pathprof merge`):
  server$ pathprof attach --port 5432 --trace-sample 2 -T 30
  client$ pathprof attach --remote 198.18.0.2:5432 --trace-sample 2 -T 30
  pathprof merge RUN_OF_CLIENT RUN_OF_SERVER -o merged
--trace-sample also records a marker per sampled TCP message at each host's edge (messages.parquet): merge
needs it to join the hosts and to estimate their clock offset. Hosts that are network namespaces on one kernel
are each attached with --netns NAME (the namespace then stands for the whole machine).
"""


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    p = ArgumentParser(prog="pathprof", description=DESCRIPTION, epilog=EPILOG, formatter_class=fmt)
    import pathprof
    p.add_argument("--version", action="version", version=f"pathprof {pathprof.__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    _add_run(sub, fmt)
    _add_attach(sub, fmt)
    from pathprof.agent.cli import merge_cmd
    merge_cmd.add_parser(sub, fmt)
    _add_report(sub, fmt)
    _add_compare(sub, fmt)
    _add_sweep(sub, fmt)
    _add_diff(sub, fmt)
    _add_export(sub, fmt)
    from pathprof.agent.cli.predict_cmd import add_parser as add_predict
    add_predict(sub, fmt)
    _add_doctor(sub, fmt)
    _add_topology(sub, fmt)
    _add_cleanup(sub, fmt)
    return p


def _add_run(sub, fmt) -> None:
    r = sub.add_parser("run", help="profile one path", formatter_class=fmt, epilog=RUN_EPILOG,
                       description="Build a path, start pathprof's own PostgreSQL in it, attach the probes, drive "
                                   "pgbench through it, record a run directory, tear everything down, and "
                                   "print the latency and CPU views.")
    r.add_argument("-t", "--topology", default="loopback", metavar="NAME|FILE",
                   help="a built-in path (pathprof topology list) or a .toml spec file (default: %(default)s)")
    r.add_argument("--dsn", metavar="CONNINFO", help="profile an existing server instead: no path is built, "
                                                     "no server started")
    r.add_argument("--netns", metavar="NAME",
                   help="with --dsn: run pgbench (and pathprof's own connection) inside this network namespace, "
                        "standing for the client's machine: the server is on another \"host\", whose own agent "
                        "(attach --netns) records its side for `pathprof merge`")
    r.add_argument("--host-name", metavar="NAME",
                   help="with --dsn: this host's name in merged runs (default: the --netns name, else the machine's "
                        "hostname)")
    r.add_argument("--start-at", type=float, metavar="UNIX_TIME",
                   help="with --dsn: start pgbench at this wall-clock time (seconds since the epoch, e.g. `date -d "
                        "+5sec +%%s`), the probes loaded and waiting, so that this host records the same interval "
                        "as the other hosts' agents given the same time (attach --start-at)")
    add_workload_options(r)
    add_metrics_port(r)


def _add_attach(sub, fmt) -> None:
    at = sub.add_parser("attach", help="profile traffic already flowing to a local server (no pgbench)",
                        formatter_class=fmt, epilog=ATTACH_EPILOG,
                        description="Find the path to a PostgreSQL server on this machine (the server, every hop "
                                    "in front of it such as docker-proxy, pgbouncer, pgpool or socat, in any "
                                    "network namespace, and the clients connected now), follow all of them with "
                                    "the probes for --duration, and record a run directory like `run` does. A "
                                    "transaction is one request/response exchange on a client connection. Nothing "
                                    "is changed on the server or the system: no restart, extension, setting, "
                                    "namespace or rule.")
    target = at.add_mutually_exclusive_group(required=True)
    target.add_argument("--port", type=_positive_int, metavar="N",
                        help="the TCP port clients connect to (the server's, or a proxy's/pooler's in front of it)")
    target.add_argument("--server-pid", type=_positive_int, metavar="PID",
                        help="the postmaster (or any of its processes)")
    target.add_argument("--dsn", metavar="CONNINFO", help="connect as a client would and follow that connection")
    target.add_argument("--remote", metavar="ADDR:PORT",
                        help="the server is on another machine: profile this machine's clients connected to ADDR:PORT "
                             "(the address they dialled); that machine's own `attach` records the server's side, and "
                             "`pathprof merge` joins the two")
    at.add_argument("--netns", metavar="NAME",
                    help="see only this network namespace, as if it were the whole machine (one agent per \"host\" "
                         "when hosts are namespaces on one kernel): processes and sockets elsewhere are not followed, "
                         "and connections to them are recorded as leaving the machine (run.json scope)")
    at.add_argument("--host-name", metavar="NAME",
                    help="this host's name in merged runs (default: the --netns name, else the machine's hostname)")
    at.add_argument("-T", "--duration", type=float, default=10.0, metavar="S",
                    help="seconds to watch (default: %(default)s)")
    at.add_argument("--start-at", type=float, metavar="UNIX_TIME",
                    help="begin the interval at this wall-clock time (seconds since the epoch, e.g. `date -d +5sec "
                         "+%%s`), the probes loaded and waiting: every host's agent given the same time records the "
                         "same interval, which `pathprof merge` needs (default: as soon as the probes are loaded)")
    at.add_argument("--probes", choices=["basic", "deep"], default="basic",
                    help="basic: network, scheduler, CPU; deep: + PostgreSQL USDT (parse/plan/execute, locks, WAL, "
                         "I/O) (default: %(default)s)")
    at.add_argument("--trace-sample", type=_whole_number, default=0, metavar="N",
                    help="also record every N-th exchange's spans (for the waterfall and Perfetto export)")
    at.add_argument("--runs-dir", default=os.environ.get("PATHPROF_RUNS", "runs"), metavar="DIR",
                    help="where the run directory is written (default: %(default)s, or $PATHPROF_RUNS)")
    at.add_argument("--json", action="store_true", help="print one JSON document on stdout, progress on stderr")
    at.add_argument("--no-live", action="store_true", help="plain progress lines instead of the live view")
    add_metrics_port(at)


def _add_report(sub, fmt) -> None:
    rep = sub.add_parser("report", help="report on recorded runs", formatter_class=fmt,
                         description="Print the latency and CPU views of one or more run directories, or write "
                                     "a self-contained HTML report with figures.")
    rep.add_argument("runs", nargs="+", metavar="RUN_DIR")
    rep.add_argument("--html", metavar="FILE", help="write an HTML report (PNG figures are written next to it)")
    rep.add_argument("--json", action="store_true")


def _add_compare(sub, fmt) -> None:
    c = sub.add_parser("compare", help="run several topologies or variants and explain their gaps",
                       formatter_class=fmt,
                       description="Run the same workload on each entry (interleaved when --repeat > 1) and explain "
                                   "each one's TPS gap against the first. An entry is a topology, optionally with "
                                   "settings of its own: TOPOLOGY[:KEY=VALUE]..., where KEY is any `pathprof run` "
                                   "option without its dashes.",
                       epilog="examples:\n"
                              "  pathprof compare unix loopback docker-bridge docker-dnat pgpool --clients 16\n"
                              "  pathprof compare docker-dnat:userland-proxy=on docker-dnat:userland-proxy=off\n"
                              "  pathprof compare unix:clients=16 unix:clients=96 --repeat 3\n"
                              "  pathprof compare loopback loopback:pg-set=fsync=off --script tpcb-like\n")
    c.add_argument("topologies", nargs="+", metavar="ENTRY", help="TOPOLOGY[:KEY=VALUE]... (the first is the baseline)")
    c.add_argument("--repeat", type=_positive_int, default=1, metavar="K",
                   help="run each topology K times, interleaved, and report the spread")
    c.add_argument("--html", metavar="FILE", help="also write an HTML report")
    add_workload_options(c)


def _add_sweep(sub, fmt) -> None:
    sw = sub.add_parser("sweep", help="TPS and stages across client counts", formatter_class=fmt,
                        description="Run one topology at several client counts; find where throughput stops "
                                    "growing and which stage grows with it.")
    sw.add_argument("-t", "--topology", default="loopback", metavar="NAME|FILE")
    sw.add_argument("--clients", default="1,4,16", metavar="N,N,...", help="client counts (default: %(default)s)")
    sw.add_argument("--repeat", type=_positive_int, default=1, metavar="K",
                    help="run each client count K times, interleaved; report the median run and the spread")
    sw.add_argument("--html", metavar="FILE")
    add_workload_options(sw, clients_default=None)


def _add_diff(sub, fmt) -> None:
    d = sub.add_parser("diff", help="explain the gap between two recorded runs", formatter_class=fmt,
                       description="Explain run B against run A, offline; machine and kernel differences first.")
    d.add_argument("run_a", metavar="RUN_A")
    d.add_argument("run_b", metavar="RUN_B")
    d.add_argument("--json", action="store_true")


def _add_export(sub, fmt) -> None:
    e = sub.add_parser("export", help="export traces or stage tables", formatter_class=fmt,
                       description="perfetto: Chrome trace-event JSON for ui.perfetto.dev (needs a run made with "
                                   "--trace-sample); csv/parquet: the stage and CPU tables; openmetrics: the run's "
                                   "figures as Prometheus/OpenMetrics text (to stdout unless -o); otlp: each "
                                   "sampled transaction (--trace-sample) as an OpenTelemetry trace, sent to "
                                   "--endpoint over OTLP/HTTP or OTLP/gRPC (--protocol) or written with -o as the "
                                   "request body.")
    e.add_argument("run", metavar="RUN_DIR")
    e.add_argument("--format", choices=["perfetto", "csv", "parquet", "openmetrics", "otlp"], default="perfetto",
                   help="openmetrics: TPS, latency, stages and CPU per transaction and stage histograms in the "
                        "Prometheus/OpenMetrics text format; otlp: one trace per sampled transaction, a span per "
                        "stage, trace ids that agents on other hosts derive alike (default: %(default)s)")
    e.add_argument("--endpoint", metavar="URL",
                   help="otlp: an OTLP/HTTP receiver, e.g. http://127.0.0.1:4318 (/v1/traces is added to a bare "
                        "URL), or with --protocol grpc an OTLP/gRPC one, e.g. http://127.0.0.1:4317 (https:// for "
                        "TLS); without it the request body is written to -o (default: trace.otlp.pb in the run dir)")
    e.add_argument("--protocol", choices=["http", "grpc"],
                   help="otlp with --endpoint: OTLP/HTTP (protobuf; the default) or OTLP/gRPC")
    e.add_argument("-o", "--output", metavar="PATH", help="output file or directory (default: inside the run dir); "
                   "otlp: FILE.json for OTLP/JSON, any other name for protobuf")


def _add_doctor(sub, fmt) -> None:
    doc = sub.add_parser("doctor", help="check what this machine lets pathprof measure", formatter_class=fmt,
                         description="Probe each kernel capability pathprof uses (BTF, tracepoints, uprobes/USDT, "
                                     "netfilter links, ...) and print a table. Exits 1 if a required one is missing.")
    doc.add_argument("--json", action="store_true")


def _add_topology(sub, fmt) -> None:
    t = sub.add_parser("topology", help="list, show, build or remove topologies", formatter_class=fmt,
                       description="list: built-in paths; show NAME: print a spec to copy and edit; up NAME: "
                                   "build it and leave it up (no server); down NAME: remove what up built.")
    t.add_argument("action", choices=["list", "show", "up", "down"])
    t.add_argument("name", nargs="?", metavar="NAME|FILE")
    t.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    t.add_argument("--link", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                   help="up: impair a link, as with `pathprof run --link` (delay lines stay until down)")
    t.add_argument("--json", action="store_true")


def _add_cleanup(sub, fmt) -> None:
    cl = sub.add_parser("cleanup", help="remove what a killed run left behind", formatter_class=fmt,
                        description="Replay every journal a killed run left in /var/lib/pathprof/journal, then "
                                    "remove any remaining pp- namespaces, links and PP- iptables chains. Runs still "
                                    "going on (their pathprof process is alive) and paths brought up with `topology "
                                    "up` are left alone, with everything their journals name.")
    cl.add_argument("--dry-run", action="store_true", help="say what would be removed")
    cl.add_argument("--json", action="store_true")


def _port(text: str) -> int:
    n = _whole_number(text)
    if n > 65535:
        raise argparse.ArgumentTypeError(f"'{text}' is not a TCP port (0-65535)")
    return n


def add_metrics_port(p: argparse.ArgumentParser) -> None:
    """--metrics-port for commands that drive a live run (run, attach): see agent/cli/metrics_live.py."""
    p.add_argument("--metrics-port", type=_port, metavar="PORT",
                   help="serve the live figures (TPS, latency, stages and CPU per transaction) at "
                        "http://127.0.0.1:PORT/metrics in the OpenMetrics format for a Prometheus scrape, "
                        "while the run goes on (0: any free port, printed on stderr)")


def parse_kv(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items or []:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise UserError(f"{flag} '{item}' is not KEY=VALUE")
        out[k.strip()] = v.strip()
    return out


def topo_options(a) -> dict[str, str]:
    opts = parse_kv(getattr(a, "option", []), "--option")
    if getattr(a, "userland_proxy", None):
        opts["userland_proxy"] = a.userland_proxy
    if getattr(a, "target", None):
        opts["target"] = a.target
    return opts


def probe_period(a) -> float:
    """--probe-period, or the one --probe-duty implies (100 % = always on, period 0)."""
    duty, window = getattr(a, "probe_duty", None), getattr(a, "probe_window", DEFAULT_WINDOW_S)
    if duty is None:
        return getattr(a, "probe_period", DEFAULT_PERIOD_S)
    if not 0 < duty <= 100:
        from pathprof.errors import UserError
        raise UserError(f"--probe-duty must be a percentage in (0, 100], not {duty:g}")
    return 0.0 if duty >= 100 or window <= 0 else window * 100.0 / duty


def _wal_limit(a) -> dict[str, int]:
    text = getattr(a, "wal_device_limit", None)
    if not text:
        return {}
    from pathprof.agent.host.io_limit import parse_limits
    if not getattr(a, "wal_device", 0):
        raise UserError("--wal-device-limit needs --wal-device MB (the limit applies to the WAL's own device)")
    return parse_limits(text)


def _cpu_quota(a) -> dict:
    text = getattr(a, "cpu_quota", None)
    if not text:
        return {}
    from pathprof.agent.host.cpu_quota import check_available, parse
    if getattr(a, "dsn", None):
        raise UserError("--cpu-quota caps a process pathprof started: it goes with a built path, not --dsn")
    quotas = parse(text)
    check_available()
    return quotas


def run_options(a, topology: str, clients: int | None = None):
    from pathprof.agent.postgres.pgbench import Workload
    from pathprof.agent.postgres.server import parse_pg_set
    from pathprof.agent.run.options import RunOptions
    if getattr(a, "status_every", 0) < 0:
        from pathprof.errors import UserError
        raise UserError(f"--status-every must be 0 (off) or a number of seconds, not {a.status_every:g}")
    w = Workload(clients=clients if clients is not None else a.clients, threads=a.threads, duration_s=a.duration,
                 mode=a.mode, script=a.script, connect=a.connect, scale=a.scale, rate=a.rate)
    return RunOptions(topology=topology, workload=w, pg_settings=parse_pg_set(a.pg_set),
                      dsn=getattr(a, "dsn", None), probes=a.probes, runs_dir=Path(a.runs_dir),
                      topo_options=topo_options(a), links=list(getattr(a, "link", []) or []),
                      trace_sample=a.trace_sample,
                      wal_device_mb=getattr(a, "wal_device", 0) or 0,
                      wal_device_limit=_wal_limit(a),
                      cpu_quota=_cpu_quota(a),
                      probe_window_s=a.probe_window, probe_period_s=probe_period(a),
                      status_every_s=getattr(a, "status_every", 10.0),
                      probe_lo_device=getattr(a, "probe_lo_device", False),
                      netns=_dsn_only(a, "netns"), host_name=_dsn_only(a, "host_name"),
                      start_at=_dsn_only(a, "start_at"))


def _dsn_only(a, name: str):
    value = getattr(a, name, None)
    if value and not getattr(a, "dsn", None):
        raise UserError(f"--{name.replace('_', '-')} goes with --dsn (a run against a server pathprof does not "
                        "own); a topology's hosts are its own namespaces")
    return value
