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

from pathprof.analysis.run_model import Stage, Summary

ARRIVAL = ("queued", "wakeup", "idle_exit")     # exactly one of them per message, at its receiver
PROCESSING = {"hop": "its processing up to the forward", "backend": "the backend's execute up to its reply",
              "client": "pgbench's work up to its next transaction"}
STAT_MEANING = {"proc_unpaired": "a send with no read before it to pair with",
                "wire_unpaired": "a delivery whose send start was not seen",
                "window_edge": "a message begun before a measurement window opened",
                "hold_stale": "a held request the hop never forwarded"}


def _links(stages: list[Stage]) -> dict[tuple[str, str], dict[str, float]]:
    """{(leg, receiver): {"wire": count/txn, "arrival": count/txn, "processing": count/txn}}"""
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
        elif kind == "hop" or (kind, who) in (("backend", "execute"), ("client", "pgbench")):
            link, who = "processing", ("backend" if kind == "backend" else "pgbench" if kind == "client" else who)
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
    if err > 0:
        return {"short_us_per_txn": short_us, "leg": None, "interval": None,
                "statement": ("the stages add up to more than the cycle: a span is counted twice, or the "
                              "measurement windows saw slower transactions than the run as a whole"),
                "evidence": None}
    links = _links(summary.stages)
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
    role = who if who == "backend" else "client" if who == "pgbench" else "hop"
    interval = {"wire": f"between the sender's send and the data being ready at {who} (wire.{who})",
                "arrival": f"between the data being ready at {who} and {who} reading it (its wakeup or queue)",
                "processing": f"at {who}, between reading the message and its next send ({PROCESSING[role]})"}[link]
    return {"short_us_per_txn": short_us, "leg": leg, "receiver": who, "link": link, "interval": interval,
            "count_per_txn": round(count, 3), "expected_per_txn": round(expected, 3),
            "statement": (f"the {leg} leg is short {interval}: it was measured {count:.2f} times per transaction "
                          f"where its neighbours were {expected:.2f}"),
            "evidence": evidence or None}
