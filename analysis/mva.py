"""Mean-value analysis (MVA) of a closed queueing network: the solver behind `pathprof predict`.

N clients circulate through a set of centres; each transaction visits every centre once with a *demand* (µs of
service per transaction). Exact MVA (Reiser & Lavenberg) adds one client at a time:

    R_k(n) = D_k * (1 + Q_k(n-1))          a queueing centre (one server)
    R_k(n) = D_k                           a delay centre (no waiting: wire time, a delay line, think time)
    X(n)   = n / (Z + sum_k R_k(n))        throughput (transactions per µs)
    Q_k(n) = X(n) * R_k(n)                 Little's law at each centre

A centre with m servers (the CPUs as a whole, pgbench's worker threads) uses Seidmann's approximation: a
single-server queue of demand D/m followed by a delay of D*(m-1)/m. It is exact at one client (R = D) and at
saturation (X -> m/D), and within a few % between for m = 2.

A centre may *overlap* another (`overlaps=True`): a hop process holds its one thread while it runs on a CPU, so
its service time is already counted at the CPUs; only its waiting for the thread, R_k - D_k, is added to the
cycle. Its queue still limits throughput to 1/D_k.

A queueing centre may do part of its work *beside the path* (`serial_us` < demand): the CPUs' work that no
transaction waits for (a backend's bookkeeping after its reply is sent, ACKs, a client's other connections) runs
on a free CPU while the path goes on. It takes capacity (utilisation and the queue use the whole demand) but only
the serial part is on the cycle: R_k(n) = the queue's residence - (D_k - S_k). At one client the CPUs' residence
is the path's own work; at saturation throughput is still servers / D_k.

A delay may be *idle-scaled*: the wakeup of a thread onto an idle CPU (the CPU leaving idle, an IPI) happens only
while CPUs are idle, so its time is scaled by the idle share of the CPU centre at the previous population.

Everything here is a pure function of numbers; analysis.predict builds the centres from a recorded run.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Centre:
    name: str
    demand_us: float                 # service per transaction (µs)
    servers: int = 1                 # 0 = a delay centre (infinite servers)
    overlaps: bool = False           # its service is counted at another centre (a process thread on a CPU)
    idle_scaled: bool = False        # a delay that happens only while the CPU centre is idle
    serial_us: float | None = None   # the part of the demand on the transaction's path (None: all of it)


@dataclass
class Solution:
    clients: int
    tps: float                       # transactions per second
    cycle_us: float                  # clients / throughput: think time + residence everywhere
    residence_us: dict[str, float] = field(default_factory=dict)
    utilisation: dict[str, float] = field(default_factory=dict)   # per server, 0..1
    bottleneck: str | None = None    # the centre with the highest utilisation


def solve(centres: list[Centre], clients: int, think_us: float = 0.0, cpu_centre: str | None = None,
          background_util: float = 0.0) -> Solution:
    """Exact MVA (Seidmann for multi-server centres) up to `clients`; returns the solution at `clients`.
    `cpu_centre` names the centre whose idle share scales idle-scaled delays; `background_util` (0..1) is the
    share of it other work keeps busy, which keeps CPUs from idling too."""
    if clients < 1:
        raise ValueError("clients must be >= 1")
    if think_us < 0 or any(c.demand_us < 0 for c in centres):
        raise ValueError("demands and think time must be >= 0")
    waiting = {c.name: 0.0 for c in centres}     # customers in the queueing part of each centre
    util = {c.name: 0.0 for c in centres}
    busy = {c.name: 0.0 for c in centres}         # clients at a centre per server (in service or queued)
    cpu_servers = max(next((c.servers for c in centres if c.name == cpu_centre), 1), 1)
    x = 0.0
    res: dict[str, float] = {}
    for n in range(1, clients + 1):
        res, queued = {}, {}
        cycle = think_us
        # a woken process finds a CPU idle when the others' work there leaves one free: by the arrival theorem it
        # sees the network with one client fewer, whose clients at the CPUs (in service or queued) fill them
        cpu_idle = 1.0 - min(busy.get(cpu_centre, 0.0) + background_util, 1.0) if cpu_centre else 1.0
        for c in centres:
            if not c.servers:
                queued[c.name] = 0.0
                res[c.name] = c.demand_us * (cpu_idle if c.idle_scaled else 1.0)
            else:
                # Seidmann: a single-server queue of D/m, then a delay of D(m-1)/m (m = 1: the exact queue)
                queued[c.name] = c.demand_us / c.servers * (1.0 + waiting[c.name])
                res[c.name] = queued[c.name] + c.demand_us * (c.servers - 1) / c.servers
                if c.serial_us is not None and c.serial_us < c.demand_us:
                    res[c.name] -= c.demand_us - max(c.serial_us, 0.0)
            cycle += res[c.name] - c.demand_us if c.overlaps else res[c.name]
        x = n / cycle if cycle > 0 else float("inf")
        # never past a queue's capacity (servers / demand): the overlap and idle-delay corrections could
        # otherwise overshoot it near saturation
        x = min([x] + [c.servers / c.demand_us for c in centres if c.servers and c.demand_us > 0])
        for c in centres:
            waiting[c.name] = x * queued[c.name]
            util[c.name] = x * c.demand_us / c.servers if c.servers else 0.0
            busy[c.name] = x * res[c.name] / c.servers if c.servers else 0.0
        if cpu_centre in busy:      # a client waiting for an idle CPU to wake is one about to run on it
            busy[cpu_centre] += sum(x * res[c.name] for c in centres if c.idle_scaled) / cpu_servers
    queues = {c.name: util[c.name] for c in centres if c.servers}
    bottleneck = max(queues, key=queues.get) if queues else None
    return Solution(clients=clients, tps=x * 1e6, cycle_us=clients / x if x else float("inf"),
                    residence_us=res, utilisation=util, bottleneck=bottleneck)


def curve(centres: list[Centre], clients: list[int], think_us: float = 0.0,
          cpu_centre: str | None = None) -> list[Solution]:
    """Solutions at several client counts (each an exact solve; MVA is cheap at these sizes)."""
    return [solve(centres, n, think_us, cpu_centre) for n in clients]
