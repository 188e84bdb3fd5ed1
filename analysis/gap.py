"""Where the time in no stage is (#22): when the latency view does not close, name the leg and the interval of
the chain that is short, with the evidence, instead of a bare percentage.

Every transaction is a chain of messages, and each message is a fixed sequence on its receiver: `wire.<r>`
(send -> ready), one arrival wait (`queued.<r>`, or `wakeup`/`idle_exit.<r>` then `runqueue.<r>`, `recv.<r>`),
then the receiver's processing (`hop.<r>`, `backend.execute`, `client.pgbench`) up to the next send. So per
(leg, receiver) each link should occur about once per message: a link whose count per transaction falls short of
its neighbours' is where chains broke, and the time of the missing occurrences is the gap. The probes' own
unpaired-event counters say why (a send with no read before it, a delivery with no send seen). Pure functions
of a summary document."""
from __future__ import annotations

from pathprof.analysis.client import client_of
from pathprof.analysis.run_model import Stage, Summary

ARRIVAL = ("queued", "wakeup", "idle_exit")     # exactly one of them per message, at its receiver
PROCESSING = {"hop": "its processing up to the forward", "backend": "the backend's execute up to its reply",
              "client": "the client's work up to its next transaction"}
STAT_MEANING = {"proc_unpaired": "a send with no read before it to pair with",
                "wire_unpaired": "a delivery whose send start was not seen",
                "window_edge": "a message begun before a measurement window opened",
                "hold_stale": "a held request the hop never forwarded"}


