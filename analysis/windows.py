"""Transactions inside and outside the probes' measurement windows, from pgbench's per-transaction log.

The detailed probes are attached only inside windows (pathprof.agent.probing.session), so the stage and CPU tables
describe the transactions that ended inside them: the views divide by *those* (`in_windows.txns`), close the
latency view against their TPS and mean latency, and the CPU view against the busy time during the windows.
Outside the windows nothing but fork/exit is attached, so TPS outside is the unperturbed rate, and
    probe_overhead_pct     = 1 - TPS in windows / TPS outside   (what the probes cost while attached)
    probe_overhead_run_pct = 1 - TPS of the whole run / TPS outside   (the run's average perturbation,
                             attach/detach edges included)
Each window dict carries {attach,start,end,detached}_{realtime,mono}_ns; the intervals [attach, start) and
(end, detached] (the agent attaching and detaching) count as neither inside nor outside.
`in_windows.client_s` is the clients' time inside the windows, each client from the run's first transaction start
to its own last transaction end: at the end of a run (-T) a client that finished waits for the others, which may
be seconds when one of them is in a SYN retransmission wait (a lossy link under -C), and that wait is no
transaction's. The latency view's cycle is client_s / txns (clients / TPS when every client ran to the end).
A window's opening cuts each client's transaction in flight: the probes drop every pairing begun before it (its
wait has no start inside the window), so from the opening to that transaction's end the client's time is in no
stage -- microseconds on a healthy path, a whole retransmission wait (~200 ms per client) on a lossy one, where
an always-on window opening a few ms after pgbench's first transactions left the view 6-7 % short
(`compare ... docker-dnat:link=container:loss_pct=2 --duration 3`, 2026-11-29). Each client's time in a window
therefore starts at the end of its first transaction there when that one began before the window opened
(`in_windows.opening_s`: the time so left out); the parts of it the probes did time are ~µs.
With a connection per transaction (-C) and several clients on a pgbench thread, a client that closed waits for its
thread to connect it again, and that wait is a stage (connect.thread_wait) until the thread's last change, even
when the run's end leaves it no transaction: its time then runs to its thread's last transaction end, not its
own (8 clients on 2 threads over a 2 % lossy wire, a thread held 3.3 s by one client's SYN retransmissions while
two of its clients had ended: +25.5 % before, +0.2 % so).
pgbench logs each transaction's end time as epoch seconds + µs; a log in another clock (monotonic, small
numbers) is matched against the windows' monotonic times instead.
"""
from __future__ import annotations

import numpy as np

MIN_OUTSIDE_S = 1.0      # less than this outside the windows: no reference rate, no overhead figure
MIN_OUTSIDE_TXNS = 100
MIN_REFERENCE_S = 0.25   # ...and for the headline's unprobed TPS at least this (and those transactions) outside


def _intervals(windows: list[dict], clock: str) -> tuple[list, list]:
    inside, edges = [], []
    for w in windows:
        get = lambda k: w.get(f"{k}_{clock}_ns")  # noqa: E731
        s, e = get("start"), get("end")
        if s is None or e is None:
            continue
        inside.append((s / 1e3, e / 1e3))
        a, d = get("attach"), get("detached")
        if a is not None and a < s:
            edges.append((a / 1e3, s / 1e3))
        if d is not None and d > e:
            edges.append((e / 1e3, d / 1e3))
    return inside, edges


def _mask(ends: np.ndarray, ivs: list) -> np.ndarray:
    m = np.zeros(len(ends), dtype=bool)
    for lo, hi in ivs:
        m |= (ends >= lo) & (ends < hi)
    return m


def _overlap(ivs: list, lo: float, hi: float) -> float:
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in ivs)


def _part(n: int, dur_us: float, lat: np.ndarray) -> dict:
    lat = lat[lat >= 0]
    return {"txns": int(n), "duration_s": round(dur_us / 1e6, 4),
            "tps": round(n / (dur_us / 1e6), 2) if dur_us > 0 else None,
            "latency_ms_mean": round(float(lat.mean()) / 1e3, 6) if len(lat) else None}


