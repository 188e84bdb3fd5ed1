"""The kvm-tap guest: image recipe and qemu command line (fast, no root). The real boot is the kvm-tap run of
test_hops_probed.py; it builds the guest image on first use (~1-2 min, cached under /var/cache/pathprof/guest/ for later
tests and runs) and boots it under KVM or, where KVM is unusable as on the project's machines, TCG.
"""
import lzma
import re
import shutil
import struct

import pytest
from pathprof.errors import UserError
from pathprof.topologies.guest import GuestImage, GuestVM, Recipe
from pathprof.topologies.guest.image import _cpio_newc, _module_files, _uncompressed_kernel

TAP = "pp-tb-tap0"
GUEST_IP, MAC = "198.18.200.2/24", "52:54:00:c8:00:02"


# --- unit: recipe, command line, build helpers ---------------------------------------------------------------

def test_recipe_digest_tracks_content(tmp_path):
    a, b = Recipe(), Recipe()
    assert a.digest() == b.digest()
    assert Recipe(packages=("postgresql-15", "pgbouncer")).digest() != a.digest()
    assert Recipe(pg_settings=(("max_connections", "500"),)).digest() != a.digest()
    img = GuestImage(cache_root=tmp_path)
    assert img.path.parent == tmp_path and a.digest()[:16] in img.key
    assert GuestImage(Recipe(free_mb=1), cache_root=tmp_path).path != img.path
    assert not img.is_built()
    assert img.kernel_path.name == "vmlinuz"  # nothing built: falls back to the bzImage name


def _vm(tmp_path, **kw):
    return GuestVM(GuestImage(cache_root=tmp_path / "cache"), TAP, GUEST_IP, "198.18.200.1", MAC,
                   state_dir=tmp_path / "state", **kw)


def test_qemu_argv_tcg(tmp_path):
    vm = _vm(tmp_path, memory_mb=512, cpus=3)
    argv = vm.qemu_argv("tcg", False)
    joined = " ".join(argv)
    assert argv[0] == "qemu-system-x86_64"
    assert argv[argv.index("-accel") + 1] == "tcg,thread=multi"
    assert argv[argv.index("-netdev") + 1] == f"tap,id=n0,ifname={TAP},script=no,downscript=no"
    assert argv[argv.index("-device") + 1] == f"virtio-net-pci,netdev=n0,mac={MAC}"
    assert "snapshot=on" in argv[argv.index("-drive") + 1]  # the cached image must stay pristine
    assert argv[argv.index("-m") + 1] == "512" and argv[argv.index("-smp") + 1] == "3"
    cmdline = argv[argv.index("-append") + 1]
    assert "pp.ip=198.18.200.2/24" in cmdline and "pp.gw=198.18.200.1" in cmdline and "console=ttyS0" in cmdline
    assert f"path={tmp_path / 'state' / 'console.log'}" in joined
    assert "vhost" not in joined


def test_qemu_argv_kvm_vhost(tmp_path):
    argv = _vm(tmp_path).qemu_argv("kvm", True)
    assert argv[argv.index("-accel") + 1] == "kvm" and argv[argv.index("-cpu") + 1] == "host"
    assert argv[argv.index("-netdev") + 1].endswith(",vhost=on")


def test_bad_arguments(tmp_path):
    with pytest.raises(UserError, match="prefix length"):
        GuestVM(GuestImage(cache_root=tmp_path), TAP, "198.18.200.2", "198.18.200.1", MAC, state_dir=tmp_path)
    with pytest.raises(UserError, match="accelerator"):
        _vm(tmp_path, accel="hvf")


def test_long_state_dir_gets_short_sockets(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    vm = GuestVM(GuestImage(cache_root=tmp_path), TAP, GUEST_IP, "198.18.200.1", MAC, state_dir=deep)
    sock = re.search(r"path=([^,]*qmp|[^,]*ctl\.sock)", " ".join(vm.qemu_argv("tcg", False))).group(1)
    assert len(sock) < 100
    shutil.rmtree(vm._sock_dir, ignore_errors=True)


def test_module_dependencies_first(tmp_path):
    kdir = tmp_path / "kernel"
    for name, deps in (("ext4", "jbd2,mbcache"), ("jbd2", ""), ("mbcache", ""), ("virtio-net", "virtio")):
        p = kdir / "sub" / f"{name}.ko"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"\x7fELF junk\0license=GPL\0depends=" + deps.encode() + b"\0vermagic=x\0")
    got = [n for n, _ in _module_files(kdir, ("ext4", "virtio_net", "builtin_thing"))]
    assert got == ["jbd2", "mbcache", "ext4", "virtio_net"]  # virtio is not in the tree: built in


def test_cpio_and_kernel_extraction():
    blob = _cpio_newc({"init": (b"#!/bin/sh\n", 0o755)})
    assert blob.startswith(b"070701") and b"TRAILER!!!\0" in blob and b"dev/console\0" in blob
    assert len(blob) % 4 == 0
    elf = b"\x7fELF" + struct.pack("<I", 42) * 100
    fake = b"MZ setup code" + b"\0" * 500 + lzma.compress(elf, format=lzma.FORMAT_XZ) + b"trailer"
    assert _uncompressed_kernel(fake) == elf
    assert _uncompressed_kernel(b"no payload here") is None


# The real boot (image from the cache, KVM or TCG, pgbench behind the tap, clean power-off, the cached image kept)
# is tests/integration/test_hops_probed.py::test_kvm_tap_shows_the_tap_and_qemu: one boot for the suite.
