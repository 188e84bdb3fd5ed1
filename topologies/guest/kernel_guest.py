"""A guest booted on another Debian suite's kernel, with pathprof itself inside: how the probes are proven on kernels
other than the host's (issue 34). `bench/kernels` and tests/integration/test_kernel_guest.py drive it.

The image is a copy of the cached kvm-tap image (GuestImage: Debian 12 + PostgreSQL 15), grown, with what a run
needs installed into it by chroot (python3, iproute2, iptables, libbpf1, the suite's linux-image-amd64 and its
modules, ...). It boots that kernel with -kernel and a tiny initramfs of our own (busybox, the block and ext4
modules: Debian's own initramfs costs seconds of emulated udev), which switches to the disk and runs
/sbin/pp-kern-init. That init mounts the host's checkout read-only at its own path (9p: the .venv's absolute paths
stay valid; the guest's python3 is the host's, both Debian 12), and a writable output directory, runs the
commands file the host wrote there, and powers off. Cached under /var/cache/pathprof/kernel-guest/<suite>-<key>/;
the disk is booted with qemu's snapshot=on, so the cached file stays pristine and runs never share state.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import lzma
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pathprof.errors import UserError
from pathprof.topologies.guest.image import (
    GuestImage,
    _cpio_newc,
    _module_files,
    _uncompressed_kernel,
    host_mirrors,
)

CACHE_ROOT = Path(os.environ.get("PATHPROF_KERNEL_GUEST_CACHE", "/var/cache/pathprof/kernel-guest"))
SUITES = {"bullseye": "Debian 11", "bookworm": "Debian 12", "trixie": "Debian 13"}
PACKAGES = ("python3", "python3-venv", "iproute2", "iptables", "nftables", "conntrack", "kmod", "procps",
            "util-linux", "pgbouncer", "libbpf1", "bpftool", "postgresql-15", "busybox-static")
DISK_GB = 4
INITRD_MODULES = ("virtio", "virtio_ring", "virtio_pci_legacy_dev", "virtio_pci_modern_dev", "virtio_pci",
                  "virtio_blk", "crc16", "crc32c_generic", "libcrc32c", "mbcache", "jbd2", "ext4")
BUILD_FORMAT = 2
WARM_TEMPLATE = "from pathprof.agent.postgres.server import warm_template; warm_template()"

INITRAMFS_INIT = r"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
for m in $(cat /etc/pp-modules); do insmod /lib/modules/$m.ko 2>/dev/null; done
i=0; while [ ! -b /dev/vda ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done
mkdir -p /newroot
mount -t ext4 -o rw /dev/vda /newroot || { echo "pp-kern: cannot mount /dev/vda"; echo o > /proc/sysrq-trigger; }
mount --move /dev /newroot/dev; umount /proc /sys
exec switch_root /newroot /sbin/pp-kern-init
"""

# PID 1 on the disk: what a run needs mounted, the checkout and the output directory over 9p, the commands, poweroff
DISK_INIT = r"""#!/bin/sh
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 TERM=dumb
mount -t proc proc /proc; mount -t sysfs sysfs /sys
mkdir -p /dev/pts /dev/shm; mount -t devpts devpts /dev/pts; mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=0755 tmpfs /run; mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup; mount -t bpf bpf /sys/fs/bpf
mount -t tracefs tracefs /sys/kernel/tracing; mount -t debugfs debugfs /sys/kernel/debug
mkdir -p /run/postgresql /var/run/netns; chown postgres:postgres /run/postgresql
hostname pp-kern-guest; ip link set lo up
modprobe 9pnet_virtio; modprobe 9p
src=; for a in $(cat /proc/cmdline); do case $a in pp.src=*) src=${a#pp.src=};; esac; done
mkdir -p "$src" /pp-out
# the checkout does not change during a boot: cached (cache=loose), a run's imports are read over 9p once a boot,
# not once a run
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=524288 pp-src "$src" || echo "pp-kern: no checkout"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 pp-out /pp-out || echo "pp-kern: no output dir"
echo "pp-kern: $(uname -r) up; running /pp-out/commands.sh"
cd /tmp && sh /pp-out/commands.sh > /pp-out/output.log 2>&1
echo $? > /pp-out/rc
sync; echo "pp-kern: done (rc $(cat /pp-out/rc))"
echo o > /proc/sysrq-trigger
sleep 10
"""


def _progress(msg: str) -> None:
    print(f"pathprof: kernel guest: {msg}", file=sys.stderr, flush=True)


