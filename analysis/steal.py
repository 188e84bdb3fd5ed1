"""Steal time: the CPU time a hypervisor gave to other work (other guests, its own threads) while this virtual
machine's CPUs had work to run (/proc/stat `steal`). Inside a guest it is invisible to every probe: a task whose
virtual CPU was not running still looks on-CPU, so whatever stage was running then is longer by it, and the
machine's busy time holds it too — both views still close, around time that was not the path's. A run on a noisy
cloud host is slower for a reason no stage names; this names it."""
from __future__ import annotations

NOTE_PCT = 1.0      # below this share of the CPUs' time steal is within a quiet host's noise: no note


def steal_figures(steal_ns: float | None, elapsed_ns: float | None, ncpu: int | None,
                  txns: int | None) -> dict | None:
    """{ns, pct (of the CPUs' time over the interval), us_per_txn}; None when the run did not record steal."""
    if steal_ns is None or not elapsed_ns or not ncpu:
        return None
    out = {"ns": int(steal_ns), "pct": round(100.0 * steal_ns / (elapsed_ns * ncpu), 2)}
    if txns:
        out["us_per_txn"] = round(steal_ns / 1e3 / txns, 2)
    return out


def steal_note(fig: dict | None, cycle_us: float | None = None) -> str | None:
    """One line for the notes when the hypervisor took a share worth saying, else None."""
    if not fig or fig["pct"] < NOTE_PCT:
        return None
    per_txn = fig.get("us_per_txn")
    cost = (f" ({per_txn:,.1f} µs of CPU per transaction"
            + (f", against a {cycle_us:,.1f}-µs cycle" if cycle_us else "") + ")") if per_txn else ""
    return (f"the hypervisor took {fig['pct']:.1f} % of this machine's CPU time while it had work (steal: "
            f"{fig['ns'] / 1e6:,.1f} ms{cost}): other guests on the same host ran instead, and every stage running "
            "then is longer by it. Compare runs on a quiet host, or on dedicated CPUs")
