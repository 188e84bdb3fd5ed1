"""Which transactions `--trace-sample N` takes: the probes' own rule (probes/pp_state.bpf.h, trace_sampled),
mirrored so analysis can say which of a host's transactions another host's agent sampled too.

A transaction's number is the TCP sequence number of its request's first byte on the client's connection
(probes/msg.bpf.h), which every host on the path reads alike; the probes take it when a multiplicative hash of
it is 0 modulo N. Agents on different hosts with the same N therefore sample the same transactions, and each
of them can tell the others' choice from the numbers alone."""
from __future__ import annotations

import numpy as np

KNUTH = 2654435761          # the 32-bit multiplicative hash constant the probes use


def trace_sampled(number, every: int):
    """True where the probes with --trace-sample `every` take the transaction numbered `number` (scalar or
    array; every <= 0: none)."""
    if every <= 0:
        return np.zeros(np.shape(number), dtype=bool) if np.ndim(number) else False
    n = np.asarray(number, dtype=np.uint64) & 0xFFFFFFFF
    hit = (((n * KNUTH) & 0xFFFFFFFF) >> 16) % every == 0
    return hit if np.ndim(number) else bool(hit)
