"""The band of a prediction from how far this machine's own checked predictions missed (#36: "the band no wider than
the error it has to cover").

Every `compare` and `sweep` predicts each run from the first and measures it (agent.cli.multi): a check. Its miss is
kept per question -- fewer clients, more clients, without a hop -- and shape of path (analysis.interleave.shape),
the last RECENT of each (agent.host.machine_costs.learn_from_check). From MIN_CHECKS checks of the question asked, a
prediction's band is the conformal one: the ceil((n + 1) * COVER)-th smallest of the n misses (the largest while n
is too small for that rank: then a next miss like them falls inside it n / (n + 1) of the time), at least
FLOOR_PCT. Below MIN_CHECKS the band is the run's own (predict._band: its per-second spread, closure and probe
effect), which on this VM said ±20-25 % for a hop's removal where its misses were 1-6 % (bench/predict, 2026-11-29
08:48; bench/predict_lib/checked_bands.py judges both kinds of band on a set's rounds).
"""
from __future__ import annotations

import math

from pathprof.analysis.interleave import shape

KEY = "prediction_miss_pct"
MIN_CHECKS = 3
RECENT = 20            # per question and shape of path: the machine's recent behaviour, not its whole history
COVER = 0.9
FLOOR_PCT = 1.0        # misses of a few tenths: the next run's own noise is still there
QUESTIONS = ("fewer clients", "more clients", "without a hop")


def question(base_clients: int, clients: int, without=()) -> str | None:
    """What a prediction asks of its base run, one of QUESTIONS, or None (the run itself, or another change)."""
    if without:
        return "without a hop"
    if clients < base_clients:
        return "fewer clients"
    if clients > base_clients:
        return "more clients"
    return None


def remembered(entry: dict | None, miss_pct: float, asked: str, hops, pair: str, at: str) -> dict:
    """The key's new entry: its samples with this check added, the last RECENT of each question and shape."""
    samples = [x for x in ((entry or {}).get("samples") or []) if isinstance(x, dict) and "value" in x]
    samples.append({"value": round(float(miss_pct), 2), "question": asked, "hop": shape(hops), "run": pair, "at": at})
    kept, seen = [], {}
    for x in reversed(samples):
        k = (x.get("question"), x.get("hop"))
        seen[k] = seen.get(k, 0) + 1
        if seen[k] <= RECENT:
            kept.append(x)
    return {"samples": list(reversed(kept)), "run": pair, "at": at}


def conformal_half(misses: list[float], cover: float = COVER) -> float:
    """Half-width covering `cover` of the next misses like these: the ceil((n+1)*cover)-th smallest |miss|."""
    m = sorted(abs(x) for x in misses)
    rank = min(math.ceil((len(m) + 1) * cover), len(m))
    return m[rank - 1]


def band(machine: dict | None, asked: str | None, hops=()) -> tuple[float | None, int, str]:
    """(the band's half-width in %, from how many checks, where from), or (None, n, "") below MIN_CHECKS."""
    if asked is None:
        return None, 0, ""
    entry, want = (machine or {}).get(KEY), (asked, shape(hops))
    chosen = [float(x["value"]) for x in ((entry or {}).get("samples") or []) if isinstance(x, dict)
              and isinstance(x.get("value"), (int, float)) and (x.get("question"), x.get("hop")) == want]
    if len(chosen) < MIN_CHECKS:
        return None, len(chosen), ""
    half = max(conformal_half(chosen), FLOOR_PCT)
    return half, len(chosen), (f"this machine's last {len(chosen)} checked predictions of {asked} on {shape(hops)} "
                               f"paths missed by {min(abs(x) for x in chosen):.1f}-{max(abs(x) for x in chosen):.1f} %")