@dataclass
class GuestRun:
    rc: int | None          # the commands' exit status; None: the guest did not finish
    output: str             # their stdout and stderr
    console: str            # the guest's serial console
    seconds: float
    out_dir: Path

    @property
    def kernel_complaints(self) -> list[str]:
        """The guest kernel's lockup and stall reports: why a guest that did not finish did not."""
        return [line.strip() for line in self.console.splitlines()
                if "soft lockup" in line or "self-detected stall" in line or "hung_task" in line][:6]


class KernelGuest:
    def __init__(self, suite: str = "bookworm", cache_root: Path | None = None):
        if suite not in SUITES:
            raise UserError(f"unknown suite {suite!r}: one of {', '.join(SUITES)}")
        self.suite = suite
        self.base = GuestImage()
        doc = {"format": BUILD_FORMAT, "suite": suite, "base": self.base.key, "packages": PACKAGES,
               "initrd": INITRAMFS_INIT, "init": DISK_INIT, "modules": INITRD_MODULES, "disk_gb": DISK_GB}
        self.key = f"{suite}-{hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]}"
        self.cache_root = Path(cache_root or CACHE_ROOT)
        self.path = self.cache_root / self.key

    disk = property(lambda self: self.path / "disk.raw")
    manifest_path = property(lambda self: self.path / "manifest.json")

    @property
    def manifest(self) -> dict:
        return json.loads(self.manifest_path.read_text())

    def ensure(self, progress: Callable[[str], None] = _progress) -> Path:
        """Build the image unless cached (one builder per key at a time: parallel workers wait, then find it)."""
        if self.manifest_path.is_file():
            return self.path
        if os.geteuid() != 0:
            raise UserError("building the kernel guest image needs root (loop mount, chroot)")
        self.base.ensure(progress)
        self.cache_root.mkdir(parents=True, exist_ok=True)
        with open(self.cache_root / f".{self.key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.manifest_path.is_file():
                return self.path
            for stale in self.cache_root.glob(f".tmp-{self.key}-*"):
                shutil.rmtree(stale, ignore_errors=True)
            tmp = self.cache_root / f".tmp-{self.key}-{os.getpid()}"
            tmp.mkdir()
            t0 = time.monotonic()
            try:
                self._build(tmp, progress)
                os.rename(tmp, self.path)
                for older in self.cache_root.glob(f"{self.suite}-*"):   # an earlier recipe's image: never booted again
                    if older != self.path:
                        shutil.rmtree(older, ignore_errors=True)
            except BaseException:
                if (tmp / "build.log").exists():
                    shutil.copy(tmp / "build.log", self.cache_root / f"last-failed-{self.suite}.log")
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            progress(f"{self.suite} image ready in {time.monotonic() - t0:.0f} s: {self.path}")
        return self.path

    def _sh(self, log: Path, argv: list[str], timeout: float = 1800) -> None:
        with open(log, "a") as f:
            f.write(f"+ {' '.join(argv)}\n")
            f.flush()
            rc = subprocess.run(["nice", "-n", "19", *argv], stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, timeout=timeout).returncode
        if rc != 0:
            tail = "\n  ".join(log.read_text(errors="replace").strip().splitlines()[-8:])
            raise UserError(f"kernel guest build failed ({rc}) at: {' '.join(argv)[:160]}\n  {tail}")

    def _build(self, tmp: Path, progress: Callable[[str], None]) -> None:
        log = tmp / "build.log"
        disk, mnt = tmp / "disk.raw", tmp / "mnt"
        mnt.mkdir()
        progress(f"copying {self.base.disk_path} and growing it to {DISK_GB} GiB")
        self._sh(log, ["cp", "--sparse=always", str(self.base.disk_path), str(disk)])
        self._sh(log, ["truncate", "-s", f"{DISK_GB}G", str(disk)])
        self._sh(log, ["e2fsck", "-fy", str(disk)])
        self._sh(log, ["resize2fs", str(disk)])
        mirror, security = host_mirrors(self.suite)
        kernel = "linux-image-amd64" if self.suite == "bookworm" else f"linux-image-amd64/{self.suite}"
        # another suite's kernel only: -t bookworm keeps the userland bookworm's (the .venv needs its python3)
        extra = "" if self.suite == "bookworm" else f"deb {mirror} {self.suite} main\n"
        progress(f"installing {' '.join(PACKAGES)} and {kernel} (chroot apt-get; minutes)")
        # The PostgreSQL template initdb'ed natively here, in the chroot with this checkout: under TCG the guest's
        # first run would initdb it itself (~15 s emulated, every boot: the disk is booted snapshot=on).
        src = Path(__file__).resolve().parents[2]
        script = f"""
set -e
mount -o loop "{disk}" "{mnt}"
trap 'umount -R "{mnt}"' EXIT
mount -t proc proc "{mnt}/proc"; mount --bind /dev "{mnt}/dev"; mount -t sysfs sysfs "{mnt}/sys"
cp /etc/resolv.conf "{mnt}/etc/resolv.conf"
printf '%s' '{extra}' > "{mnt}/etc/apt/sources.list.d/pp-kernel.list"
printf '#!/bin/sh\\nexit 101\\n' > "{mnt}/usr/sbin/policy-rc.d"; chmod 755 "{mnt}/usr/sbin/policy-rc.d"
mkdir -p "{mnt}/etc/initramfs-tools/conf.d"; echo 'MODULES=dep' > "{mnt}/etc/initramfs-tools/conf.d/pp"
chroot "{mnt}" env DEBIAN_FRONTEND=noninteractive sh -ec 'apt-get -q update
  apt-get -y -q --no-install-recommends -t bookworm install {' '.join(PACKAGES)} {kernel}
  apt-get clean; rm -rf /var/lib/apt/lists/* /usr/share/doc /usr/share/man'
rm -f "{mnt}/usr/sbin/policy-rc.d"
mkdir -p "{mnt}{src}"; mount --bind -o ro "{src}" "{mnt}{src}"
chroot "{mnt}" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root {sys.executable} -c '{WARM_TEMPLATE}'
umount "{mnt}{src}"
cp "{mnt}"/boot/vmlinuz-* "{tmp}/"; cp -a "{mnt}/bin/busybox" "{tmp}/busybox"
tar -C "{mnt}/lib/modules" -cf "{tmp}/modules.tar" .
"""
        self._sh(log, ["unshare", "-m", "--propagation", "private", "sh", "-ec", script], timeout=3600)
        vmlinuz = sorted(tmp.glob("vmlinuz-*"))[-1]
        kver = vmlinuz.name[len("vmlinuz-"):]
        mods = tmp / "modules"
        mods.mkdir()
        self._sh(log, ["tar", "-C", str(mods), "-xf", str(tmp / "modules.tar")])
        kdir = mods / kver / "kernel"
        for sub in ("drivers/virtio", "drivers/block", "fs", "lib", "crypto"):   # trixie ships modules xz-compressed
            for xz in (kdir / sub).rglob("*.ko.xz"):
                xz.with_suffix("").write_bytes(lzma.decompress(xz.read_bytes()))
                xz.unlink()
        wanted = _module_files(kdir, INITRD_MODULES)
        files = {"bin/busybox": ((tmp / "busybox").read_bytes(), 0o755), "init": (INITRAMFS_INIT.encode(), 0o755),
                 "etc/pp-modules": ("\n".join(n for n, _ in wanted).encode() + b"\n", 0o644)}
        files.update({f"lib/modules/{n}.ko": (p.read_bytes(), 0o644) for n, p in wanted})
        (tmp / "initrd.img").write_bytes(_cpio_newc(files))
        elf = _uncompressed_kernel(vmlinuz.read_bytes())
        (tmp / "vmlinux").write_bytes(elf) if elf else shutil.copy(vmlinuz, tmp / "vmlinuz")
        init = tmp / "pp-kern-init"
        init.write_text(DISK_INIT)
        self._sh(log, ["unshare", "-m", "--propagation", "private", "sh", "-ec",
                       f'mount -o loop "{disk}" "{mnt}"; install -m 755 "{init}" "{mnt}/sbin/pp-kern-init"; '
                       f'umount "{mnt}"'])
        for p in (mods, tmp / "modules.tar", tmp / "busybox", init, vmlinuz, mnt):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        (tmp / "manifest.json").write_text(json.dumps({"suite": self.suite, "kernel": kver,
                                                      "base": self.base.key, "packages": PACKAGES}, indent=1))

    def kernel_file(self) -> Path:
        return self.path / "vmlinux" if (self.path / "vmlinux").exists() else self.path / "vmlinuz"

    def run(self, commands: str, out_dir: Path, src: Path, timeout_s: float = 900, memory_mb: int = 3072,
            cpus: int = 1) -> GuestRun:
        """Boot the guest (TCG: this machine's KVM cannot boot a real guest), run `commands` (sh) inside with the
        checkout `src` mounted at its own path, wait for the poweroff. qemu runs at nice 19."""
        return self.start(commands, out_dir, src, memory_mb=memory_mb, cpus=cpus).wait(timeout_s)

    def start(self, commands: str, out_dir: Path, src: Path, memory_mb: int = 3072, cpus: int = 1,
              nic: "GuestNic | None" = None) -> "BootedGuest":
        """Boot without waiting (several guests at once); `nic`: a network card joined to another guest's."""
        self.ensure()
        out_dir.mkdir(parents=True, exist_ok=True)
        if nic is not None:
            commands = nic.setup_commands() + commands
        (out_dir / "commands.sh").write_text(commands)
        for f in ("output.log", "rc"):
            (out_dir / f).unlink(missing_ok=True)
        console = out_dir / "console.log"
        # One vCPU on one host thread by default (2026-11-27, probed unix runs on 6.1): two vCPUs under thread=multi
        # hung 2 runs of 3 (both spun for minutes on sock_def_readable's first instruction, just patched into the
        # call of an fentry trampoline: cross-vCPU code patching under MTTCG); two vCPUs under thread=single took
        # turns, and a vCPU frozen while the other ran put time outside every stage (latency closure -8.98 % and
        # -8.94 % in 5); one vCPU: closures -3.9 to -1.0 % latency, -1.7 to +1.6 % CPU in 6, three beside a busy
        # host CPU, 51-56 s each against 72-104. loglevel=5: a lockup's stack is printed.
        argv = ["nice", "-n", "19", "qemu-system-x86_64", "-accel", "tcg,thread=single", "-cpu", "max",
                "-m", str(memory_mb), "-smp", str(cpus), "-nographic", "-no-reboot", "-nic", "none",
                "-kernel", str(self.kernel_file()), "-initrd", str(self.path / "initrd.img"),
                "-append", f"console=ttyS0 panic=-1 loglevel=5 mitigations=off random.trust_cpu=on pp.src={src}",
                "-drive", f"file={self.disk},format=raw,if=virtio,snapshot=on",
                "-virtfs", f"local,path={src},mount_tag=pp-src,security_model=none,readonly=on",
                "-virtfs", f"local,path={out_dir},mount_tag=pp-out,security_model=none",
                "-serial", f"file:{console}", "-monitor", "none", "-display", "none",
                *(nic.qemu_args() if nic is not None else [])]
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=open(out_dir / "qemu.err", "w"), start_new_session=True)
        return BootedGuest(child, out_dir, time.monotonic())


