"""The kvm-tap guest image: Debian 12 + PostgreSQL 15, built once with debootstrap and cached.

What is cached under /var/cache/pathprof/guest/<key>/ (key = a hash of the Recipe, so a changed recipe rebuilds):
  disk.raw      ext4 root filesystem made with `mkfs.ext4 -d` (no loop devices needed); booted read-only-for-the-
                host through a qemu snapshot overlay, so the cached file stays pristine
  vmlinux       Debian's kernel, uncompressed for its PVH entry point, booted directly with -kernel (no
                bootloader, no partition table); vmlinuz (the bzImage as shipped) if no PVH ELF could be extracted
  initrd.img    our own initramfs: busybox-static, the handful of modules the guest needs, and an /init that
                loads them, configures eth0 from the kernel command line and runs PostgreSQL chrooted into the disk
  manifest.json versions and the recipe, written last
The guest's PID 1 is that shell script, which starts only PostgreSQL: systemd would cost several seconds of
emulated CPU per boot under TCG and nothing it offers is needed by a benchmark server.
"""
from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import lzma
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Callable

from pathprof.errors import RequirementError, UserError

CACHE_ROOT = Path(os.environ.get("PATHPROF_GUEST_CACHE", "/var/cache/pathprof/guest"))
# Bump when the build procedure changes in a way the Recipe fields do not capture.
BUILD_FORMAT = 1

# /init in the initramfs: PID 1 for the guest's whole life. It never leaves the initramfs (static busybox is
# cheap to exec under TCG, a dynamically linked tool costs ~0.1 s of emulated dynamic linking per run) and runs
# PostgreSQL chrooted into the disk. Network parameters come from the kernel command line: pp.ip=ADDR/LEN pp.gw=ADDR.
# A clean shutdown is asked for on the second serial port (ttyS1): the host writes "poweroff".
GUEST_INIT = r"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
log() { echo "pp-guest: $*"; }
fail() { log "$*"; echo o > /proc/sysrq-trigger; sleep 5; }
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
for m in $(cat /etc/pp-modules); do insmod /lib/modules/$m.ko || log "insmod $m failed"; done
ip=; gw=
for a in $(cat /proc/cmdline); do
  case $a in pp.ip=*) ip=${a#pp.ip=};; pp.gw=*) gw=${a#pp.gw=};; esac
done
ip link set lo up
dev=
for d in /sys/class/net/*; do n=${d##*/}; [ "$n" != lo ] && { dev=$n; break; }; done
[ -n "$dev" ] || fail "no network device (virtio-net missing?)"
ip link set "$dev" up
[ -n "$ip" ] && { ip addr add "$ip" dev "$dev" || fail "bad pp.ip=$ip"; }
[ -n "$gw" ] && ip route add default via "$gw"
i=0; while [ ! -b /dev/vda ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done
R=/root
mount -t ext4 -o rw,noatime /dev/vda $R || fail "cannot mount /dev/vda"
mount --bind /proc $R/proc; mount --bind /sys $R/sys; mount --bind /dev $R/dev
mkdir -p $R/dev/shm; mount -t tmpfs -o mode=1777 tmpfs $R/dev/shm
mount -t tmpfs -o mode=0755 tmpfs $R/run; mount -t tmpfs -o mode=1777 tmpfs $R/tmp
pg=$(grep '^postgres:' $R/etc/passwd | cut -d: -f3,4)
mkdir -p $R/run/postgresql; chown "$pg" $R/run/postgresql; chmod 2775 $R/run/postgresql
hostname pp-guest
log "$dev $ip via ${gw:-none}; starting postgresql"
chroot $R /usr/bin/setpriv --reuid=postgres --regid=postgres --init-groups /usr/lib/postgresql/15/bin/postgres \
  -D /var/lib/postgresql/15/main -c config_file=/etc/postgresql/15/main/postgresql.conf </dev/null >/dev/console 2>&1 &
PG=$!
stty -F /dev/ttyS1 raw -echo 2>/dev/null
while :; do
  cmd=; read -r cmd < /dev/ttyS1 || sleep 1
  case "$cmd" in poweroff*) break;; esac
