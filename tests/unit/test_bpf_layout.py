"""The ctypes mirrors in pathprof.agent.probing.bpf.layout match the C layout clang put into the .bpf.o (BTF)."""
import ctypes as C
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from pathprof.agent.probing.bpf import layout as L

PROBES = Path(__file__).resolve().parents[2] / "probes"
OBJS = ["pathprof.bpf.o"]


def btf_structs() -> dict:
    if not shutil.which("bpftool"):
        pytest.skip("bpftool not installed")
    out = {}
    for obj in OBJS:
        path = PROBES / obj
        if not path.exists():
            pytest.skip(f"{obj} not built (make -C probes)")
        doc = json.loads(subprocess.run(["bpftool", "btf", "dump", "file", str(path), "-j"], check=True,
                                        capture_output=True, text=True).stdout)
        for t in doc["types"]:
            if t.get("kind") == "STRUCT" and t.get("name", "").startswith("pp_"):
                out[t["name"]] = t
    return out


@pytest.mark.parametrize("name", sorted(L.MIRRORS))
def test_mirror_matches_btf(name):
    structs = btf_structs()
    assert name in structs, f"struct {name} is not in the BTF of {OBJS}"
    t, mirror = structs[name], L.MIRRORS[name]
    assert C.sizeof(mirror) == t["size"], f"{name}: ctypes {C.sizeof(mirror)} != BTF {t['size']}"
    btf_members = {m["name"]: m["bits_offset"] // 8 for m in t["members"]}
    py_members = {f[0]: getattr(mirror, f[0]).offset for f in mirror._fields_ if not f[0].startswith("_pad")}
    assert py_members == btf_members


def test_histogram_slots_round_trip():
    # the inverse used by the views and the front end agrees with the BPF bucketing rule
    def slot(v):
        if v < 4:
            return v
        lg = v.bit_length() - 1
        return min(4 * (lg - 1) + ((v >> (lg - 2)) & 3), L.HIST_SLOTS - 1)
    for v in [0, 1, 3, 4, 5, 7, 8, 9, 15, 16, 1000, 123456, 2**31 + 5]:
        lo, hi = L.slot_bounds(slot(v))
        assert lo <= v < hi


def test_lat_index_round_trip():
    for stage, role, leg, hop in [(1, 2, 1, 0), (6, 1, 4, 0), (3, 6, 3, 5)]:
        for hop_slots in (hop + 1, L.MAX_HOPS):
            idx = (((stage - 1) * L.NROLES + role) * L.NLEGS + leg) * hop_slots + hop
            assert L.lat_key(idx, hop_slots) == (stage, role, leg, hop)
    assert L.nf_key(((2 * 5 + 3) * 2 + 1) * 2 + 1) == (2, 3, 3, True)


def test_abi_json_is_what_the_object_says_now():
    """abi.json is a build product of pathprof.bpf.o's BTF: regenerated from the object now, it is identical
    (a stale one would mirror a layout the programs no longer have)."""
    if not shutil.which("bpftool"):
        pytest.skip("bpftool not installed")
    raw = subprocess.run(["bpftool", "-j", "btf", "dump", "file", str(PROBES / "pathprof.bpf.o"), "format", "raw"],
                         check=True, capture_output=True, text=True).stdout
    fresh = subprocess.run(["python3", str(PROBES / "gen_abi.py")], input=raw, check=True, capture_output=True,
                           text=True).stdout
    assert json.loads(fresh) == json.loads((PROBES / "abi.json").read_text())


def test_name_tables_come_from_the_c_enums():
    """Every stage and counter the C side defines has its name on the Python side, by the enum's own name."""
    header = (PROBES / "common.h").read_text()
    import re
    for prefix, table in (("PP_ST_", L.STAGES), ("PP_STAT_", L.STATS)):
        for name, value in re.findall(rf"\b{prefix}([A-Z0-9_]+)\s*=\s*(\d+)", header):
            assert table[int(value)] == name.lower(), (prefix + name, table.get(int(value)))
    assert L.NUSDT == int(re.search(r"#define PP_NUSDT (\d+)", header).group(1))
    assert (L.MAX_PORTS, L.MAX_HOPS) == (int(re.search(r"#define PP_MAX_PORTS\s+(\d+)", header).group(1)),
                                         int(re.search(r"#define PP_MAX_HOPS\s+(\d+)", header).group(1)))


def test_a_stale_abi_is_refused(tmp_path, monkeypatch):
    """An abi.json older than the object it describes is refused with the command that rebuilds it."""
    import os

    from pathprof.errors import RequirementError
    (tmp_path / "pathprof.bpf.o").write_bytes(b"")
    (tmp_path / "abi.json").write_text((PROBES / "abi.json").read_text())
    os.utime(tmp_path / "abi.json", (1, 1))
    monkeypatch.setattr(L, "_probes_dir", lambda: tmp_path)
    with pytest.raises(RequirementError, match="make -C"):
        L._load_abi()


@pytest.mark.skipif(os.geteuid() != 0, reason="BPF needs root")
def test_what_the_c_side_writes_reads_back_through_the_mirrors():
    """BPF_PROG_TEST_RUN (probes/state_check.bpf.o, pathprof.bpf.o's shared helpers): a span of 1000 ns and one
    CPU switch, written by the C code, read through the ctypes mirrors field by field."""
    from pathprof.agent.probing.bpf import libbpf as lb
    o = lb.BpfObject(str(PROBES / "state_check.bpf.o"))
    o.set_rodata(lat_hops=C.c_uint32(2))
    o.maps["lat"].set_max_entries(L.lat_entries(2))
    o.load()
    try:
        wire, backend, response, hop = 1, L.ROLES["backend"], 3, 1
        o.programs["check_span"].test_run(b"", b"".join(bytes(C.c_uint64(v)) for v in
                                                        (wire, backend, response, hop, 1000)))
        idx = (((wire - 1) * L.NROLES + backend) * L.NLEGS + response) * 2 + hop
        per_cpu = o.maps["lat"].lookup(bytes(C.c_uint32(idx)))
        stride = C.sizeof(L.Hist)
        h = [L.Hist.from_buffer_copy(per_cpu, i * stride) for i in range(len(per_cpu) // stride)]
        (used,) = [x for x in h if x.count]
        lo, hi = L.slot_bounds(next(i for i, n in enumerate(used.slots) if n))
        assert (used.sum_ns, used.count, sum(used.slots)) == (1000, 1, 1) and lo <= 1000 < hi
        assert o.programs["check_cpu_acc"].test_run(b"", bytes(C.c_uint64(backend)) + bytes(C.c_uint64(0))) == 1
        per_cpu = o.maps["cpuacc"].lookup(bytes(C.c_uint32(backend * L.MAX_HOPS)))
        stride = C.sizeof(L.CpuVal)
        vals = [L.CpuVal.from_buffer_copy(per_cpu, i * stride) for i in range(len(per_cpu) // stride)]
        assert sum(v.switches for v in vals) == 1 and sum(v.oncpu_ns + v.runq_cnt for v in vals) == 0
    finally:
        o.close()
