"""The log-linear latency histogram, the one Python definition of it (the BPF side is probes/hist.bpf.h;
tests/unit/test_bpf_layout.py checks that the two agree, and pathprof.agent.probing.bpf.layout mirrors struct pp_hist
with these constants).

Slots: values 0..3 ns have a slot each, then 4 slots per power of two (4-5-6-7 << k), up to 2^32 ns."""
from __future__ import annotations

HIST_SLOTS = 128              # PP_HIST_SLOTS
HIST_WORDS = 2 + HIST_SLOTS   # u64 words of one struct pp_hist: sum_ns, count, slots


def slot_bounds(i: int) -> tuple[float, float]:
    """[low, high) in ns of slot i (the inverse of hist_slot() in probes/hist.bpf.h)."""
    if i < 4:
        return float(i), float(i + 1)
    octave, sub = i // 4 + 1, i % 4
    low = (4 + sub) << (octave - 2)
    return float(low), float(low + (1 << (octave - 2)))


def quantile(hist, q: float) -> float | None:
    """q-quantile (ns) of a histogram, interpolated inside its slot; None for an empty one."""
    if hist is None:
        return None
    h = [int(x) for x in hist]
    total = sum(h)
    if not total:
        return None
    want, acc = q * total, 0
    for i, c in enumerate(h):
        if c and acc + c >= want:
            lo, hi = slot_bounds(i)
            return lo + (hi - lo) * (want - acc) / c
        acc += c
    return slot_bounds(len(h) - 1)[1]


def merge(hists) -> list | None:
    """Slot-wise sum of histograms (None entries skipped; None when there are none)."""
    hists = [h for h in hists if h is not None]
    if not hists:
        return None
    out = [0] * HIST_SLOTS
    for h in hists:
        for i, c in enumerate(h):
            out[i] += int(c)
    return out
