"""The measured path as a drawable model: processes in chain order (pgbench, hops, the server) grouped into their
hosts, and per leg the kernel work between two neighbours (wire, netfilter hooks, devices, qdiscs and the delay
lines of impaired links), each with its
µs per transaction from the latency view and, for processes, its CPU µs from the CPU view.

Built from a run directory's `topology.json` (agent/run/recorder.py `discovered_path`; `run --dsn`/`attach` write the
same `chain` shape) plus the run's summary; `run.json`'s topology spec, when there is one, adds the devices and
bridges the spec declares. Every input may be missing: without topology.json the chain is pgbench, the hops the
stage names mention, and the backend; a stage the model cannot place is kept in its leg's `unplaced` list rather
than dropped, so the figures still add up to the latency view's total.

Placement of kernel stages between neighbours is inferred, because a stage row carries a leg and a network
namespace, not the socket pair it was measured on: a netfilter hook goes to the segment whose sender (output,
postrouting) or receiver (prerouting, input) lives in its namespace, `lo` to a segment inside one host, other
devices to a segment that crosses hosts, and an ambiguous one to the first candidate (its `placement` says so).
"""
from __future__ import annotations

import json
from pathlib import Path

from pathprof.analysis.client import client_of
from pathprof.analysis.run_model import Stage, Summary

WAIT_KINDS = ("wakeup", "idle_exit", "runqueue", "recv", "queued", "poolwait", "connwait", "send_blocked")
KERNEL_KINDS = ("wire", "netfilter", "dev", "qdisc", "delay")
HOOK_ORDER = {"output": 1, "postrouting": 2, "forward": 3, "prerouting": 5, "input": 6}
_SENDER_HOOKS, _RECEIVER_HOOKS = ("output", "postrouting"), ("prerouting", "input")


def _num(x) -> float:
    try:
        return float(x) if x is not None else 0.0
    except (TypeError, ValueError):
        return 0.0


def load_topology(run_dir) -> tuple[dict | None, dict | None]:
    """(topology.json, the run.json topology spec) of a run directory; None for what is missing or unreadable."""
    if not run_dir:
        return None, None
    path = Path(run_dir)

    def read(name):
        try:
            return json.loads((path / name).read_text())
        except (OSError, ValueError):
            return None
    topo, meta = read("topology.json"), read("run.json")
    spec = ((meta or {}).get("topology") or {}).get("spec") if isinstance(meta, dict) else None
    return (topo if isinstance(topo, dict) else None), (spec if isinstance(spec, dict) else None)


def _hop_id(value) -> str:
    name = str(value)
    return name[4:] if name.startswith("hop.") else name


def _is_client(e: dict) -> bool:
    return not e.get("hop") and (e.get("role") == "client" or e.get("process") == "pgbench")


def _pids(e: dict) -> list:
    return list(e.get("pids") or ([e["pid"]] if e.get("pid") else []))


