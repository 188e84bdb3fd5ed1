"""The run's capability gate remembers a pass (per boot, per probe objects) and checks again when they change."""
from pathprof.agent.probing import doctor


def test_a_pass_is_remembered_until_the_probe_objects_change(tmp_path, monkeypatch):
    probes = tmp_path / "probes"
    probes.mkdir()
    for name in ("pathprof.bpf.o", "doctor.bpf.o"):
        (probes / name).write_bytes(b"x")
    calls = []
    monkeypatch.setattr(doctor, "PASSED_DIR", tmp_path / "passed")
    monkeypatch.setattr(doctor, "_probes_dir", lambda: probes)
    monkeypatch.setattr(doctor, "check_capabilities", lambda: calls.append(1) or [])
    doctor.require("basic")
    doctor.require("basic")
    assert len(calls) == 1
    doctor.require("deep")                       # another level: checked on its own
    assert len(calls) == 2
    (probes / "pathprof.bpf.o").write_bytes(b"rebuilt")
    doctor.require("basic")
    assert len(calls) == 3


def test_a_failure_is_not_remembered(tmp_path, monkeypatch):
    import pytest
    from pathprof.errors import RequirementError
    monkeypatch.setattr(doctor, "PASSED_DIR", tmp_path / "passed")
    calls = []
    monkeypatch.setattr(doctor, "check_capabilities",
                        lambda: calls.append(1) or [doctor.Capability("btf", False, "no BTF")])
    for _ in range(2):
        with pytest.raises(RequirementError, match="btf"):
            doctor.require("basic")
    assert len(calls) == 2
