"""The pgbench driver: builds the command, runs it inside the client host, reads its summary and -l logs."""
from __future__ import annotations

import glob
import gzip
import os
import re
import shutil
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from pathprof.agent.host import proc
from pathprof.errors import UserError

MODES = ("simple", "extended", "prepared")
BUILTIN_SCRIPTS = {"tpcb-like": True, "simple-update": True, "select-only": True, "select1": False, "tpcc": True}
MAX_DURATION_S = 6 * 3600      # a soak of a few hours, never an unbounded load
PROGRESS_RE = re.compile(r"progress: ([\d.]+) s, ([\d.]+) tps, lat ([\d.]+) ms stddev ([\d.]+|NaN)"
                         r"(?:, (\d+) failed)?")


@dataclass
class Workload:
    clients: int = 16
    threads: int | None = None
    duration_s: int = 10
    mode: str = "prepared"
    script: str = "select1"
    connect: bool = False
    scale: int = 1
    rate: float | None = None

    def validate(self, ncpu: int) -> "Workload":
        if self.clients <= 0:
            raise UserError(f"--clients must be at least 1 (got {self.clients})")
        if self.clients > 1000:
            raise UserError(f"--clients {self.clients} is more than pathprof drives from one host (at most 1000)")
        if self.threads is None:
            self.threads = min(self.clients, ncpu)
        if self.threads <= 0 or self.threads > self.clients:
            raise UserError(f"--threads must be between 1 and --clients ({self.clients}); got {self.threads}")
        if self.duration_s <= 0:
            raise UserError(f"--duration must be a positive number of seconds (got {self.duration_s})")
        if self.duration_s > MAX_DURATION_S:
            raise UserError(f"--duration is limited to {MAX_DURATION_S} s ({MAX_DURATION_S // 3600} h: load loops are "
                            f"bounded); got {self.duration_s:g}")
        if self.mode not in MODES:
            raise UserError(f"--mode must be one of {', '.join(MODES)} (got {self.mode})")
        if self.scale <= 0:
            raise UserError(f"--scale must be at least 1 (got {self.scale})")
        if self.rate is not None and self.rate <= 0:
            raise UserError(f"--rate must be positive transactions per second (got {self.rate})")
        if self.script.startswith("@"):
            p = Path(self.script[1:])
            if not p.is_file():
                raise UserError(f"script file {p} does not exist")
        elif self.script not in BUILTIN_SCRIPTS:
            raise UserError(f"--script must be one of {', '.join(BUILTIN_SCRIPTS)} or @FILE (got {self.script})")
        return self

    @property
    def needs_tables(self) -> bool:
        return BUILTIN_SCRIPTS.get(self.script, True) if not self.script.startswith("@") else False

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Target:
    host: str        # an address, or a unix socket directory
    port: int
    user: str = "postgres"
    dbname: str = "postgres"


def build_argv(w: Workload, target: Target, log_dir: Path, script_dir: Path) -> list[str]:
    argv = [proc.which("pgbench"), "-n", "-M", w.mode, "-c", str(w.clients), "-j", str(w.threads),
            "-T", str(w.duration_s), "-P", "1", "-r", "-l", f"--log-prefix={log_dir / 'pgbench_log'}"]
    if w.connect:
        argv.append("-C")
    if w.rate:
        argv += ["-R", f"{w.rate:g}"]
    if w.script == "select1":
        path = script_dir / "select1.sql"
        path.write_text("select 1;\n")
        argv += ["-f", str(path)]
    elif w.script == "tpcc":
        from pathprof.agent.postgres import tpcc
        argv += tpcc.script_args(script_dir, w.scale)
    elif w.script.startswith("@"):
        src = Path(w.script[1:])
        dst = script_dir / src.name
        shutil.copyfile(src, dst)  # keep the exact script with the run
        argv += ["-f", str(dst)]
    else:
        argv += ["-b", w.script]
    argv += ["-h", target.host, "-p", str(target.port), "-U", target.user, target.dbname]
    return argv


