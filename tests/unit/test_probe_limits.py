"""The probes refuse what they cannot follow instead of dropping it (more ports or namespaces than the maps have)."""
import pytest
from pathprof.agent.probing.bpf import layout as L
from pathprof.agent.probing.session import ProbeConfig, ProbeSession
from pathprof.errors import UserError


def test_too_many_service_ports_is_refused():
    s = ProbeSession(ProbeConfig(level="basic", service_ports=list(range(6000, 6000 + L.MAX_PORTS + 1))))
    with pytest.raises(UserError, match=f"at most {L.MAX_PORTS} service ports"):
        s.start()
    assert s.main is None and not s.started


def test_too_many_namespaces_is_refused():
    s = ProbeSession(ProbeConfig(level="basic", netns=[f"pp-x{i}" for i in range(L.MAX_NETNS)]))
    with pytest.raises(UserError, match=f"at most {L.MAX_NETNS - 1} network namespaces"):
        s._netns_inodes()