done
log "poweroff requested, stopping postgresql"
kill -INT $PG
(sleep 10; kill -KILL $PG) 2>/dev/null &
wait $PG
sync
log "powering off"
echo o > /proc/sysrq-trigger
sleep 10
"""


def host_mirrors(suite: str = "bookworm") -> tuple[str, str]:
    """The Debian mirror and security mirror this host's apt uses for `suite` (a local mirror or proxy the machine
    relies on keeps working for the guest build); deb.debian.org where none is configured."""
    mirror, security = "http://deb.debian.org/debian", "http://deb.debian.org/debian-security"
    entries: list[tuple[list[str], list[str]]] = []
    apt = Path("/etc/apt")
    for f in sorted(apt.glob("sources.list.d/*.sources")):
        for stanza in re.split(r"\n\s*\n", f.read_text(errors="replace")):
            fields = dict(re.findall(r"^(URIs|Suites|Enabled):\s*(.*)$", stanza, re.M))
            if fields.get("Enabled", "yes").strip() != "no" and "URIs" in fields:
                entries.append((fields["URIs"].split(), fields.get("Suites", "").split()))
    for f in [apt / "sources.list", *sorted(apt.glob("sources.list.d/*.list"))]:
        for m in re.finditer(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+(\S+)", f.read_text(errors="replace") if f.exists()
                             else "", re.M):
            entries.append(([m.group(1)], [m.group(2)]))
    for uris, suites in reversed(entries):  # first configured wins
        if suite in suites and uris[0].startswith("http"):
            mirror = uris[0].rstrip("/")
        if f"{suite}-security" in suites and uris[0].startswith("http"):
            security = uris[0].rstrip("/")
    return mirror, security


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Everything that determines the image's content; its digest names the cache entry."""
    suite: str = "bookworm"
    mirror: str = dataclasses.field(default_factory=lambda: host_mirrors()[0])
    security_mirror: str = dataclasses.field(default_factory=lambda: host_mirrors()[1])
    packages: tuple[str, ...] = ("postgresql-15",)
    kernel_package: str = "linux-image-amd64"
    # Load order matters (dependencies first); names as in the kernel tree, '-' and '_' are equivalent.
    modules: tuple[str, ...] = ("virtio", "virtio_ring", "virtio_pci_legacy_dev", "virtio_pci_modern_dev",
                                "virtio_pci", "failover", "net_failover", "virtio_net", "virtio_blk",
                                "crc16", "crc32c_generic", "libcrc32c", "mbcache", "jbd2", "ext4")
    # ssl off: the host-side pgbench would otherwise negotiate TLS and measure it; max_connections for 16-48+ clients.
    # jit off: the LLVM libraries it needs are dropped from the image (155 MB), and `select 1` never uses JIT.
    pg_settings: tuple[tuple[str, str], ...] = (("listen_addresses", "'*'"), ("max_connections", "300"),
                                                 ("ssl", "off"), ("jit", "off"))
    hba: tuple[str, ...] = ("host all all 198.18.0.0/15 trust",)
    free_mb: int = 256  # room for WAL, logs and temp files inside the guest (writes land in the qemu overlay)

    def digest(self) -> str:
        doc = {"format": BUILD_FORMAT, "recipe": dataclasses.asdict(self), "init": GUEST_INIT}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _stderr_progress(msg: str) -> None:
    print(f"pathprof: guest image: {msg}", file=sys.stderr, flush=True)


