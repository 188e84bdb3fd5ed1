"""KVM's failure to boot the guest is found out once per boot of the machine (topologies.guest.vm): the verdict is
kept by boot, qemu and guest kernel, and a later run of kvm-tap goes to TCG without the probe's wait."""
from pathlib import Path

import pytest
from pathprof.topologies.guest import vm


@pytest.fixture
def verdicts(tmp_path, monkeypatch):
    monkeypatch.setattr(vm, "KVM_VERDICTS", tmp_path / "verdicts")
    return tmp_path


def test_a_failure_is_remembered_for_that_kernel_only(verdicts):
    kernel, other = verdicts / "vmlinux", verdicts / "vmlinux-other"
    kernel.write_bytes(b"k")
    other.write_bytes(b"o")
    assert vm.kvm_failed_before(kernel) is None
    vm.remember_kvm_failure(kernel, "/dev/kvm opens; no output from the guest's init within 10 s")
    assert vm.kvm_failed_before(kernel) == "/dev/kvm opens; no output from the guest's init within 10 s"
    assert vm.kvm_failed_before(other) is None


def test_a_rebuilt_kernel_or_another_boot_tries_again(verdicts, monkeypatch):
    kernel = verdicts / "vmlinux"
    kernel.write_bytes(b"k")
    vm.remember_kvm_failure(kernel, "no output")
    kernel.write_bytes(b"k2")            # the image was rebuilt: a new kernel file
    import os
    os.utime(kernel, ns=(1, 1))
    assert vm.kvm_failed_before(kernel) is None
    vm.remember_kvm_failure(kernel, "no output")
    assert vm.kvm_failed_before(kernel) == "no output"
    real_read = Path.read_text

    def another_boot(self, *a, **kw):
        return "another-boot-id\n" if str(self) == "/proc/sys/kernel/random/boot_id" else real_read(self, *a, **kw)
    monkeypatch.setattr(Path, "read_text", another_boot)
    assert vm.kvm_failed_before(kernel) is None


def test_an_unwritable_place_is_not_an_error(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setattr(vm, "KVM_VERDICTS", blocker / "sub")     # a file where the directory would go
    kernel = tmp_path / "vmlinux"
    kernel.write_bytes(b"k")
    vm.remember_kvm_failure(kernel, "no output")
    assert vm.kvm_failed_before(kernel) is None