def _per_client(ids: np.ndarray, into: np.ndarray | None, fill, dtype="float64") -> np.ndarray:
    """A per-client array (index = pgbench's client id) holding `into`, grown to cover `ids` with `fill`."""
    size = max(int(ids.max()) + 1 if len(ids) else 0, 0 if into is None else len(into))
    out = np.full(size, fill, dtype=dtype)
    if into is not None:
        out[:len(into)] = into
    return out


def _last_ends(clients: np.ndarray, ends: np.ndarray, into: np.ndarray | None = None) -> np.ndarray:
    """Each client's last transaction end (index = pgbench's client id, -inf for a client with none)."""
    ids = np.asarray(clients, dtype="int64")
    out = _per_client(ids, into, -np.inf)
    np.maximum.at(out, ids, ends)
    return out


def _client_s(inside: list, lo: float, last_ends: np.ndarray) -> float:
    """The clients' time inside the windows (s), each from `lo` (the run's first transaction start) to its last end."""
    return round(sum(_overlap(inside, lo, hi) for hi in last_ends if hi > lo) / 1e6, 4)


class OpeningCuts:
    """Per client, across the log's chunks (each client's transactions in order, as pgbench writes them): the
    clients' time from each window's opening to the end of their first transaction in it, when that one began
    before the opening (module docstring)."""

    def __init__(self, inside: list):
        self.opens = np.array([a for a, _ in inside], dtype="float64")
        self.closes = np.array([b for _, b in inside], dtype="float64")
        self.seen = np.full(0, -1, dtype="int64")     # per client id: the last window whose first one was taken
        self.us = 0.0

    def add(self, ends: np.ndarray, lat: np.ndarray, clients: np.ndarray) -> None:
        n_w = len(self.opens)
        if not n_w or not len(ends):
            return
        ids = np.asarray(clients, dtype="int64")
        self.seen = _per_client(ids, self.seen, -1, "int64")
        w = np.searchsorted(self.opens, ends, side="right") - 1
        ok = (w >= 0) & (lat >= 0)
        ok[ok] &= ends[ok] < self.closes[w[ok]]
        rows = np.flatnonzero(ok)
        if not len(rows):
            return
        keys, first = np.unique(ids[rows] * n_w + w[rows], return_index=True)   # first row per (client, window)
        c, k, r = keys // n_w, keys % n_w, rows[first]
        new = k > self.seen[c]
        c, k, r = c[new], k[new], r[new]
        cut = (ends[r] - lat[r]) < self.opens[k]
        self.us += float(np.sum(ends[r][cut] - self.opens[k][cut]))
        np.maximum.at(self.seen, c, k)


def _to_thread_ends(last_ends: np.ndarray, thread_of: np.ndarray) -> np.ndarray:
    """Each client's last end raised to its thread's last transaction end (module docstring: -C)."""
    out = last_ends.copy()
    n = min(len(out), len(thread_of))
    for t in np.unique(thread_of[:n][thread_of[:n] >= 0]):
        m = np.zeros(len(out), dtype=bool)
        m[:n] = thread_of[:n] == t
        out[m] = out[m].max()
    return out


def _threads_of(clients: np.ndarray, threads: np.ndarray, into: np.ndarray | None = None) -> np.ndarray:
    ids = np.asarray(clients, dtype="int64")
    out = _per_client(ids, into, -1, "int64")
    out[ids] = np.asarray(threads, dtype="int64")
    return out


def _add_client_s(part: dict, inside: list, lo: float, last_ends: np.ndarray, cuts: OpeningCuts) -> None:
    part["client_s"] = round(_client_s(inside, lo, last_ends) - cuts.us / 1e6, 4)
    part["opening_s"] = round(cuts.us / 1e6, 4)