def setup_done(log_dir: Path):
    """A predicate: pgbench's own start-up is over. pgbench first connects once on its own (the server's
    version; with a built-in script, the scale and partition queries, which a new backend in a small CPU quota
    took 1.4 s to serve under emulation) and closes that connection before its threads start; each thread
    creates its transaction log (-l, under log_dir) as it starts, before it connects its clients. That start-up
    is no transaction's, so no window should hold it."""
    return lambda: any(log_dir.glob("pgbench_log.*"))


@dataclass
class Progress:
    elapsed_s: float
    tps: float
    latency_ms: float
    failed: int = 0


@dataclass
class PgbenchResult:
    tps: float = 0.0
    tps_excluding_connect: float | None = None
    transactions: int = 0
    failed: int = 0
    latency_ms: dict = field(default_factory=dict)
    connection_time_ms: float | None = None
    version: str = ""
    progress: list = field(default_factory=list)
    exit_code: int = 0
    # pgbench -r: per script (one unless several were weighted), its transactions, latency and statements
    # [{name, weight, transactions, tps, latency_ms {mean, stddev}, statements [{latency_ms, failures, sql}]}]
    scripts: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


_STATEMENT_RE = re.compile(r"^\s+([\d.]+)\s+(\d+)\s+(.*)$")


def _new_script(name: str) -> dict:
    return {"name": name, "weight": None, "transactions": None, "tps": None, "latency_ms": {}, "statements": []}


def parse_scripts(stdout: str) -> list[dict]:
    """pgbench -r's per-script blocks (or the one implicit script) with their statement latencies."""
    scripts: list[dict] = []
    cur: dict | None = None
    in_statements = False
    for raw in stdout.splitlines():
        line = raw.strip()
        if m := re.match(r"SQL script (\d+): (.+)$", line):
            cur = _new_script(m.group(2))
            scripts.append(cur)
            in_statements = False
        elif cur is not None and (m := re.match(r"- weight: (\d+)", line)):
            cur["weight"] = int(m.group(1))
        elif cur is not None and (m := re.match(r"- (\d+) transactions .*tps = ([\d.]+)", line)):
            cur["transactions"], cur["tps"] = int(m.group(1)), float(m.group(2))
        elif cur is not None and (m := re.match(r"- latency (average|stddev) = ([\d.]+) ms", line)):
            cur["latency_ms"]["mean" if m.group(1) == "average" else "stddev"] = float(m.group(2))
        elif "statement latencies in milliseconds" in line:
            if cur is None:          # a single script: no "SQL script" header
                cur = _new_script("")
                scripts.append(cur)
            in_statements = True
        elif in_statements and (m := _STATEMENT_RE.match(raw)):
            cur["statements"].append({"latency_ms": float(m.group(1)), "failures": int(m.group(2)),
                                      "sql": m.group(3).strip()})
        else:
            in_statements = False
    return scripts


def parse_summary(stdout: str) -> PgbenchResult:
    r = PgbenchResult()
    r.scripts = parse_scripts(stdout)
    for line in stdout.splitlines():
        line = line.strip()
        if m := re.match(r"pgbench \((.+)\)$", line):
            r.version = m.group(1)
        elif m := re.match(r"number of transactions actually processed: (\d+)", line):
            r.transactions = int(m.group(1))
        elif m := re.match(r"number of failed transactions: (\d+)", line):
            r.failed = int(m.group(1))
        elif m := re.match(r"latency average = ([\d.]+) ms", line):
            r.latency_ms["mean"] = float(m.group(1))
        elif m := re.match(r"(?:initial|average) connection time = ([\d.]+) ms", line):
            r.connection_time_ms = float(m.group(1))
        elif m := re.match(r"tps = ([\d.]+) \((.+)\)", line):
            if "excluding" in m.group(2):
                r.tps_excluding_connect = float(m.group(1))
            else:
                r.tps = float(m.group(1))
    return r