def _processes(topo: dict | None, summary: Summary) -> list[dict]:
    """Processes in path order: [{id, label, kind, host, netns, pids}]; ids are the stage names' receivers.
    Every client entry (a discovered path lists each client process, pgbench or not) is the one client, with the
    id its stages carry: pgbench, or the program `attach` found (analysis.client)."""
    cid = client_of(summary)
    procs: list[dict] = []
    chain = (topo or {}).get("chain")
    chain = [e for e in chain if isinstance(e, dict) and (e.get("hop") or e.get("process"))] \
        if isinstance(chain, list) else []
    clients, rest = [e for e in chain if _is_client(e)], [e for e in chain if not _is_client(e)]
    if clients:
        comms = list(dict.fromkeys(str(e.get("process") or "client") for e in clients))
        label = comms[0] if len(comms) == 1 else f"clients ({', '.join(comms[:3])})"
        procs.append({"id": cid, "label": label + (f" ×{len(clients)}" if len(clients) > 1 else ""),
                      "kind": "client", "host": clients[0].get("host"), "netns": clients[0].get("netns"),
                      "pids": [p for e in clients for p in _pids(e)], "process": comms[0]})
    for n, entry in enumerate(rest):
        pids = _pids(entry)
        last = n == len(rest) - 1
        if not entry.get("hop") and entry.get("process") not in ("postgres", "postmaster") and not last:
            entry = {**entry, "hop": entry["process"]}      # another process on the path: a hop by its name
        if entry.get("hop"):
            hop = _hop_id(entry["hop"])
            procs.append({"id": hop, "label": hop, "kind": "hop", "host": entry.get("host"),
                          "netns": entry.get("netns"), "pids": pids, "process": entry.get("process") or hop})
        else:
            procs.append({"id": "backend", "label": "postgres backend", "kind": "server", "host": entry.get("host"),
                          "netns": entry.get("netns"), "pids": pids, "process": entry["process"],
                          "listen": entry.get("listen")})
    hosts = (topo or {}).get("hosts")
    by_netns = {d.get("netns"): name for name, d in (hosts.items() if isinstance(hosts, dict) else [])
                if isinstance(d, dict) and d.get("netns")}
    for p in procs:          # discovered paths name hosts by namespace only
        if not p.get("host") and p.get("netns") in by_netns:
            p["host"] = by_netns[p["netns"]]
    ids = [p["id"] for p in procs]
    if cid not in ids:
        procs.insert(0, {"id": cid, "label": cid, "kind": "client", "host": None, "netns": None,
                         "pids": [], "process": cid})
    known = {p["id"] for p in procs}
    for hop in sorted(_hops_in(summary) - known):   # stages name a hop the chain does not: keep it on the path
        procs.insert(len(procs) - (1 if procs[-1]["kind"] == "server" else 0),
                     {"id": hop, "label": hop, "kind": "hop", "host": None, "netns": None, "pids": [], "process": hop})
    if not any(p["kind"] == "server" for p in procs):
        procs.append({"id": "backend", "label": "postgres backend", "kind": "server", "host": None, "netns": None,
                      "pids": [], "process": "postgres"})
    return procs


def _str(name) -> str:
    return "" if name is None else str(name)


def _hops_in(summary: Summary) -> set[str]:
    names = [_str(s.name) for s in summary.stages]
    names += [_str(c.component) for c in summary.cpu]
    return {n.split(".")[1] for n in names if n.startswith("hop.") and n.count(".") >= 1}


def _hosts(topo: dict | None, procs: list[dict]) -> list[dict]:
    """Hosts in order of their first process, each with its namespace, addresses and process ids."""
    declared = (topo or {}).get("hosts")
    declared = declared if isinstance(declared, dict) else {}
    out: dict[str, dict] = {}
    for p in procs:
        name = p.get("host") or (f"netns {p['netns']}" if p.get("netns") else None)
        if not name:
            continue
        d = declared.get(p.get("host")) or {}
        h = out.setdefault(name, {"name": name, "netns": d.get("netns", p.get("netns")),
                                  "addresses": list(d.get("addresses") or []), "processes": []})
        h["processes"].append(p["id"])
    for name, d in declared.items():            # hosts with no process of the chain (a router, a bridge host)
        if name not in out and isinstance(d, dict):
            out[name] = {"name": name, "netns": d.get("netns"), "addresses": list(d.get("addresses") or []),
                         "processes": []}
    return list(out.values())


def _spec_devices(spec: dict | None) -> tuple[dict[str, str | None], set[str]]:
    """(device name -> the host it lives in, the names of tap devices), from a topology spec's links and bridges."""
    out: dict[str, str | None] = {}
    taps: set[str] = set()
    for br in (spec or {}).get("bridges") or []:
        if isinstance(br, dict) and br.get("name"):
            out[br["name"]] = br.get("host")
    for link in (spec or {}).get("links") or []:
        if not isinstance(link, dict):
            continue
        for end in ("a", "b"):
            e = link.get(end) or {}
            if isinstance(e, dict) and e.get("ifname"):
                host = e.get("host")
                if host is None and e.get("bridge"):
                    host = out.get(e["bridge"])
                out[e["ifname"]] = host
                if link.get("kind") == "tap":
                    taps.add(e["ifname"])
        if link.get("ifname"):                                     # tap-like links with one end
            out[link["ifname"]] = link.get("host")
    return out, taps


def _stage_key(name: str) -> tuple[str, str, str]:
    """(kind, subject, rest) of a stage name: ('wire', 'backend', ''), ('netfilter', 'output', 'pp-x'), ..."""
    kind, _, rest = name.partition(".")
    if kind == "netfilter":
        hook, _, netns = rest.partition(".")
        return kind, hook, netns
    return kind, rest, ""


