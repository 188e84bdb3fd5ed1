"""Running processes inside a topology host (a network namespace, or the root namespace)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from pathprof.agent.host.netns import netns_argv  # noqa: F401  (proc.netns_argv is part of the documented seam)
from pathprof.errors import RequirementError, UserError

# Debian package that provides each external tool, for "missing tool" messages.
PACKAGE_OF = {
    "ip": "iproute2", "iptables": "iptables", "iptables-save": "iptables", "iptables-restore": "iptables",
    "nft": "nftables",
    "pgbench": "postgresql-contrib (postgresql-15)", "initdb": "postgresql-15", "pg_ctl": "postgresql-15",
    "psql": "postgresql-client-15",
    "postgres": "postgresql-15", "pgbouncer": "pgbouncer", "pgpool": "pgpool2", "docker-proxy": "docker.io",
    "qemu-system-x86_64": "qemu-system-x86", "conntrack": "conntrack", "bpftool": "bpftool",
    "runuser": "util-linux", "setpriv": "util-linux", "debootstrap": "debootstrap",
}
PG_BINDIR = Path("/usr/lib/postgresql/15/bin")


def which(tool: str) -> str:
    """Absolute path of an external tool, or a RequirementError naming the Debian package."""
    if tool in ("pgbench", "initdb", "pg_ctl", "postgres", "pg_isready"):
        # PostgreSQL's tools come from one version's bin directory, never a wrapper elsewhere on PATH.
        bindir = Path(os.environ.get("PATHPROF_PG_BINDIR", PG_BINDIR))
        if (bindir / tool).exists():
            return str(bindir / tool)
        pkg = PACKAGE_OF[tool]
        raise RequirementError(f"'{tool}' not found in {bindir}; install the Debian package {pkg} "
                               f"(apt-get install {pkg.split()[0]})")
    for d in ("/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/sbin", "/usr/local/bin"):
        if os.access(os.path.join(d, tool), os.X_OK):
            return os.path.join(d, tool)
    found = shutil.which(tool)
    if found:
        return found
    pkg = PACKAGE_OF.get(tool, tool)
    raise RequirementError(f"'{tool}' not found; install the Debian package {pkg} (apt-get install {pkg.split()[0]})")




def user_argv(user: str | None, argv: list[str]) -> list[str]:
    if user is None:
        return list(argv)
    # setpriv execs in place (runuser forks and waits), so the pid we hold is the real server's pid.
    return [which("setpriv"), f"--reuid={user}", f"--regid={user}", "--init-groups", "--", *argv]


def spawn(netns: str | None, argv: list[str], *, user: str | None = None, log_path: Path | None = None,
          **popen_kw) -> subprocess.Popen:
    """Start a process in its own session (so teardown can signal the whole group)."""
    full = netns_argv(netns, user_argv(user, argv))
    if log_path is not None:
        log = open(log_path, "ab")
        popen_kw.setdefault("stdout", log)
        popen_kw.setdefault("stderr", subprocess.STDOUT)
    popen_kw.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.Popen(full, start_new_session=True, **popen_kw)


def run(netns: str | None, argv: list[str], *, check: bool = True, timeout: float = 60, user: str | None = None,
        input: str | None = None) -> subprocess.CompletedProcess:
    """Run to completion; a failure becomes a UserError quoting the command and the tail of its stderr."""
    full = netns_argv(netns, user_argv(user, argv))
    try:
        cp = subprocess.run(full, capture_output=True, text=True, timeout=timeout, input=input,
                            stdin=None if input is not None else subprocess.DEVNULL)
    except FileNotFoundError as e:
        raise RequirementError(f"cannot run {argv[0]}: {e.strerror}") from None
    except subprocess.TimeoutExpired:
        raise UserError(f"'{' '.join(argv)}' did not finish within {timeout:.0f} s") from None
    if check and cp.returncode != 0:
        tail = (cp.stderr or cp.stdout).strip().splitlines()[-3:]
        raise UserError(f"'{' '.join(argv)}' failed (exit {cp.returncode}): {' | '.join(tail)}")
    return cp


def pid_alive(pid: int) -> bool:
    """Whether pid is a running process. A zombie (state Z: exited, not yet reaped by its parent) is dead: in a
    container whose PID 1 never reaps, a killed pathprof stays a zombie forever, and its run must be cleanable."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def pid_start_time(pid: int) -> int | None:
    """Kernel start time of a process (field 22 of /proc/PID/stat), to tell a pid from a reused one."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def stop_process(proc: subprocess.Popen | int, timeout: float = 5.0, sig: int = signal.SIGTERM) -> None:
    """Signal the process group, wait, then SIGKILL; tolerates processes already gone."""
    pid = proc if isinstance(proc, int) else proc.pid
    for s, wait in ((sig, timeout), (signal.SIGKILL, 2.0)):
        try:
            os.killpg(pid, s)
        except ProcessLookupError:
            pass
        except PermissionError:
            os.kill(pid, s)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if isinstance(proc, subprocess.Popen):
                if proc.poll() is not None:
                    return
            else:
                try:
                    if os.waitpid(pid, os.WNOHANG)[0] == pid:
                        return
                except ChildProcessError:
                    if not pid_alive(pid):
                        return
            time.sleep(0.05)