def parse_progress(line: str) -> Progress | None:
    m = PROGRESS_RE.search(line)
    if not m:
        return None
    return Progress(float(m.group(1)), float(m.group(2)), float(m.group(3)), int(m.group(5) or 0))


def read_logs(log_dir: Path):
    """Per-transaction latencies (µs) from pgbench's -l files: `client txn latency_us script epoch_s epoch_us`."""
    import numpy as np
    import pandas as pd
    frames = []
    for path in sorted(glob.glob(str(log_dir / "pgbench_log.*"))):
        opener = gzip.open if path.endswith(".gz") else open
        # A 7th column (schedule lag) appears with --rate; only latency and end time matter here. Read in chunks
        # into narrow columns: a 30-minute run logs tens of millions of transactions, and parsing them whole took
        # ~100 bytes of memory per transaction (16 now). A file with words in the latency column (failed or
        # skipped transactions) is read as before.
        for dtype in ({"latency_us": np.int32, "epoch_s": np.int64, "epoch_us": np.int32}, None):
            try:
                with opener(path, "rt") as f:
                    chunks = list(pd.read_csv(f, sep=" ", header=None, usecols=[2, 4, 5], engine="c",
                                              names=["latency_us", "epoch_s", "epoch_us"], dtype=dtype,
                                              chunksize=1 << 21))
                break
            except ValueError:
                continue
        frames += chunks
    if not frames:
        return pd.DataFrame({"latency_us": np.array([], dtype=float)})
    return pd.concat(frames, ignore_index=True)


def iter_log_chunks(log_dir: Path, rows: int = 1 << 20, files: bool = False):
    """pgbench's -l files as DataFrames of at most `rows` transactions (client, latency_us, epoch_s, epoch_us), one
    after the other: memory bounded by a chunk, not by the run's length. A file with words in the latency column
    (failed or skipped transactions) is parsed untyped from the chunk where the words start; a file that cannot
    be parsed at all is skipped (nothing of another file is repeated for it). files=True: (file number, chunk)
    pairs -- pgbench writes one file per thread, so the number names the clients' thread."""
    import numpy as np
    import pandas as pd
    typed = {"client": np.int32, "latency_us": np.int32, "epoch_s": np.int64, "epoch_us": np.int32}
    for number, path in enumerate(sorted(glob.glob(str(log_dir / "pgbench_log.*")))):
        opener = gzip.open if path.endswith(".gz") else open
        done = 0
        for dtype in (typed, None):
            try:
                with opener(path, "rt") as f:
                    for i, chunk in enumerate(pd.read_csv(f, sep=" ", header=None, usecols=[0, 2, 4, 5], engine="c",
                                                          names=["client", "latency_us", "epoch_s", "epoch_us"],
                                                          dtype=dtype,
                                                          chunksize=rows)):
                        if i >= done:
                            if dtype is None:      # words: failed/skipped transactions, or not a log line
                                for col in ("client", "epoch_s", "epoch_us"):
                                    chunk[col] = pd.to_numeric(chunk[col], errors="coerce")
                                chunk = chunk.dropna(subset=["client", "epoch_s", "epoch_us"]).astype(
                                    {"client": "int64", "epoch_s": "int64", "epoch_us": "int64"})
                                chunk["latency_us"] = pd.to_numeric(chunk["latency_us"], errors="coerce").fillna(-1)
                            yield (number, chunk) if files else chunk
                            done = i + 1
                break
            except (ValueError, pd.errors.ParserError):
                continue