def build(summary: dict | Summary, topo: dict | None = None, spec: dict | None = None) -> dict:
    """The drawable model of one run (see the module docstring)."""
    summary = Summary.of(summary)
    procs = _processes(topo, summary)
    index = {p["id"]: i for i, p in enumerate(procs)}
    host_of = {p["id"]: p.get("host") for p in procs}
    netns_of = {p["id"]: p.get("netns") for p in procs}
    for p in procs:
        p.update(us=0.0, cpu_us=0.0, wait_us=0.0, own_us=0.0, stages=[], cpu=[])
    legs: dict[str, list[dict]] = {}
    for leg in ("request", "response"):
        order = range(len(procs) - 1) if leg == "request" else range(len(procs) - 1, 0, -1)
        legs[leg] = [{"from": procs[i]["id"], "to": procs[i + 1 if leg == "request" else i - 1]["id"],
                      "elements": [], "leg": leg} for i in order]
    stages = [s for s in summary.stages if not s.parent]
    total = sum(_num(s.us_per_txn) for s in stages)
    devices, taps = _spec_devices(spec)
    unplaced = _place_stages(stages, procs, legs, (index, host_of, netns_of), (devices, taps))
    for p in procs:
        p["us"] = p["own_us"] + p["wait_us"]
    _attach_cpu(procs, summary)
    _unseen_devices(legs, devices, host_of)
    for segs in legs.values():
        for seg in segs:
            seg["elements"].sort(key=_element_order)
    kernel_cpu = [{"name": str(c.component), "us": _num(c.us_per_txn)}
                  for c in summary.cpu if _cpu_owner(str(c.component), index) is None]
    return {"processes": procs, "hosts": _hosts(topo, procs), "legs": legs, "unplaced": unplaced,
            "total_us": total, "kernel_cpu": kernel_cpu, "topology": summary.topology,
            "has_topology_json": topo is not None}


def _proc_for(stage_name: str, index: dict) -> str | None:
    """The process whose own work a stage is (client, backend, a hop on the path), or None."""
    if stage_name.startswith("client."):      # client.<the client's id>: pgbench, or attach's program
        return stage_name[len("client."):]
    if stage_name.startswith("backend."):
        return "backend"
    if stage_name.startswith("hop."):
        return _hop_id(stage_name) if _hop_id(stage_name) in index else None
    return None


def _place_stages(stages: list[Stage], procs: list[dict], legs: dict, where: tuple, spec_devices: tuple) -> dict:
    """Each stage onto its process (its own work, or a wait for it) or onto a leg's segment (kernel work);
    returns the stages that fit neither, by leg."""
    index, host_of, netns_of = where
    devices, taps = spec_devices
    unplaced: dict[str, list[dict]] = {}
    for st in stages:
        name, leg, us = _str(st.name), str(st.leg or ""), _num(st.us_per_txn)
        kind, subject, netns = _stage_key(name)
        item = {"name": name, "leg": leg, "us": us, "p99_us": st.p99_us}
        owner = _proc_for(name, index)
        if owner is not None:
            p = procs[index[owner]]
            p["own_us"] += us
            p["stages"].append(item)
            continue
        if kind in WAIT_KINDS and subject in index:
            p = procs[index[subject]]
            p["wait_us"] += us
            p["stages"].append(item)
            continue
        segs = legs.get(leg) or []
        seg = _place(kind, subject, netns, segs, host_of, netns_of, devices, taps) if kind in KERNEL_KINDS else None
        if seg is None:
            unplaced.setdefault(leg or "other", []).append({**item, "kind": kind})
            continue
        seg_obj, placement = seg
        _add_element(seg_obj, kind, name, subject, netns, item, placement)
    return unplaced


def _add_element(seg: dict, kind: str, name: str, subject: str, netns: str, item: dict, placement: str) -> None:
    label = {"wire": "wire", "dev": f"dev {subject}", "qdisc": f"qdisc {subject}", "delay": f"delay {subject}",
             "netfilter": f"nf {subject}" + (f" ({netns})" if netns else "")}.get(kind, name)
    seg["elements"].append({"kind": kind, "name": name, "label": label, "subject": subject, "netns": netns,
                            "us": item["us"], "p99_us": item.get("p99_us"), "placement": placement})


