"""Disk layouts for the owned server: the WAL on a block device of its own (a loop device over a file in the
run's state directory, ext4, mounted inside it). Every object is journaled before it is created (`loop` by its
backing file, `mount` by its mount point) and removed at teardown in reverse order, or by `pathprof cleanup`."""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pathprof.agent.host import proc
from pathprof.errors import UserError

MIN_WAL_DEVICE_MB = 64      # initdb's 16 MB segments and a checkpoint's worth of WAL need room


@dataclass
class WalDevice:
    device: str
    mountpoint: Path
    size_mb: int
    limit: dict | None = None       # agent.host.io_limit throttle on it, when asked for
    cgroup: str | None = None
    throttled: dict | None = None   # requests the throttle counted: {'reads', 'writes'} (after the run)

    @property
    def waldir(self) -> Path:
        return self.mountpoint / "pg_wal"

    def describe(self) -> dict:
        return {"device": self.device, "size_mb": self.size_mb, "mountpoint": str(self.mountpoint),
                "limit": self.limit, "cgroup": self.cgroup, "throttled": self.throttled}


def check_size(size_mb: int) -> None:
    if size_mb < MIN_WAL_DEVICE_MB:
        raise UserError(f"--wal-device {size_mb}: the WAL device needs at least {MIN_WAL_DEVICE_MB} MB")


def make_wal_device(journal, state_dir: Path, size_mb: int, owner_uid: int, owner_gid: int) -> WalDevice:
    check_size(size_mb)
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        proc.which(tool)
    image, mnt = state_dir / "wal.img", state_dir / "wal"
    if image.exists() or mnt.exists():
        raise UserError(f"{image} or {mnt} already exists: a WAL device of this run is in the way "
                        "(run `pathprof cleanup`)")
    journal.record("loop", path=str(image))
    with open(image, "wb") as f:
        f.truncate(size_mb << 20)                      # sparse: nothing is written until the WAL is
    device = proc.run(None, ["losetup", "--find", "--show", str(image)]).stdout.strip()
    proc.run(None, ["mkfs.ext4", "-q", "-F", "-E", "nodiscard", device], timeout=120)
    mnt.mkdir()
    journal.record("mount", path=str(mnt))
    proc.run(None, ["mount", device, str(mnt)])
    os.chown(mnt, owner_uid, owner_gid)
    return WalDevice(device, mnt, size_mb)


def undo_mount(path: str) -> bool:
    if not os.path.ismount(path):
        return True
    if subprocess.run(["umount", path], capture_output=True).returncode == 0:
        return True
    return subprocess.run(["umount", "-l", path], capture_output=True).returncode == 0


def undo_loop(backing: str) -> bool:
    """Detach every loop device backed by this file (`losetup -j`), then remove the file."""
    out = subprocess.run(["losetup", "-j", backing], capture_output=True, text=True).stdout
    ok = True
    for line in out.splitlines():
        dev = line.split(":", 1)[0].strip()
        if dev:
            ok &= subprocess.run(["losetup", "-d", dev], capture_output=True).returncode == 0
    try:
        Path(backing).unlink()
    except FileNotFoundError:
        pass
    return ok
