"""The ctypes layer: handles die with their object; libbpf's log is kept per thread."""
import threading
from pathlib import Path

import pytest
from pathprof.agent.probing.bpf import libbpf as lb

OBJ = Path(__file__).resolve().parents[2] / "probes" / "pathprof.bpf.o"


@pytest.fixture
def obj():
    if not OBJ.exists():
        pytest.skip("probes not built (make -C probes)")
    return lb.BpfObject(str(OBJ))     # opened, not loaded: no root needed


def test_maps_and_programs_refuse_use_after_close(obj):
    with obj as o:
        lat, prog = o.maps["lat"], o.programs["pp_sched_switch"]
        assert lat.value_size > 0 and prog.section == "tp_btf/sched_switch"
    with pytest.raises(lb.BpfError, match="closed"):
        lat.fd
    with pytest.raises(lb.BpfError, match="closed"):
        prog.set_autoload(False)


def test_libbpf_log_is_per_thread():
    seen = {}

    def other():
        lb._lines().append("from the other thread\n")
        seen["other"] = lb._take_log()

    lb._take_log()
    lb._lines().append("from this thread\n")
    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen["other"] == "from the other thread\n"
    assert lb._take_log() == "from this thread\n"