@dataclass
class GuestNic:
    """A virtio network card whose frames travel as UDP datagrams between two qemu processes on the host's loopback
    (qemu's socket netdev): two guests on one wire, nothing else on it, no bridge or tap on the host."""
    address: str            # this guest's, with its prefix (198.18.0.0/15)
    local_port: int
    remote_port: int
    mac: str

    def qemu_args(self) -> list[str]:
        return ["-netdev", f"socket,id=pp0,udp=127.0.0.1:{self.remote_port},localaddr=127.0.0.1:{self.local_port}",
                "-device", f"virtio-net-pci,netdev=pp0,mac={self.mac}"]

    def setup_commands(self) -> str:
        return (f"modprobe virtio_net; i=0; while ! ip link show eth0 >/dev/null 2>&1 && [ $i -lt 100 ]; do "
                f"sleep 0.1; i=$((i+1)); done\nip link set eth0 up && ip addr add {self.address} dev eth0\n")


def nic_pair(address_a: str, address_b: str) -> tuple[GuestNic, GuestNic]:
    """Two cards on one wire: free UDP ports on the host's loopback, one per end."""
    import socket
    ports = []
    for _ in range(2):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    return (GuestNic(address_a, ports[0], ports[1], "52:54:00:70:70:01"),
            GuestNic(address_b, ports[1], ports[0], "52:54:00:70:70:02"))


@dataclass
class BootedGuest:
    child: subprocess.Popen
    out_dir: Path
    t0: float

    def wait(self, timeout_s: float = 900) -> GuestRun:
        """Until the guest powers off (killed after timeout_s: rc None)."""
        try:
            self.child.wait(max(0.0, timeout_s - (time.monotonic() - self.t0)))
        except subprocess.TimeoutExpired:
            self.child.kill()      # our own qemu, by its pid
            self.child.wait()
        out_dir = self.out_dir
        rc_file = out_dir / "rc"
        rc = int(rc_file.read_text()) if rc_file.exists() and rc_file.read_text().strip() else None
        read = lambda p: p.read_text(errors="replace") if p.exists() else ""  # noqa: E731
        return GuestRun(rc, read(out_dir / "output.log"), read(out_dir / "console.log"), time.monotonic() - self.t0,
                        out_dir)