def _links(stages: list[Stage], client: str = "pgbench") -> dict[tuple[str, str], dict[str, float]]:
    """{(leg, receiver): {"wire": count/txn, "arrival": count/txn, "processing": count/txn}}; `client` is the
    client's name in the stage names (analysis.client)."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    for s in stages:
        if s.parent or s.count_per_txn is None or "." not in str(s.name):
            continue
        kind, who = str(s.name).split(".", 1)
        leg = s.leg or ""
        if kind == "wire":
            link = "wire"
        elif kind in ARRIVAL:
            link = "arrival"
        elif kind == "hop" or (kind, who) in (("backend", "execute"), ("client", client)):
            link, who = "processing", ("backend" if kind == "backend" else client if kind == "client" else who)
        else:
            continue
        d = out.setdefault((leg, who), {})
        d[link] = d.get(link, 0.0) + float(s.count_per_txn)
    return out


def locate_gap(summary: dict | Summary, threshold_pct: float = 5.0) -> dict | None:
    """{leg, receiver, interval, count_per_txn, expected_per_txn, short_us_per_txn, evidence} for the link of the
    chain that broke, or a statement that no link is short; None when the view closes within threshold_pct."""
    summary = Summary.of(summary)
    err, cycle = summary.closure.latency_error_pct, summary.closure.cycle_us
    if err is None or cycle is None or abs(err) <= threshold_pct:
        return None
    short_us = round(-err / 100.0 * cycle, 1)
    divisors = summary.closure.connect_divisors
    if divisors and divisors.get("decides_closure"):
        return {"short_us_per_txn": short_us, "leg": "connect", "interval": None, "link": "divisor",
                "statement": divisors["statement"], "evidence": None}
    if err > 0:
        return {"short_us_per_txn": short_us, "leg": None, "interval": None,
                "statement": ("the stages add up to more than the cycle: a span is counted twice, or the "
                              "measurement windows saw slower transactions than the run as a whole"),
                "evidence": None}
    client = client_of(summary)
    links = _links(summary.stages, client)
    worst = None
    for (leg, who), d in links.items():
        # deliveries are the anchor: one wire per message that arrived (a link counted more often than that is
        # taking other messages' occurrences, as a hop's mispaired forwards do)
        expected = d.get("wire") or max(d.values())
        for link, count in d.items():
            missing = expected - count
            if expected > 0 and missing > 0.05 * expected and (worst is None or missing > worst[0]):
                worst = (missing, leg, who, link, count, expected)
    losses = [x for x in summary.losses if x.name in STAT_MEANING and x.count]
    evidence = "; ".join(f"{x.count:,} × {STAT_MEANING[x.name]} ({x.name})" for x in losses[:3])
    if worst is None:
        return {"short_us_per_txn": short_us, "leg": None, "interval": None,
                "statement": ("every link of the chain occurs as often as its neighbours: the shortfall is inside "
                              "the measured stages (time between two probes that no stage covers on every "
                              "message) or outside the measurement windows, not a broken chain"),
                "evidence": evidence or None}
    _, leg, who, link, count, expected = worst
    role = who if who == "backend" else "client" if who == client else "hop"
    interval = {"wire": f"between the sender's send and the data being ready at {who} (wire.{who})",
                "arrival": f"between the data being ready at {who} and {who} reading it (its wakeup or queue)",
                "processing": f"at {who}, between reading the message and its next send ({PROCESSING[role]})"}[link]
    return {"short_us_per_txn": short_us, "leg": leg, "receiver": who, "link": link, "interval": interval,
            "count_per_txn": round(count, 3), "expected_per_txn": round(expected, 3),
            "statement": (f"the {leg} leg is short {interval}: it was measured {count:.2f} times per transaction "
                          f"where its neighbours were {expected:.2f}"),
            "evidence": evidence or None}


# A -C setup step is a mean per connection; the latency view's other stages are per transaction (the windows'
# transactions). With one connection per transaction the two divisors are the same count, so a step whose divisor is
# not (beyond window edges and a few unpaired connections) is on another basis than the stages it is added to.
DIVISOR_TOLERANCE = 0.05
DIVISOR_MATERIAL_PCT = 1.0      # ... and only when re-dividing it would move the sum by this share of the cycle


def _divisor_row(step, txns: int) -> dict | None:
    divisor, us = step.divisor, float(step.us_per_conn or 0.0)
    if not divisor or abs(divisor / txns - 1.0) <= DIVISOR_TOLERANCE:
        return None
    per_txn = us * divisor / txns          # the step's time spread over the transactions the stages are over
    return {"step": step.name, "divisor": int(divisor), "us_per_conn": round(us, 1),
            "us_per_txn_if_over_txns": round(per_txn, 1), "shift_us_per_txn": round(per_txn - us, 1)}


def connect_divisors(summary: dict | Summary, threshold_pct: float = 5.0) -> dict | None:
    """-C: the connection-setup steps whose divisor (connections their mean is over) is not the transactions the
    latency view is divided by, with what the closure is either way; None when every step's divisor agrees (or
    what differs moves the sum by less than DIVISOR_MATERIAL_PCT of the cycle). A wrong divisor makes a step too
    large or too small by its ratio, which can make a run look closed when it is not, or the other way."""
    summary = Summary.of(summary)
    cl = summary.closure
    txns, cycle = cl.txns, cl.cycle_us
    if not txns or not cycle or not summary.connection_setup:
        return None
    rows = [r for r in (_divisor_row(s, txns) for s in summary.connection_setup) if r]
    rows = [r for r in rows if abs(r["shift_us_per_txn"]) >= DIVISOR_MATERIAL_PCT / 100.0 * cycle]
    if not rows:
        return None
    shift = sum(r["shift_us_per_txn"] for r in rows)
    err = cl.latency_error_pct
    alt = round(((cl.stages_sum_us or 0.0) + shift - cycle) / cycle * 100.0, 2)
    steps = "; ".join(f"{r['step']} is a mean over {r['divisor']:,} connections ({r['us_per_conn']:,.1f} µs), "
                      f"over the transactions {r['us_per_txn_if_over_txns']:,.1f} µs" for r in rows)
    flips = err is not None and (abs(err) <= threshold_pct) != (abs(alt) <= threshold_pct)
    statement = (f"under -C the setup steps are per connection and the other stages per transaction ({txns:,} "
                 f"measured); {steps}. With those steps over the transactions the latency view would close at "
                 f"{alt:+.1f} % instead of {err if err is not None else float('nan'):+.1f} %"
                 + (": whether this run closes depends on that divisor" if flips else ""))
    return {"txns": int(txns), "steps": rows, "shift_us_per_txn": round(shift, 1),
            "latency_error_pct_if_over_txns": alt, "decides_closure": flips, "statement": statement}


def divisor_caveat(summary: Summary, label: str, gap_us: float) -> dict:
    """For compare/diff: a -C run whose setup steps are divided by other than its transactions carries that error
    into the explanation's items, so a gap can look explained, or not, by a divisor."""
    d = summary.closure.connect_divisors or {}
    shift = float(d.get("shift_us_per_txn") or 0.0)
    return {"run": label, "steps": [r["step"] for r in d.get("steps") or []], "txns": d.get("txns"),
            "shift_us_per_txn": shift,
            "share_of_gap_pct": round(100.0 * abs(shift) / abs(gap_us), 1) if abs(gap_us) > 0.05 else None}


def divisor_caveat_text(c: dict) -> str:
    share = f", {c['share_of_gap_pct']:.0f} % of the gap" if c.get("share_of_gap_pct") is not None else ""
    verb = "is" if len(c["steps"]) == 1 else "are"
    return (f"but in {c['run']} {', '.join(c['steps'])} {verb} divided by other than its {c['txns']:,} "
            f"transactions (a mean per connection): over the transactions they would move "
            f"{c['shift_us_per_txn']:+,.1f} µs per transaction{share}, so that much of the explanation rests on a "
            "divisor")