def split(ends_us: np.ndarray, lat_us: np.ndarray, windows: list[dict], clients: np.ndarray | None = None,
          threads: np.ndarray | None = None) -> dict:
    """ends_us: each transaction's end time (µs); lat_us: its latency (µs); clients: its pgbench client id (adds
    in_windows.client_s); threads: its client's pgbench thread, for a run with a connection per transaction
    (a closed client's wait for its thread is a stage). Returns {in_windows, outside_windows, edges,
    probe_overhead_pct, probe_overhead_run_pct, log_clock}."""
    ends = np.asarray(ends_us, dtype="float64")
    lat = np.asarray(lat_us, dtype="float64")
    out = {"in_windows": _part(0, 0.0, lat[:0]), "outside_windows": _part(0, 0.0, lat[:0]),
           "edges": {"txns": 0, "duration_s": 0.0}, "probe_overhead_pct": None, "probe_overhead_run_pct": None,
           "log_clock": None}
    if not len(ends) or not windows:
        return out
    clock = "realtime" if np.median(ends) > 1e15 else "mono"     # µs since 1970 vs since boot
    out["log_clock"] = clock
    inside, edges = _intervals(windows, clock)
    lo, hi = float(np.min(ends - np.clip(lat, 0, None))), float(np.max(ends))   # first start .. last end
    m_in = _mask(ends, inside)
    m_edge = _mask(ends, edges) & ~m_in
    m_out = ~(m_in | m_edge)
    d_in, d_edge = _overlap(inside, lo, hi), _overlap(edges, lo, hi)
    d_out = max(hi - lo - d_in - d_edge, 0.0)
    out["in_windows"] = _part(int(m_in.sum()), d_in, lat[m_in])
    if clients is not None:
        cuts = OpeningCuts(inside)
        cuts.add(ends, lat, clients)
        last = _last_ends(clients, ends)
        if threads is not None:
            last = _to_thread_ends(last, _threads_of(clients, threads))
        _add_client_s(out["in_windows"], inside, lo, last, cuts)
    out["outside_windows"] = _part(int(m_out.sum()), d_out, lat[m_out])
    out["edges"] = {"txns": int(m_edge.sum()), "duration_s": round(d_edge / 1e6, 4)}
    tin, tout = out["in_windows"]["tps"], out["outside_windows"]["tps"]
    if tout and d_out / 1e6 >= MIN_OUTSIDE_S and m_out.sum() >= MIN_OUTSIDE_TXNS:
        if tin:
            out["probe_overhead_pct"] = round(100.0 * (1.0 - tin / tout), 2)
        if hi > lo:
            out["probe_overhead_run_pct"] = round(100.0 * (1.0 - len(ends) / ((hi - lo) / 1e6) / tout), 2)
    return out


EXACT_US = 100_000          # latencies below this are counted per µs (exact); above, per ms