class GuestImage:
    def __init__(self, recipe: Recipe | None = None, cache_root: Path | None = None):
        self.recipe = recipe or Recipe()
        self.cache_root = Path(cache_root or CACHE_ROOT)
        self.key = f"{self.recipe.suite}-pg15-{self.recipe.digest()[:16]}"
        self.path = self.cache_root / self.key

    disk_path = property(lambda self: self.path / "disk.raw")
    initrd_path = property(lambda self: self.path / "initrd.img")
    manifest_path = property(lambda self: self.path / "manifest.json")

    @property
    def kernel_path(self) -> Path:
        """The PVH-bootable ELF when the build could extract one, else the bzImage."""
        elf = self.path / "vmlinux"
        return elf if elf.exists() else self.path / "vmlinuz"

    def is_built(self) -> bool:
        return self.manifest_path.is_file()

    @property
    def manifest(self) -> dict:
        return json.loads(self.manifest_path.read_text())

    def ensure(self, progress: Callable[[str], None] | None = None) -> Path:
        """Build the image unless it is cached; returns the image directory (disk.raw, vmlinuz, initrd.img)."""
        if self.is_built():
            return self.path
        progress = progress or _stderr_progress
        if os.geteuid() != 0:
            raise UserError("building the guest image needs root (debootstrap, chroot)")
        for tool, pkg in (("debootstrap", "debootstrap"), ("mkfs.ext4", "e2fsprogs"), ("dpkg-deb", "dpkg"),
                          ("unshare", "util-linux"), ("chroot", "coreutils")):
            if not shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin"):
                raise RequirementError(f"'{tool}' not found; install the Debian package {pkg}")
        self.cache_root.mkdir(parents=True, exist_ok=True)
        # One builder per key at a time (parallel test workers); the others wait and then find it built.
        with open(self.cache_root / f".{self.key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.is_built():
                return self.path
            # Anything left under .tmp-<key>-* is from a killed build: we hold the lock, so nobody owns it.
            for stale in self.cache_root.glob(f".tmp-{self.key}-*"):
                shutil.rmtree(stale, ignore_errors=True)
            tmp = self.cache_root / f".tmp-{self.key}-{os.getpid()}"
            tmp.mkdir()
            t0 = time.monotonic()
            try:
                _Build(self.recipe, tmp, progress).run()
                os.rename(tmp, self.path)
                # Older recipes' images are dead weight (~250 MB each). A VM still booted from one keeps its open
                # files, so removing the directory under it is harmless.
                for old in self.cache_root.glob(f"{self.recipe.suite}-pg15-*"):
                    if old != self.path:
                        shutil.rmtree(old, ignore_errors=True)
                        (self.cache_root / f".{old.name}.lock").unlink(missing_ok=True)
            except BaseException:
                log = tmp / "build.log"
                if log.exists():
                    shutil.copy(log, self.cache_root / "last-failed-build.log")
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            progress(f"ready in {time.monotonic() - t0:.0f} s: {self.path} "
                     f"({self.disk_path.stat().st_blocks * 512 / 2**20:.0f} MiB on disk)")
        return self.path


class _Build:
    """One build into a temporary directory; every chroot step runs in a private mount namespace (unshare -m),
    so an interrupted build leaves no mounts behind, only a directory that the next build removes."""

    def __init__(self, recipe: Recipe, out: Path, progress: Callable[[str], None]):
        self.r, self.out, self.progress = recipe, out, progress
        self.root = out / "root"
        self.log = out / "build.log"
        self.env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive",
                    "LC_ALL": "C.UTF-8", "HOME": "/root"}
        # debootstrap fetches with wget, which honours these; a machine behind a proxy needs them passed on
        self.env.update({k: v for k, v in os.environ.items() if k.lower() in ("http_proxy", "https_proxy", "no_proxy")})

    def sh(self, argv: list[str], timeout: float = 1800) -> None:
        with open(self.log, "a") as log:
            log.write(f"+ {' '.join(argv)}\n")
            log.flush()
            # Own session, killed as a whole if we are interrupted: an orphaned debootstrap or dpkg would keep
            # writing into the directory the next build deletes (the mounts vanish with their namespace).
            child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=self.env, start_new_session=True)
            try:
                rc = child.wait(timeout)
            except BaseException as e:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                if not isinstance(e, subprocess.TimeoutExpired):
                    raise
                rc = "timeout"
        if rc != 0:
            tail = self.log.read_text(errors="replace").strip().splitlines()[-6:]
            raise UserError(f"guest image build failed ({rc}) at: {' '.join(argv)[:200]}\n  " + "\n  ".join(tail))

    def chroot(self, script: str, timeout: float = 1800) -> None:
        root = str(self.root)
        self.sh(["unshare", "-m", "--propagation", "private", "sh", "-ec",
                 f'mount -t proc proc "{root}/proc"; exec chroot "{root}" sh -ec "$0"', script], timeout)

    def run(self) -> None:
        r, root = self.r, self.root
        t = time.monotonic()
        self.progress(f"debootstrap {r.suite} (minbase) from {r.mirror} into {self.out} ...")
        self.sh(["unshare", "-m", "--propagation", "private", "debootstrap", "--variant=minbase",
                 "--components=main", r.suite, str(root), r.mirror])
        self.progress(f"base system done ({time.monotonic() - t:.0f} s); installing {' '.join(r.packages)} ...")
        (root / "etc/apt/sources.list").write_text(
            f"deb {r.mirror} {r.suite} main\ndeb {r.mirror} {r.suite}-updates main\n"
            f"deb {r.security_mirror} {r.suite}-security main\n")
        # Keep package scripts from starting the freshly created cluster inside the chroot.
        policy = root / "usr/sbin/policy-rc.d"
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
        self.chroot("apt-get -q update; apt-get -y -q --no-install-recommends install " + " ".join(r.packages)
                    + "; mkdir -p /tmp/debs; cd /tmp/debs; chown _apt /tmp/debs;"
                    + f" k=$(apt-cache depends {r.kernel_package}"
                    + " | sed -n 's/.*Depends: \\(linux-image-[0-9].*\\)/\\1/p');"
                    + ' apt-get -q download busybox-static "$k"')
        self.progress(f"packages installed ({time.monotonic() - t:.0f} s); configuring PostgreSQL, kernel, initramfs")
        self.configure_postgres()
        self.build_boot_files()
        self.trim()
        self.make_disk()
        shutil.rmtree(root)
        self.write_manifest()
        self.progress(f"disk image written ({time.monotonic() - t:.0f} s)")

    def configure_postgres(self) -> None:
        etc = self.root / "etc/postgresql/15/main"
        if not (etc / "postgresql.conf").exists():
            raise UserError("guest image build: postgresql-15 did not create the 'main' cluster")
        (etc / "conf.d").mkdir(exist_ok=True)
        (etc / "conf.d/pathprof.conf").write_text(
            "# written by pathprof's guest image build\n" + "".join(f"{k} = {v}\n" for k, v in self.r.pg_settings))
        with open(etc / "pg_hba.conf", "a") as f:
            f.write("# pathprof: benchmark clients on the RFC 2544 range\n" + "".join(f"{l}\n" for l in self.r.hba))
        (self.root / "etc/hostname").write_text("pp-guest\n")
        (self.root / "usr/sbin/policy-rc.d").unlink()

    def build_boot_files(self) -> None:
        debs = self.root / "tmp/debs"
        kdeb = next(debs.glob("linux-image-*.deb"), None)
        bdeb = next(debs.glob("busybox-static*.deb"), None)
        if not kdeb or not bdeb:
            raise UserError(f"guest image build: kernel or busybox-static package not downloaded (see {self.log})")
        x = self.out / "x"
        x.mkdir()
        self.sh(["dpkg-deb", "-x", str(kdeb), str(x / "k")])
        self.sh(["dpkg-deb", "-x", str(bdeb), str(x / "b")])
        vmlinuz = next((x / "k/boot").glob("vmlinuz-*"))
        kver = vmlinuz.name[len("vmlinuz-"):]
        # PVH entry (CONFIG_PVH): qemu loads the uncompressed ELF directly, which saves the in-guest XZ
        # decompression, about 4 s of emulated CPU per boot under TCG. Otherwise boot the bzImage as shipped.
        elf = _uncompressed_kernel(vmlinuz.read_bytes())
        if elf and "CONFIG_PVH=y" in (x / f"k/boot/config-{kver}").read_text():
            (self.out / "vmlinux").write_bytes(elf)
        else:
            shutil.copy(vmlinuz, self.out / "vmlinuz")
        mods = _module_files(next((x / "k").glob("*lib/modules/*/kernel")), self.r.modules)
        files = {"bin/busybox": ((x / "b/bin/busybox").read_bytes(), 0o755),
                 "init": (GUEST_INIT.encode(), 0o755),
                 "etc/pp-modules": ("\n".join(n for n, _ in mods).encode() + b"\n", 0o644)}
        for name, path in mods:
            files[f"lib/modules/{name}.ko"] = (path.read_bytes(), 0o644)
        (self.out / "initrd.img").write_bytes(_cpio_newc(files))
        self.kernel_version = kver
        shutil.rmtree(x)

    def trim(self) -> None:
        """Drop what a benchmark server never reads: docs, man pages, translations, apt caches, the .debs."""
        for rel in ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "var/lib/apt/lists",
                    "var/cache/apt", "tmp/debs", "usr/lib/postgresql/15/lib/bitcode"):
            p = self.root / rel
            if p.is_dir():
                shutil.rmtree(p)
                p.mkdir()
        # The JIT provider and the libraries only it links (jit = off in the recipe); postgres itself does not.
        lib = self.root / "usr/lib/x86_64-linux-gnu"
        jit = (self.root / "usr/lib/postgresql").glob("*/lib/llvmjit*")
        for p in [*lib.glob("libLLVM-*.so*"), *lib.glob("libz3.so*"), *jit]:
            p.unlink()

    def make_disk(self) -> None:
        used = int(subprocess.run(["du", "-s", "--block-size=1", str(self.root)], capture_output=True, text=True,
                                  check=True).stdout.split()[0])
        size_mb = int(used * 1.15 / 2**20) + self.r.free_mb
        self.progress(f"mkfs.ext4 -d: {used / 2**20:.0f} MiB of files into a {size_mb} MiB disk")
        # No journal: every boot writes into a throw-away overlay, so crash consistency buys nothing.
        self.sh(["mkfs.ext4", "-q", "-F", "-L", "pp-guest", "-O", "^has_journal", "-m", "0", "-d", str(self.root),
                 str(self.out / "disk.raw"), f"{size_mb}M"])

    def write_manifest(self) -> None:
        doc = {"recipe": dataclasses.asdict(self.r), "digest": self.r.digest(), "kernel": self.kernel_version,
               "built": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        tmp = self.out / "manifest.json.tmp"
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        os.rename(tmp, self.out / "manifest.json")


def _module_files(kernel_dir: Path, wanted: tuple[str, ...]) -> list[tuple[str, Path]]:
    """Resolve module names to .ko files, adding their `depends=` (from .modinfo) ahead of them.
    The kernel .deb ships no modules.dep (depmod runs at install time), so read the modules themselves.
    Names missing from the tree are built into this kernel and need no loading."""
    index = {}
    for p in kernel_dir.rglob("*.ko*"):
        index[p.name.split(".ko")[0].replace("-", "_")] = p
    order: list[tuple[str, Path]] = []

    def add(name: str) -> None:
        key = name.replace("-", "_")
        if key not in index or any(n == key for n, _ in order):
            return
        path = index[key]
        if path.suffix != ".ko":
            raise UserError(f"guest image build: compressed kernel module {path.name} is not supported")
        m = re.search(rb"\0depends=([^\0]*)\0", path.read_bytes())
        for dep in (m.group(1).decode().split(",") if m and m.group(1) else []):
            add(dep)
        order.append((key, path))

    for name in wanted:
        add(name)
    return order


def _uncompressed_kernel(bzimage: bytes) -> bytes | None:
    """The vmlinux ELF inside a bzImage (what the kernel's scripts/extract-vmlinux does), for XZ or gzip payloads."""
    for magic, make in ((b"\xfd7zXZ\x00", lambda: lzma.LZMADecompressor(format=lzma.FORMAT_XZ)),
                        (b"\x1f\x8b\x08", lambda: zlib.decompressobj(16 + zlib.MAX_WBITS))):
        at = bzimage.find(magic)
        while at >= 0:
            try:
                out = make().decompress(bzimage[at:])
            except (lzma.LZMAError, zlib.error):
                out = b""
            if out[:4] == b"\x7fELF":
                return out
            at = bzimage.find(magic, at + 1)
    return None


def _cpio_newc(files: dict[str, tuple[bytes, int]]) -> bytes:
    """An uncompressed initramfs in the kernel's "newc" cpio format (uncompressed: fastest to unpack under TCG).
    /dev/console is included so /init has a console before devtmpfs is mounted."""
    out = bytearray()
    ino = 1

    def entry(name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0)) -> None:
        nonlocal ino
        nb = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(nb), 0)
        out.extend(b"070701" + b"".join(b"%08X" % f for f in fields) + nb)
        out.extend(b"\0" * (-len(out) % 4) + data)
        out.extend(b"\0" * (-len(out) % 4))
        ino += 1

    dirs = {"dev", "proc", "sys", "root", "bin", "sbin", "etc", "lib", "lib/modules"}
    for name in files:
        parts = name.split("/")[:-1]
        dirs.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    for d in sorted(dirs):
        entry(d, 0o040755)
    entry("dev/console", 0o020600, rdev=(5, 1))
    for name, (data, perm) in sorted(files.items()):
        entry(name, 0o100000 | perm, data)
    entry("TRAILER!!!", 0)
    return bytes(out)
