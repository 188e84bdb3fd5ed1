"""BPF_PROG_TEST_RUN of the helpers pathprof.bpf.c's program families share (pp_state.bpf.h, compiled into
probes/state_check.bpf.o unchanged): where a span and a CPU record land, and what is refused and counted."""
import ctypes as C
import os
from pathlib import Path

import numpy as np
import pytest

PROBES = Path(__file__).resolve().parents[2] / "probes"
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="BPF needs root")


def load(hop_slots: int, trace_every: int = 0):
    from pathprof.agent.probing.bpf import layout as L
    from pathprof.agent.probing.bpf import libbpf as lb
    o = lb.BpfObject(str(PROBES / "state_check.bpf.o"))
    o.set_rodata(lat_hops=C.c_uint32(hop_slots), trace_every=C.c_uint32(trace_every))
    o.maps["lat"].set_max_entries(L.lat_entries(hop_slots))     # as the session sizes it (ProbeSession.start)
    o.load()
    return o


@pytest.fixture
def one_hop_slot():
    """`attach` on a path with no hops: one hop slot (0, the server and its clients)."""
    o = load(1)
    yield o
    o.close()


def args(*values) -> bytes:
    return b"".join(bytes(C.c_uint64(v)) for v in values)


def lat_rows(o, hop_slots: int) -> dict:
    """{(stage, role, leg, hop): count} of the non-empty `lat` entries, decoded as the front end does."""
    from pathprof.agent.probing.bpf import layout as L
    out = {}
    for k, v in o.maps["lat"].items():
        a = np.frombuffer(v, np.uint64).reshape(-1, L.HIST_WORDS).sum(axis=0)
        if a[1]:
            out[L.lat_key(int.from_bytes(k, "little"), hop_slots)] = int(a[1])
    return out


def stat(o, name: str) -> int:
    from pathprof.agent.probing.bpf import layout as L
    idx = {v: k for k, v in L.STATS.items()}[name]
    return int(np.frombuffer(o.maps["stats"].lookup(bytes(C.c_uint32(idx))), np.uint64).sum())


def role(name: str) -> int:
    from pathprof.agent.probing.bpf import layout as L
    return L.ROLES[name]


WIRE, REQUEST, RESPONSE = 1, 1, 3


def test_an_auxiliary_process_span_stays_in_its_own_role(one_hop_slot):
    """A walwriter (pg_aux, kind 3 in the hop field) sending on the response leg, on a path with one hop slot:
    its span is pg_aux's, never a neighbouring cell's (it used to land in a phantom hop.pooler stage)."""
    from pathprof.agent.probing.bpf import layout as L
    kind = L.AUX_KINDS["walwriter"]
    assert one_hop_slot.programs["check_span"].test_run(b"", args(WIRE, role("pg_aux"), RESPONSE, kind, 1000)) == 0
    assert lat_rows(one_hop_slot, 1) == {(WIRE, role("pg_aux"), RESPONSE, 0): 1}
    assert stat(one_hop_slot, "hop_overflow") == 0


def test_a_hop_beyond_the_slots_is_refused_and_counted(one_hop_slot):
    """A pooler with hop id 2 where the run sized one slot: not written anywhere, counted as hop_overflow."""
    assert one_hop_slot.programs["check_span"].test_run(b"", args(WIRE, role("pooler"), REQUEST, 2, 1000)) == 0
    assert lat_rows(one_hop_slot, 1) == {}
    assert stat(one_hop_slot, "hop_overflow") == 1


def test_a_hop_within_the_slots_lands_in_its_slot():
    o = load(3)
    try:
        o.programs["check_span"].test_run(b"", args(WIRE, role("pooler"), REQUEST, 2, 1000))
        assert lat_rows(o, 3) == {(WIRE, role("pooler"), REQUEST, 2): 1}
        assert stat(o, "hop_overflow") == 0
    finally:
        o.close()


def test_cpu_records_out_of_range_are_refused_and_counted(one_hop_slot):
    from pathprof.agent.probing.bpf import layout as L
    prog = one_hop_slot.programs["check_cpu_acc"]
    assert prog.test_run(b"", args(role("pg_aux"), L.AUX_KINDS["other"])) == 1
    assert stat(one_hop_slot, "cpu_full") == 0
    assert prog.test_run(b"", args(role("pooler"), L.MAX_HOPS)) == 0      # no slot: refused, not wrapped
    assert prog.test_run(b"", args(L.NROLES, 0)) == 0
    assert stat(one_hop_slot, "cpu_full") == 2


@pytest.mark.parametrize("every", [1, 2, 7, 50])
def test_trace_sampling_is_the_rule_python_mirrors(every):
    """--trace-sample N takes a transaction by a hash of its number (a TCP sequence number every host reads
    alike): the probes' decision and pathprof.agent.probing.sampling's agree number by number, and take about
    1 in N of consecutive requests' sequence numbers (a request of 23 bytes after another)."""
    from pathprof.agent.probing.sampling import trace_sampled
    o = load(1, every)
    try:
        numbers = [0xFFFF_FFFF, 1, 2**31] + [(3_000_000_000 + 23 * i) & 0xFFFF_FFFF for i in range(400)]
        got = [o.programs["check_trace_sampled"].test_run(b"", args(n)) for n in numbers]
    finally:
        o.close()
    assert got == [int(x) for x in trace_sampled(np.array(numbers), every)]
    assert abs(sum(got[3:]) - 400 / every) <= max(3, 0.4 * 400 / every)


def test_a_map_without_batch_lookup_is_read_key_by_key_alike(one_hop_slot):
    """Per-CPU arrays have no BPF_MAP_LOOKUP_BATCH before Linux 5.11 (Debian 11's 5.10 answers ENOTSUPP, 524): the
    maps are then read with get_next_key and a lookup per entry, to the same pairs."""
    lat = one_hop_slot.maps["lat"]
    batch = lat.items()
    lat._no_batch = True
    assert lat.items() == batch and len(batch) == lat.max_entries