class LogStats:
    """One streaming pass over pgbench's per-transaction log, in chunks: the run's latency percentiles and the
    windows split, with memory that does not grow with the run's length (counts per µs of latency up to 100 ms,
    per ms above, and a few sums), where a whole-log DataFrame took ~16 bytes per transaction."""

    def __init__(self, windows: list[dict], thread_waits: bool = False):
        self.windows = windows
        self.thread_of = np.full(0, -1, dtype="int64") if thread_waits else None   # -C: each client's thread
        self.exact = np.zeros(EXACT_US, dtype=np.int64)
        self.coarse = np.zeros(1, dtype=np.int64)
        self.n = 0
        self.lat_sum = 0.0
        self.parts = {k: [0, 0.0, 0] for k in ("in", "out", "edge")}   # txns, latency sum, latencies counted
        self.lo, self.hi = float("inf"), float("-inf")
        self.clock = None
        self._ivs = None
        self.last_ends = None     # each client's last transaction end, when the log names the clients
        self._cuts: OpeningCuts | None = None

    def add(self, ends_us: np.ndarray, lat_us: np.ndarray, clients: np.ndarray | None = None,
            thread: int | None = None) -> None:
        """A chunk of the log; `thread`: the pgbench thread its clients belong to (its file)."""
        ends, lat = np.asarray(ends_us, dtype="float64"), np.asarray(lat_us, dtype="float64")
        if not len(ends):
            return
        if clients is not None:
            self.last_ends = _last_ends(clients, ends, self.last_ends)
            if self.thread_of is not None and thread is not None:
                self.thread_of = _threads_of(clients, np.full(len(clients), thread), self.thread_of)
        ok = lat[lat >= 0].astype(np.int64)
        self.n += len(ok)
        self.lat_sum += float(ok.sum())
        self.exact += np.bincount(ok[ok < EXACT_US], minlength=EXACT_US)
        big = ok[ok >= EXACT_US] // 1000
        if len(big):
            counts = np.bincount(big)
            if len(counts) > len(self.coarse):
                self.coarse = np.concatenate([self.coarse, np.zeros(len(counts) - len(self.coarse), np.int64)])
            self.coarse[:len(counts)] += counts
        self.lo = min(self.lo, float(np.min(ends - np.clip(lat, 0, None))))
        self.hi = max(self.hi, float(np.max(ends)))
        if not self.windows:
            return
        if self.clock is None:
            self.clock = "realtime" if np.median(ends) > 1e15 else "mono"
            self._ivs = _intervals(self.windows, self.clock)
        inside, edges = self._ivs
        if clients is not None:
            if self._cuts is None:
                self._cuts = OpeningCuts(inside)
            self._cuts.add(ends, lat, clients)
        m_in = _mask(ends, inside)
        m_edge = _mask(ends, edges) & ~m_in
        for key, m in (("in", m_in), ("edge", m_edge), ("out", ~(m_in | m_edge))):
            part = lat[m]
            part = part[part >= 0]
            p = self.parts[key]
            p[0] += int(m.sum())
            p[1] += float(part.sum())
            p[2] += len(part)

    def percentiles(self) -> dict:
        """{mean, p50, p95, p99} in ms (exact to the µs below 100 ms, linear between ranks as pandas does)."""
        if not self.n:
            return {}
        c, cc = np.cumsum(self.exact), np.cumsum(self.coarse)

        def value_at(rank: int) -> float:       # the rank-th latency (0-based), in µs
            if rank < c[-1]:
                return float(np.searchsorted(c, rank, side="right"))
            return float(np.searchsorted(cc, rank - c[-1], side="right") * 1000)
        out = {"mean": self.lat_sum / self.n / 1000}
        for q, key in ((0.5, "p50"), (0.95, "p95"), (0.99, "p99")):
            k = q * (self.n - 1)
            a, b = value_at(int(np.floor(k))), value_at(int(np.ceil(k)))
            out[key] = (a + (b - a) * (k - np.floor(k))) / 1000
        return out

    def split(self) -> dict:
        """The same document as split() on the whole log."""
        empty = {"txns": 0, "duration_s": 0.0, "tps": None, "latency_ms_mean": None}
        out = {"in_windows": dict(empty), "outside_windows": dict(empty), "edges": {"txns": 0, "duration_s": 0.0},
               "probe_overhead_pct": None, "probe_overhead_run_pct": None, "log_clock": None}
        if self.clock is None:                   # no window, or no transaction was matched against them
            return out
        out["log_clock"] = self.clock
        inside, edges = self._ivs
        lo, hi = self.lo, self.hi
        d_in, d_edge = _overlap(inside, lo, hi), _overlap(edges, lo, hi)
        d_out = max(hi - lo - d_in - d_edge, 0.0)

        def part(key, dur):
            n, s, k = self.parts[key]
            return {"txns": n, "duration_s": round(dur / 1e6, 4), "tps": round(n / (dur / 1e6), 2) if dur > 0 else None,
                    "latency_ms_mean": round(s / k / 1e3, 6) if k else None}
        out["in_windows"], out["outside_windows"] = part("in", d_in), part("out", d_out)
        if self.last_ends is not None:
            last = self.last_ends if self.thread_of is None else _to_thread_ends(self.last_ends, self.thread_of)
            _add_client_s(out["in_windows"], inside, lo, last, self._cuts or OpeningCuts(inside))
        out["edges"] = {"txns": self.parts["edge"][0], "duration_s": round(d_edge / 1e6, 4)}
        tin, tout, n_out = out["in_windows"]["tps"], out["outside_windows"]["tps"], self.parts["out"][0]
        total = sum(p[0] for p in self.parts.values())
        if tout and d_out / 1e6 >= MIN_OUTSIDE_S and n_out >= MIN_OUTSIDE_TXNS:
            if tin:
                out["probe_overhead_pct"] = round(100.0 * (1.0 - tin / tout), 2)
            if hi > lo:
                out["probe_overhead_run_pct"] = round(100.0 * (1.0 - total / ((hi - lo) / 1e6) / tout), 2)
        return out