def log_stats(log_dir: Path, windows: list[dict], connect: bool = False):
    """One streaming pass: the latency percentiles and the windows split (analysis.windows.LogStats); connect: the
    run opened a connection per transaction (-C), where a closed client waits for its thread."""
    from pathprof.analysis.windows import LogStats
    stats = LogStats(windows, thread_waits=connect)
    for thread, chunk in iter_log_chunks(log_dir, files=True):
        ends = chunk["epoch_s"].to_numpy(dtype="int64") * 1_000_000 + chunk["epoch_us"].to_numpy(dtype="int64")
        stats.add(ends, chunk["latency_us"].to_numpy(dtype="float64"), chunk["client"].to_numpy(dtype="int64"),
                  thread=thread)
    return stats


def latency_percentiles(logs) -> dict:
    lat = logs["latency_us"]
    lat = lat[lat >= 0]  # pgbench logs -1 style markers for skipped/failed transactions
    if lat.empty:
        return {}
    q = lat.quantile([0.5, 0.95, 0.99])
    return {"mean": lat.mean() / 1000, "p50": q[0.5] / 1000, "p95": q[0.95] / 1000, "p99": q[0.99] / 1000}


def compress_logs(log_dir: Path) -> None:
    for path in glob.glob(str(log_dir / "pgbench_log.*")):
        if path.endswith(".gz"):
            continue
        with open(path, "rb") as src, gzip.open(path + ".gz", "wb", compresslevel=3) as dst:
            shutil.copyfileobj(src, dst)
        os.unlink(path)


OVERRUN_LOOK_S = 2.0     # how long pgbench may overrun -T before pathprof looks at the path, and how often after


