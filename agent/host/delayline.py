"""The delay line of an impaired link (probes/pp-delayline.c behind an iptables NFQUEUE rule) and the tbf qdisc
of a rate limit, as host objects: started and journaled, checked, undone. What an impairment *is* (the spec
keys, where on a path it holds packets) is topologies.impairments."""
from __future__ import annotations

import os
import select
import subprocess
from pathlib import Path

from pathprof.agent.host import proc
from pathprof.errors import RequirementError, UserError


def delayline_binary() -> str:
    import pathprof.probes as pp
    path = Path(pp.__file__).resolve().parent / "pp-delayline"
    if not path.exists():
        raise RequirementError(f"{path} is not built: run `make -C probes` (it builds the link delay line)")
    return str(path)


def start(journal, netns: str | None, chain: str, match: list[str], queue: int,
          delay_us: float, jitter_us: float, loss_pct: float) -> None:
    """One delay line: the daemon first (journaled), then the NFQUEUE rule that feeds it (journaled)."""
    argv = [delayline_binary(), str(queue), str(int(delay_us * 1000)), str(int(jitter_us * 1000)),
            str(int(round(loss_pct * 1e4)))]
    p = journal.spawn(netns, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ready = select.select([p.stdout], [], [], 5.0)[0]
    line = p.stdout.readline().decode(errors="replace").strip() if ready else ""
    if line != "ready":
        p.kill()
        err = p.stderr.read().decode(errors="replace").strip() if p.poll() is not None else "no answer in 5 s"
        raise UserError(f"the link delay line on {match[1]} did not start: {err}")
    args = [*match, "-p", "tcp", "-j", "NFQUEUE", "--queue-num", str(queue)]
    journal.record("iptables", table="mangle", chain=chain, args=args, netns=netns)
    proc.run(netns, ["iptables", "-w", "-t", "mangle", "-A", chain, *args])


def dead_delay_lines(journal) -> list[str]:
    """The run's delay lines that are no longer running (a packet queued to one that is gone is dropped)."""
    out = []
    for e in journal.entries:
        argv = e.get("argv") or []
        if e["kind"] == "process" and e.get("pid") and argv and argv[0].endswith("pp-delayline") \
                and not _running(e["pid"]):
            out.append(f"the link delay line (NFQUEUE {argv[1]} in {e.get('netns') or 'the root namespace'}) exited")
    return out


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def qdisc_shown(netns: str | None, dev: str, kind: str) -> bool | None:
    """True when dev's root qdisc is `kind`, False when not, None when the device is gone."""
    cp = proc.run(netns, ["tc", "qdisc", "show", "dev", dev, "root"], check=False)
    if cp.returncode != 0:
        return None
    return kind in cp.stdout.split()


def qdisc_undo(entry: dict) -> bool:
    """Journal replay: delete the root qdisc pathprof added (the device falls back to its default); gone = done."""
    ns, dev, kind = entry.get("netns"), entry["name"], entry.get("qdisc", "tbf")
    if not qdisc_shown(ns, dev, kind):
        return True
    proc.run(ns, ["tc", "qdisc", "del", "dev", dev, "root"], check=False)
    return not qdisc_shown(ns, dev, kind)


def usage(journal) -> dict[str, dict]:
    """What each running delay line has done so far: {"<netns>/<queue>": {cpu_us, packets}}: its CPU time
    (/proc/PID/stat utime + stime) and the packets its NFQUEUE handed it (id_sequence in the queue's line of
    /proc/PID/net/netfilter/nfnetlink_queue, seen from the daemon's namespace). Two readings bracket an interval."""
    tick_us = 1e6 / os.sysconf("SC_CLK_TCK")
    out = {}
    for e in journal.entries:
        argv = e.get("argv") or []
        if e["kind"] != "process" or not e.get("pid") or not argv or not argv[0].endswith("pp-delayline"):
            continue
        try:
            fields = Path(f"/proc/{e['pid']}/stat").read_text().rsplit(")", 1)[1].split()
            lines = Path(f"/proc/{e['pid']}/net/netfilter/nfnetlink_queue").read_text().splitlines()
        except OSError:
            continue
        seq = [int(ln.split()[7]) for ln in lines if ln.split() and ln.split()[0] == argv[1]]
        if seq:
            out[f"{e.get('netns') or 'root'}/{argv[1]}"] = {"cpu_us": (int(fields[11]) + int(fields[12])) * tick_us,
                                                            "packets": seq[0]}
    return out


def usage_during(before: dict, after: dict) -> list[dict]:
    """run.json `delay_lines`: each delay line's CPU and packets over the measured interval."""
    return [{"line": k, "cpu_us": round(v["cpu_us"] - before[k]["cpu_us"], 1),
             "packets": v["packets"] - before[k]["packets"]} for k, v in after.items() if k in before]
