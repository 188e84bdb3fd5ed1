"""The kvm-tap guest VM: qemu-system-x86_64 booting the cached GuestImage behind a tap device (virtio-net).

The tap (and the bridge it is enslaved to) belongs to the topology builder; this class only runs qemu on it.
Accelerator: KVM when /dev/kvm works for a real guest, TCG otherwise (the report must say which: TCG makes every
guest instruction an emulated one, so guest CPU costs are not comparable with the host's). vhost-net only with KVM
and /dev/vhost-net present: without KVM there are no ioeventfds for the vhost worker to use.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

from pathprof.agent.host import proc
from pathprof.errors import UserError
from pathprof.topologies.guest.image import GuestImage

# Seconds a KVM boot gets to print its first initramfs line before we decide KVM is unusable and retry with TCG.
# A working KVM reaches the initramfs in ~1 s; TCG needs ~3.5 s here. Where KVM fails (nested virtualisation
# without the features a real kernel needs) the guest kernel spins early in boot with no output at all, so the
# wait is the whole cost of finding out: paid once per boot of the machine (KVM_VERDICTS).
KVM_PROBE_S = 10.0
# KVM's failure to boot this image's kernel, remembered until the machine reboots (tmpfs), keyed by the boot,
# qemu and the guest kernel; deleting the file forgets it, and GuestVM(accel="kvm") always tries.
KVM_VERDICTS = Path(os.environ.get("PATHPROF_KVM_VERDICTS", "/run/pathprof/guest"))
# Under TCG the plain qemu64 model (plus RDRAND for the CRNG) boots with ~15 % less emulated CPU than "max".
TCG_CPU = "qemu64,+rdrand"
# Kernel arguments that shorten boot under emulation: no speculative-execution mitigations to patch in, trust
# the CPU's RDRAND so the CRNG is ready at once (postgres asks for random bytes at start), only the two UARTs used.
BOOT_ARGS = ("console=ttyS0", "root=/dev/vda", "panic=-1", "loglevel=4", "mitigations=off", "random.trust_cpu=on",
             "cryptomgr.notests", "8250.nr_uarts=2", "tsc=reliable", "no_timer_check")


def kvm_available() -> tuple[bool, str]:
    """Whether qemu can be asked for KVM at all (the device opens); a working guest is checked at boot."""
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        return False, f"/dev/kvm: {e.strerror}"
    os.close(fd)
    return True, "/dev/kvm opens"


def _verdict_path(kernel: Path) -> Path:
    import hashlib
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "unknown-boot"
    qemu = shutil.which("qemu-system-x86_64") or "qemu-system-x86_64"
    parts = [boot, str(kernel), qemu]
    for f in (kernel, Path(qemu)):
        try:
            parts.append(str(f.stat().st_mtime_ns))
        except OSError:
            parts.append("missing")
    return KVM_VERDICTS / f"kvm-failed-{hashlib.sha256('|'.join(parts).encode()).hexdigest()[:20]}"


def kvm_failed_before(kernel: Path) -> str | None:
    """Why KVM did not boot this kernel earlier in this boot of the machine, or None (never tried, or it did)."""
    try:
        return _verdict_path(kernel).read_text().strip() or "no output from the guest's init"
    except OSError:
        return None


def remember_kvm_failure(kernel: Path, why: str) -> None:
    try:
        path = _verdict_path(kernel)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(why + "\n")
    except OSError:
        pass                        # not remembered: the next run finds out again


def vhost_available() -> bool:
    return os.path.exists("/dev/vhost-net")


class GuestVM:
    def __init__(self, image: GuestImage, tap_ifname: str, guest_ip_cidr: str, gateway_ip: str, mac: str,
                 memory_mb: int = 1024, cpus: int = 2, console_log: Path | None = None,
                 state_dir: Path | None = None, *, netns: str | None = None, accel: str = "auto",
                 progress: Callable[[str], None] | None = None):
        if accel not in ("auto", "kvm", "tcg"):
            raise UserError(f"accelerator must be auto, kvm or tcg, not {accel!r}")
        if "/" not in guest_ip_cidr:
            raise UserError(f"guest address {guest_ip_cidr!r} needs a prefix length, e.g. 198.18.200.2/24")
        self.image, self.tap, self.guest_ip_cidr, self.gateway_ip, self.mac = \
            image, tap_ifname, guest_ip_cidr, gateway_ip, mac
        self.guest_ip = guest_ip_cidr.split("/")[0]
        self.memory_mb, self.cpus, self.netns, self.requested_accel = memory_mb, cpus, netns, accel
        self.state_dir = Path(state_dir) if state_dir else Path(tempfile.mkdtemp(prefix="pp-guest-"))
        self.console_log = Path(console_log) if console_log else self.state_dir / "console.log"
        self.progress = progress
        self._proc: subprocess.Popen | None = None
        self._accel: str | None = None
        self._vhost = False
        self.accel_note = ""
        self.boot_started: float | None = None
        self.ready_s: float | None = None
        # Unix socket paths are limited to 107 bytes; deep run directories get a short private directory instead.
        self._sock_dir = self.state_dir
        if len(str(self.state_dir / "qmp.sock")) > 100:
            self._sock_dir = Path(tempfile.mkdtemp(prefix="pp-qemu-"))

    # --- what reports need ---------------------------------------------------------------------------------
    @property
    def accelerator(self) -> str | None:
        """"kvm" or "tcg" once started."""
        return self._accel

    @property
    def vhost(self) -> bool:
        return self._vhost

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def describe(self) -> dict:
        return {"accelerator": self._accel, "accelerator_note": self.accel_note, "vhost": self._vhost,
                "pid": self.pid, "tap": self.tap, "guest_address": self.guest_ip_cidr, "mac": self.mac,
                "memory_mb": self.memory_mb, "cpus": self.cpus, "image": self.image.key,
                "guest_kernel": self.image.manifest.get("kernel") if self.image.is_built() else None,
                "console_log": str(self.console_log), "boot_to_ready_s": self.ready_s}

    # --- command line ----------------------------------------------------------------------------------------
    def kernel_cmdline(self) -> str:
        return " ".join((*BOOT_ARGS, f"pp.ip={self.guest_ip_cidr}", f"pp.gw={self.gateway_ip}"))

    def qemu_argv(self, accel: str, vhost: bool) -> list[str]:
        netdev = f"tap,id=n0,ifname={self.tap},script=no,downscript=no" + (",vhost=on" if vhost else "")
        return [
            # debug-threads: vCPU threads are named "CPU n/TCG" or "CPU n/KVM", so the CPU view can split
            # guest execution from qemu's I/O thread
            "qemu-system-x86_64", "-name", f"pp-guest-{self.tap},debug-threads=on",
            "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            # multi-threaded TCG: one host thread per vCPU, otherwise 2 vCPUs share one host CPU
            *(["-accel", "kvm", "-cpu", "host"] if accel == "kvm" else ["-accel", "tcg,thread=multi", "-cpu", TCG_CPU]),
            "-smp", str(self.cpus), "-m", str(self.memory_mb),
            "-kernel", str(self.image.kernel_path), "-initrd", str(self.image.initrd_path),
            "-append", self.kernel_cmdline(),
            # snapshot=on: writes go to a temporary overlay that qemu unlinks at once, the cached image stays pristine
            "-drive", f"file={self.image.disk_path},format=raw,if=virtio,snapshot=on,cache=unsafe",
            "-netdev", netdev, "-device", f"virtio-net-pci,netdev=n0,mac={self.mac}",
            "-chardev", f"file,id=con0,path={self.console_log}", "-serial", "chardev:con0",
            "-chardev", f"socket,id=ctl0,path={self._sock_dir / 'ctl.sock'},server=on,wait=off",
            "-serial", "chardev:ctl0",
            "-qmp", f"unix:{self._sock_dir / 'qmp.sock'},server=on,wait=off",
        ]

    # --- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Boot the guest (building the image first if it is not cached); returns without waiting for postgres."""
        if self._proc and self._proc.poll() is None:
            raise UserError("guest VM already running")
        self.image.ensure(progress=self.progress)
        self._check_tap()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        proc.which("qemu-system-x86_64")
        accel = self.requested_accel
        if accel == "auto":
            ok, why = kvm_available()
            before = kvm_failed_before(self.image.kernel_path) if ok else None
            if not ok:
                accel, self.accel_note = "tcg", f"TCG: {why}"
            elif before:
                accel, self.accel_note = "tcg", (f"TCG: KVM did not boot a guest earlier in this boot of the machine "
                                                 f"({before}); delete {_verdict_path(self.image.kernel_path)} to try "
                                                 f"KVM again")
            else:
                accel, self.accel_note = "kvm", why
        elif accel == "kvm":
            ok, why = kvm_available()
            if not ok:
                raise UserError(f"KVM requested but unusable ({why}); use accel=auto or tcg")
        else:
            self.accel_note = "TCG requested"
        self._launch(accel)
        if accel == "kvm" and self.requested_accel == "auto" and not self._kvm_boots():
            self._kill()
            remember_kvm_failure(self.image.kernel_path, self.accel_note)
            self.accel_note = f"TCG: KVM did not boot a guest ({self.accel_note})"
            self._launch("tcg")

    def _check_tap(self) -> None:
        cp = proc.run(self.netns, ["ip", "-o", "link", "show", "dev", self.tap], check=False)
        if cp.returncode != 0:
            where = f" in netns {self.netns}" if self.netns else ""
            raise UserError(f"tap device {self.tap} does not exist{where}; create it before starting the guest")

    def _launch(self, accel: str) -> None:
        self._accel = accel
        self._vhost = accel == "kvm" and vhost_available()
        for stale in ("ctl.sock", "qmp.sock"):
            (self._sock_dir / stale).unlink(missing_ok=True)
        self.console_log.write_bytes(b"")
        (self.state_dir / "qemu.log").write_bytes(b"")
        # qemu's TMPDIR is where snapshot=on puts its overlay (unlinked right after creation).
        self._proc = proc.spawn(self.netns, self.qemu_argv(accel, self._vhost), log_path=self.state_dir / "qemu.log",
                                env={**os.environ, "TMPDIR": str(self.state_dir)})
        self.boot_started = time.monotonic()

    def _kvm_boots(self) -> bool:
        """KVM can create a VM yet fail to run a real kernel (nested virtualisation without the needed features):
        qemu exits with an error, or the guest never gets as far as the initramfs. Either way: use TCG."""
        deadline = time.monotonic() + KVM_PROBE_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self.accel_note += "; qemu exited: " + " | ".join(self._tail(self.state_dir / "qemu.log", 3))
                return False
            if b"pp-guest:" in self.console_log.read_bytes():
                return True
            time.sleep(0.1)
        self.accel_note += f"; no output from the guest's init within {KVM_PROBE_S:.0f} s"
        return False

    def wait_ready(self, timeout_s: float = 180.0) -> float:
        """Wait until PostgreSQL in the guest accepts connections; returns seconds since qemu started."""
        if not self._proc:
            raise UserError("guest VM not started")
        pg_isready = proc.which("pg_isready")
        deadline = time.monotonic() + timeout_s
        while True:
            rc = self._proc.poll()
            if rc is not None:
                raise UserError(f"guest VM (qemu, {self._accel}) exited with status {rc} before PostgreSQL was ready"
                                + self._diagnostics())
            probe = [pg_isready, "-q", "-U", "postgres", "-d", "postgres", "-h", self.guest_ip, "-p", "5432", "-t", "2"]
            cp = subprocess.run(proc.netns_argv(self.netns, probe), stdin=subprocess.DEVNULL, capture_output=True)
            if cp.returncode == 0:
                self.ready_s = time.monotonic() - self.boot_started
                return self.ready_s
            if time.monotonic() > deadline:
                raise UserError(f"guest PostgreSQL at {self.guest_ip}:5432 not ready after {timeout_s:.0f} s "
                                f"({self._accel})" + self._diagnostics())
            time.sleep(0.2)

    def stop(self, timeout_s: float = 20.0) -> bool:
        """Ask the guest to stop PostgreSQL and power off; kill qemu if it has not exited in time.
        Returns True for a clean shutdown."""
        if not self._proc:
            return True
        clean = False
        if self._proc.poll() is None:
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.settimeout(2)
                    s.connect(str(self._sock_dir / "ctl.sock"))
                    s.sendall(b"poweroff\n")
                    try:
                        self._proc.wait(timeout_s)
                        clean = True
                    except subprocess.TimeoutExpired:
                        pass
            except OSError:
                pass
        self._kill()
        for name in ("ctl.sock", "qmp.sock"):
            (self._sock_dir / name).unlink(missing_ok=True)
        if self._sock_dir != self.state_dir:
            shutil.rmtree(self._sock_dir, ignore_errors=True)
        return clean

    def _kill(self) -> None:
        if self._proc and self._proc.poll() is None:
            proc.stop_process(self._proc, timeout=5)
        if self._proc:
            self._proc.wait()

    # --- diagnostics -----------------------------------------------------------------------------------------
    @staticmethod
    def _tail(path: Path, n: int) -> list[str]:
        try:
            lines = path.read_text(errors="replace").replace("\r", "").splitlines()
        except OSError:
            return []
        return [l for l in lines if l.strip()][-n:]

    def _diagnostics(self) -> str:
        out = ""
        qlog = self._tail(self.state_dir / "qemu.log", 5)
        if qlog:
            out += "\n  qemu: " + "\n  qemu: ".join(qlog)
        con = self._tail(self.console_log, 15)
        out += f"\n  last console lines ({self.console_log}):\n    " + ("\n    ".join(con) if con else "(none)")
        return out
