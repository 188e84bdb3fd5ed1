"""--probes deep through uprobe_multi links (one per program) arms the same probes as libbpf's per-site links:
every USDT semaphore of a running postgres reads the same count inside a window (one per call site, so the
same sites), and 0 once the window is closed. How much faster the detach is: bench/probe_detach."""
import os
import struct

import pytest
from probe_harness import ThrowawayPostgres

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pg():
    if os.geteuid() != 0:
        pytest.skip("needs root")
    p = ThrowawayPostgres(55439).start()
    yield p
    p.stop()


def _semaphores(pid: int, binary: str, sites: list) -> dict:
    """The probes' semaphores (u16) as process `pid` sees them, through /proc/PID/maps and /proc/PID/mem."""
    real = os.path.realpath(binary)
    maps = []
    for line in open(f"/proc/{pid}/maps"):
        f = line.split()
        if len(f) >= 6 and os.path.realpath(f[5]) == real:
            lo, hi = (int(x, 16) for x in f[0].split("-"))
            maps.append((int(f[2], 16), lo, hi))
    out = {}
    with open(f"/proc/{pid}/mem", "rb") as mem:
        for prog, _offsets, semas, _ret in sites:
            for sema in {s for s in semas if s}:
                addr = next(lo + sema - off for off, lo, hi in maps if off <= sema < off + hi - lo)
                mem.seek(addr)
                out[(prog, sema)] = struct.unpack("<H", mem.read(2))[0]
    return out


def _window(pg, multi: bool, monkeypatch) -> tuple[dict, dict]:
    from pathprof.agent.probing.bpf import uprobe_multi
    from pathprof.agent.probing.postgres_probes import PostgresProbes
    from pathprof.agent.probing.session import ProbeConfig, ProbeSession
    monkeypatch.setattr(uprobe_multi, "supported", lambda: multi)
    s = ProbeSession(ProbeConfig(level="deep", service_ports=[pg.port]))
    sites = PostgresProbes(print).sites(s.config.postgres_bin)
    s.start()
    try:
        assert s._postgres.multi == multi
        s.track(pg.pid, "postmaster")
        s.open_window()
        inside = _semaphores(pg.pid, s.config.postgres_bin, sites)
        s.close_window()
        after = _semaphores(pg.pid, s.config.postgres_bin, sites)
    finally:
        s.close()
    return inside, after


def test_uprobe_multi_arms_the_same_semaphores_as_per_site_links(pg, monkeypatch):
    from pathprof.agent.probing.bpf import uprobe_multi
    if not uprobe_multi.supported():
        pytest.skip("this kernel has no uprobe_multi links")
    multi_in, multi_after = _window(pg, True, monkeypatch)
    site_in, site_after = _window(pg, False, monkeypatch)
    assert multi_in and multi_in == site_in, (multi_in, site_in)
    assert all(v >= 1 for v in multi_in.values()), multi_in
    assert set(multi_after.values()) == {0} and set(site_after.values()) == {0}
    # a probe with several call sites (lwlock__wait__start has 3 in PostgreSQL 15) counts each of them
    assert max(multi_in.values()) > 1, multi_in