def _element_order(e: dict):
    if e["kind"] == "wire":
        return (0, 0, e["name"])
    if e["kind"] == "netfilter":
        return (1, HOOK_ORDER.get(e["subject"], 4), e["name"])
    return (1, {"qdisc": 3.4, "delay": 3.5, "dev": 4}.get(e["kind"], 7), e["name"])


def _place(kind, subject, netns, segs, host_of, netns_of, devices, taps):
    """(segment, placement note) for a kernel stage on a leg, or None when the leg has no segment."""
    if not segs:
        return None
    if kind == "wire":
        for s in segs:
            if s["to"] == subject:
                return s, "exact"
        return None
    if kind == "netfilter":
        ns = netns or "root"

        def in_ns(pid):
            return (netns_of.get(pid) or "root") == ns
        if subject in _SENDER_HOOKS:
            cands = [s for s in segs if in_ns(s["from"])]
        elif subject in _RECEIVER_HOOKS:
            cands = [s for s in segs if in_ns(s["to"])]
        else:
            cands = [s for s in segs if host_of.get(s["from"]) != host_of.get(s["to"])]
        cands = cands or [s for s in segs if in_ns(s["from"]) or in_ns(s["to"])] or segs
    else:   # dev / qdisc / delay: where the device is
        crossing = [s for s in segs if host_of.get(s["from"]) != host_of.get(s["to"])]
        local = [s for s in segs if s not in crossing]
        if subject == "lo":
            cands = local or segs
        elif subject in taps:   # a guest's tap: timed from its xmit to qemu's read (or qemu's write onwards),
            host = devices.get(subject)     # i.e. on the segment between qemu and its neighbour on the host
            cands = [s for s in local if host_of.get(s["from"]) == host] or segs
        else:
            host = devices.get(subject)
            near = [s for s in crossing if host in (host_of.get(s["from"]), host_of.get(s["to"]))]
            cands = near or crossing or segs
    return cands[0], ("exact" if len(cands) == 1 else f"one of {len(cands)} segments of this leg")


def _unseen_devices(legs: dict, devices: dict, host_of: dict) -> None:
    """Devices the spec declares but no stage timed (a bridge's own hop is inside the veth's): drawn greyed on the
    request leg, so the diagram still shows every device of the topology."""
    seen = {e["subject"] for segs in legs.values() for s in segs for e in s["elements"]
            if e["kind"] in ("dev", "qdisc", "delay")}
    segs = legs.get("request") or []
    for dev, host in devices.items():
        if dev in seen or not segs:
            continue
        crossing = [s for s in segs if host_of.get(s["from"]) != host_of.get(s["to"])]
        near = [s for s in crossing if host in (host_of.get(s["from"]), host_of.get(s["to"]))]
        seg = (near or crossing or segs)[0]
        seg["elements"].append({"kind": "dev", "name": f"dev.{dev}", "label": f"dev {dev}", "subject": dev,
                                "netns": "", "us": None, "p99_us": None, "placement": "declared, no stage of its own"})


def _cpu_owner(component: str, index: dict) -> str | None:
    if component.startswith("hop."):
        hop = component.split(".")[1]
        return hop if hop in index else None
    head = component.split(".")[0]
    if head in ("backend", "postmaster", "pg_aux"):
        return "backend"
    if head in index:          # <client>.user / .sys: the client's id (pgbench, or attach's program)
        return head
    return None


def _attach_cpu(procs: list[dict], summary: Summary) -> None:
    index = {p["id"]: p for p in procs}
    for c in summary.cpu:
        name = str(c.component)
        owner = _cpu_owner(name, index)
        if owner is not None:
            index[owner]["cpu_us"] += _num(c.us_per_txn)
            index[owner]["cpu"].append({"name": name, "us": _num(c.us_per_txn)})


def elements(model: dict) -> dict[tuple, float | None]:
    """Every element of a model by a stable key -> µs per transaction: what compare diagrams subtract."""
    out: dict[tuple, float | None] = {}
    for p in model["processes"]:
        out[("process", p["id"], "")] = p["us"]
    for leg, segs in model["legs"].items():
        for s in segs:
            for e in s["elements"]:
                out[(e["kind"], e["name"], leg)] = e["us"]
    return out
