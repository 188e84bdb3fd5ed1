"""Clock offset between two hosts, estimated from the traffic itself, with a bound that holds by causality.

Host A's and host B's timestamps come from different clocks: t_B = t_A + θ (θ, the offset, is what we want).
A message sent by A at a_send (A's clock) and delivered on B at b_recv (B's clock) shows d_ab = b_recv - a_send
= δ_ab + θ, where δ_ab >= 0 is its true one-way delay; one from B to A shows d_ba = δ_ba - θ. Whatever the
delays, causality gives -min(d_ba) <= θ <= min(d_ab), so

    θ̂ = (min d_ab - min d_ba) / 2,   bound = (min d_ab + min d_ba) / 2    (half the minimum round trip)

and θ lies within θ̂ ± bound. This is minimum-delay filtering as NTP and Huygens do it: the fastest message
each way carries the least queueing, and the estimate is exact when the two fastest trips were equally fast.
`exchange_offset` is NTP's own form over request/response exchanges (t1 sent by A, t2 received by B, t3 sent
by B, t4 received by A; the exchange with the smallest round trip); taking the two directions' minima
separately, as `one_way_offset` does, is never looser. With θ̂ subtracted every corrected one-way delay is
>= the bound >= 0: wire stages computed this way are never negative.

Drift: `drift` estimates θ in consecutive time segments and fits a line through them, so a clock running at
another rate shows up as a slope (ppm) instead of widening the bound silently. `fit` decides which model the
trips support: a constant θ when one value lies inside every segment's causality interval [-min d_ba, min d_ab],
else θ(t) = θ0 + rate·(t - t0) (`LinearOffset`): the rate from the segments' centres, the trips detrended by
it, θ0 ± bound by the same minimum-delay rule on them. The bound then holds for every t as far as the clocks'
rates are constant over the run (NTP's frequency assumption); a clock that jumps contradicts both models.
All functions are pure (numbers in, numbers out); pathprof.analysis.merge feeds them the hosts' message markers.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class InconsistentClocks(ValueError):
    """The two directions' minima contradict causality (min d_ab + min d_ba < 0): the messages were joined
    wrongly, or a clock jumped during the run."""


@dataclass(frozen=True)
class Offset:
    offset_ns: float          # θ̂: host B's clock minus host A's
    bound_ns: float           # θ lies in offset_ns ± bound_ns
    min_ab_ns: float          # the fastest A -> B trip, as the clocks read it (δ + θ)
    min_ba_ns: float
    n_ab: int
    n_ba: int

    ppm = 0.0                 # a constant offset: no drift applied (LinearOffset has the same interface)

    def theta(self, t_ns=None):
        return self.offset_ns if t_ns is None else np.full(np.shape(t_ns), self.offset_ns, dtype=float)

    def corrected_ab(self, d_ab, ts_ab=None):
        """One-way delays A -> B on A's clock (each >= bound_ns >= 0); ts_ab is for LinearOffset's sake."""
        return np.asarray(d_ab, dtype=float) - self.offset_ns

    def corrected_ba(self, d_ba, ts_ba=None):
        return np.asarray(d_ba, dtype=float) + self.offset_ns

    def contains(self, theta_ns: float, t_ns=None) -> bool:
        return abs(theta_ns - self.offset_ns) <= self.bound_ns


def one_way_offset(d_ab, d_ba) -> Offset:
    """θ̂ ± bound from one-way trips: d_ab = b_recv - a_send of messages A -> B, d_ba = a_recv - b_send of
    messages B -> A (each host's timestamps on its own clock). ValueError without trips in both directions."""
    ab, ba = np.asarray(d_ab, dtype=float), np.asarray(d_ba, dtype=float)
    if not len(ab) or not len(ba):
        raise ValueError(f"a clock offset needs messages both ways (have {len(ab)} A->B, {len(ba)} B->A)")
    lo_ab, lo_ba = float(ab.min()), float(ba.min())
    if lo_ab + lo_ba < 0:
        raise InconsistentClocks(f"the fastest trips each way add up to {(lo_ab + lo_ba) / 1e3:.1f} µs < 0")
    return Offset((lo_ab - lo_ba) / 2, (lo_ab + lo_ba) / 2, lo_ab, lo_ba, len(ab), len(ba))


def exchange_offset(t1, t2, t3, t4) -> Offset:
    """NTP's estimate over request/response exchanges (arrays, one entry per exchange; t1/t4 on A's clock,
    t2/t3 on B's): θ̂ = ((t2 - t1) - (t4 - t3)) / 2 of the exchange with the smallest round trip
    (t4 - t1) - (t3 - t2), bound = half that round trip."""
    t1, t2, t3, t4 = (np.asarray(x, dtype=float) for x in (t1, t2, t3, t4))
    if not len(t1):
        raise ValueError("a clock offset needs at least one exchange")
    rtt = (t4 - t1) - (t3 - t2)
    i = int(np.argmin(rtt))
    if rtt[i] < 0:
        raise InconsistentClocks(f"an exchange's round trip is {rtt[i] / 1e3:.1f} µs < 0")
    return Offset(((t2[i] - t1[i]) - (t4[i] - t3[i])) / 2, rtt[i] / 2, t2[i] - t1[i], t4[i] - t3[i],
                  len(t1), len(t1))


@dataclass(frozen=True)
class Drift:
    ppm: float                # dθ/dt, parts per million (B's clock gaining on A's when positive)
    segments: list            # [(t_mid_ns on A's clock, Offset)]
    constant_fits: bool       # one θ lies inside every segment's interval: no drift is needed to explain them


def drift(ts_ab, d_ab, ts_ba, d_ba, segments: int = 4) -> Drift | None:
    """θ over time: the run cut into `segments` equal spans of A's clock (ts_*: the send times on A's clock for
    A -> B, the receive times on A's clock for B -> A), one_way_offset in each, a least-squares line through
    their centres. None when a segment lacks trips in either direction, or θ moved too much inside one for a
    constant to fit it (the data does not support a slope at this resolution)."""
    ts_ab, d_ab, ts_ba, d_ba = (np.asarray(x, dtype=float) for x in (ts_ab, d_ab, ts_ba, d_ba))
    if segments < 2 or not len(ts_ab) or not len(ts_ba):
        return None
    lo, hi = min(ts_ab.min(), ts_ba.min()), max(ts_ab.max(), ts_ba.max())
    if hi <= lo:
        return None
    edges = np.linspace(lo, hi, segments + 1)
    out = []
    for a, b in zip(edges[:-1], edges[1:]):
        m_ab, m_ba = (ts_ab >= a) & (ts_ab <= b), (ts_ba >= a) & (ts_ba <= b)
        if not m_ab.any() or not m_ba.any():
            return None
        try:
            out.append(((a + b) / 2, one_way_offset(d_ab[m_ab], d_ba[m_ba])))
        except InconsistentClocks:    # θ moved more within the segment than the trips allow: too coarse
            return None
    x = np.array([t for t, _ in out])
    y = np.array([o.offset_ns for _, o in out])
    slope = float(np.polyfit(x, y, 1)[0]) if len(out) >= 2 else 0.0
    lo_env = max(o.offset_ns - o.bound_ns for _, o in out)
    hi_env = min(o.offset_ns + o.bound_ns for _, o in out)
    return Drift(slope * 1e6, out, lo_env <= hi_env)


@dataclass(frozen=True)
class LinearOffset:
    """θ(t) = offset_ns + rate·(t - t0_ns), t on A's clock: B's clock runs at (1 + rate) times A's."""
    offset_ns: float          # θ at t0_ns
    bound_ns: float           # θ(t) lies in theta(t) ± bound_ns for every t of the run
    rate: float               # dθ/dt (ns per ns; × 1e6 = ppm)
    t0_ns: float
    min_ab_ns: float          # the fastest A -> B trip, detrended to t0
    min_ba_ns: float
    n_ab: int
    n_ba: int

    @property
    def ppm(self) -> float:
        return self.rate * 1e6

    def theta(self, t_ns):
        return self.offset_ns + self.rate * (np.asarray(t_ns, dtype=float) - self.t0_ns)

    def corrected_ab(self, d_ab, ts_ab):
        """One-way delays A -> B (ts_ab: their send times on A's clock), each >= bound_ns >= 0."""
        return np.asarray(d_ab, dtype=float) - self.theta(ts_ab)

    def corrected_ba(self, d_ba, ts_ba):
        """One-way delays B -> A (ts_ba: their receive times on A's clock)."""
        return np.asarray(d_ba, dtype=float) + self.theta(ts_ba)

    def contains(self, theta_ns: float, t_ns: float) -> bool:
        return abs(theta_ns - float(self.theta(t_ns))) <= self.bound_ns


def _segment_minima(ts_ab, d_ab, ts_ba, d_ba, segments: int) -> list[tuple[float, float, float]]:
    """[(t_mid, min d_ab, min d_ba)] of the segments that hold trips both ways."""
    lo, hi = min(ts_ab.min(), ts_ba.min()), max(ts_ab.max(), ts_ba.max())
    edges = np.linspace(lo, hi, segments + 1)
    out = []
    for a, b in zip(edges[:-1], edges[1:]):
        m_ab, m_ba = (ts_ab >= a) & (ts_ab <= b), (ts_ba >= a) & (ts_ba <= b)
        if m_ab.any() and m_ba.any():
            out.append(((a + b) / 2, float(d_ab[m_ab].min()), float(d_ba[m_ba].min())))
    return out


def fit(ts_ab, d_ab, ts_ba, d_ba, min_per_segment: int = 25, max_segments: int = 32) -> Offset | LinearOffset:
    """The clock model the trips support (module docstring): an Offset when a constant θ fits every segment,
    else a LinearOffset. Segments: as many as give ~min_per_segment trips each way (4 to max_segments).
    ValueError without trips both ways; InconsistentClocks when neither model fits (a clock jumped)."""
    ts_ab, d_ab, ts_ba, d_ba = (np.asarray(x, dtype=float) for x in (ts_ab, d_ab, ts_ba, d_ba))
    if not len(d_ab) or not len(d_ba):
        return one_way_offset(d_ab, d_ba)              # raises the ValueError that says what is missing
    segments = int(np.clip(min(len(d_ab), len(d_ba)) // min_per_segment, 4, max_segments))
    seg = _segment_minima(ts_ab, d_ab, ts_ba, d_ba, segments) if max(ts_ab.max(), ts_ba.max()) > min(
        ts_ab.min(), ts_ba.min()) else []
    if len(seg) < 3 or max(-b for _, _, b in seg) <= min(a for _, a, _ in seg):
        return one_way_offset(d_ab, d_ba)              # a constant θ lies in every segment's interval
    t = np.array([x[0] for x in seg])
    centres = np.array([(a - b) / 2 for _, a, b in seg])
    rate = float(np.polyfit(t, centres, 1)[0])
    t0 = float(t.mean())
    flat_ab = d_ab - rate * (ts_ab - t0)
    flat_ba = d_ba + rate * (ts_ba - t0)
    o = one_way_offset(flat_ab, flat_ba)
    return LinearOffset(o.offset_ns, o.bound_ns, rate, t0, o.min_ab_ns, o.min_ba_ns, o.n_ab, o.n_ba)