def run(netns: str | None, argv: list[str], out_dir: Path, on_progress: Callable[[Progress], None] | None = None,
        on_start: Callable[[int], None] | None = None, timeout_s: float = 60,
        should_stop: Callable[[], bool] = lambda: False, env: dict | None = None,
        path_broken: Callable[[], list[str]] | None = None) -> PgbenchResult:
    """Run pgbench to completion (bounded by -T plus timeout_s), streaming -P progress to on_progress. `env`:
    variables added to pgbench's environment (a DSN's password: never on its command line). `path_broken`:
    asked every few seconds once pgbench overruns its -T; a non-empty answer (a link down, a hop gone) stops it
    at once, since a client blocked on a dead path would otherwise wait for TCP to give up."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "argv.txt").write_text(" ".join(argv) + "\n")
    stdout_f = open(out_dir / "stdout.txt", "w")
    extra = {"env": {**os.environ, **env}} if env else {}
    if on_start:
        # held at a gate until on_start has followed its pid: pgbench's first connects come at once (32 clients
        # through a pooler: its listen queue overflows, 1-3 s SYN waits), and a probe that began following it a
        # few hundred ms late on a loaded machine never saw them start (-36 % closure beside another run)
        extra.update(stdin=subprocess.PIPE)
    p = proc.spawn(netns, [*GATE, *argv] if on_start else argv, stdout=stdout_f, stderr=subprocess.PIPE, text=True,
                   bufsize=1, cwd=out_dir, **extra)
    if on_start:
        try:
            _through_gate(p, on_start)
        except BaseException:           # interrupted once through the gate: pgbench must not outlive the run
            proc.stop_process(p)
            stdout_f.close()
            raise
    pump = _StderrPump(p, out_dir / "stderr.txt", on_progress)
    try:
        _wait(p, _duration_of(argv), timeout_s, should_stop, path_broken)
    except BaseException:
        proc.stop_process(p)
        raise
    finally:
        pump.join(timeout=5)
        stdout_f.close()
    if pump.write_error:
        raise pump.write_error[0]
    result = parse_summary((out_dir / "stdout.txt").read_text())
    result.exit_code = p.returncode
    result.progress = [asdict(x) for x in pump.progress]
    if p.returncode != 0 and result.transactions == 0:
        tail = " | ".join(x for x in pump.err_lines[-3:] if x)
        raise UserError(f"pgbench failed (exit {p.returncode}): {tail or 'no output'}")
    return result


# `sh` reads one line from its stdin, then becomes pgbench (the same pid) with /dev/null as stdin; at end of file
# (pathprof gone before opening the gate) it exits without running pgbench
GATE = ["sh", "-c", 'read go && exec "$@" </dev/null', "pgbench"]


def _through_gate(p: subprocess.Popen, on_start: Callable[[int], None]) -> None:
    """on_start(pid) while the process waits at GATE, then let it through; if on_start fails, it never starts."""
    opened = False
    try:
        on_start(p.pid)
        p.stdin.write("go\n")
        opened = True
    finally:
        try:
            p.stdin.close()
        except OSError:
            pass
        if not opened:
            # interrupted (SIGTERM) maybe after the write but before `opened`: pgbench may be running, and a
            # timeout here would replace the interruption with a traceback (CI ci44b); the caller stops it
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


class _StderrPump(threading.Thread):
    """Reads pgbench's stderr into stderr.txt, parsing -P progress lines as they come. Whatever happens to the
    file (a full disk), reading goes on so progress does; the error is raised in the caller's thread once
    pgbench is done."""

    def __init__(self, p: subprocess.Popen, path: Path, on_progress: Callable[[Progress], None] | None):
        super().__init__(daemon=True)
        self.p, self.path, self.on_progress = p, path, on_progress
        self.progress: list[Progress] = []
        self.err_lines: list[str] = []
        self.write_error: list[OSError] = []
        self.start()

    def run(self) -> None:
        try:
            err_f = open(self.path, "w")
        except OSError as e:
            err_f, self.write_error[:] = None, [e]
        for line in self.p.stderr:
            if err_f is not None:
                try:
                    err_f.write(line)
                except OSError as e:
                    self.write_error[:] = [e]
                    err_f = None
            pr = parse_progress(line)
            if pr:
                self.progress.append(pr)
                if self.on_progress:
                    self.on_progress(pr)
            else:
                self.err_lines.append(line.rstrip())
        if err_f is not None:
            try:
                err_f.close()
            except OSError as e:
                self.write_error[:] = [e]


def _wait(p: subprocess.Popen, duration: float, timeout_s: float, should_stop: Callable[[], bool],
          path_broken: Callable[[], list[str]] | None) -> None:
    """Until pgbench exits: at most -T + timeout_s, less when the path broke under it."""
    t_start = time.monotonic()
    deadline = t_start + duration + timeout_s
    next_look = t_start + duration + OVERRUN_LOOK_S
    while p.poll() is None:
        if should_stop():  # a signal arrived but its KeyboardInterrupt was swallowed somewhere
            raise KeyboardInterrupt
        now = time.monotonic()
        if now > deadline:
            raise UserError(f"pgbench did not finish within {duration + timeout_s:.0f} s; stopped it")
        if path_broken is not None and now > next_look:
            next_look = now + OVERRUN_LOOK_S
            if path_broken():
                raise UserError(f"pgbench did not finish {now - t_start - duration:.0f} s after its "
                                f"{duration:.0f} s; stopped it")
        try:
            p.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass


def _duration_of(argv: list[str]) -> float:
    return float(argv[argv.index("-T") + 1]) if "-T" in argv else 0.0


def finish(result: PgbenchResult, log_dir: Path, percentiles: dict | None = None,
           compress: bool = True) -> PgbenchResult:
    """Fill latency percentiles from the per-transaction logs (streamed now unless given), then compress them."""
    pct = percentiles if percentiles is not None else log_stats(log_dir, []).percentiles()
    if pct:  # otherwise keep pgbench's own "latency average"
        result.latency_ms = pct
    if compress:
        compress_logs(log_dir)
    return result


def pgbench_version() -> str:
    try:
        out = subprocess.run([proc.which("pgbench"), "--version"], capture_output=True, text=True).stdout
    except UserError:
        return ""
    return out.strip()
