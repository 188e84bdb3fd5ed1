"""A cache of initdb'ed clusters: initdb once per (PostgreSQL build, initdb options), copy the result per run.

initdb is the slowest part of a run's set-up (about a second: it boots a bootstrap backend and fills three
databases); copying its result is tens of milliseconds. The cache lives in /var/cache/pathprof/pg-template/
(PATHPROF_PG_CACHE overrides), one directory per key, where the key hashes everything that decides the cluster's
bytes: the PostgreSQL binaries (version string, size and mtime of initdb and postgres, so a package upgrade
rebuilds), the initdb options and the lines appended to pg_hba.conf. A run's settings are not part of it: they
are given per run on the postmaster's command line (-c), as before.

A template is built in a temporary directory next to its final place and renamed into place when it is
complete, so a run killed mid-build leaves no half-made template to be reused (its temporary directory, named by
its pid, is removed by the next build). Runs only ever read a template; each copies it into its own state
directory, which the run's journal already removes.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from pathprof.agent.host import proc
from pathprof.errors import UserError

CACHE_ROOT = Path(os.environ.get("PATHPROF_PG_CACHE", "/var/cache/pathprof/pg-template"))
FORMAT = 1            # bump when what a template holds changes in a way the key does not see
MARKER = "template.json"


def _binary_identity(tool: str) -> dict:
    path = proc.which(tool)
    st = os.stat(path)
    return {"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def key_of(initdb_options: list[str], hba_lines: list[str]) -> tuple[str, dict]:
    """The cache key (directory name) and the recipe it hashes."""
    version = subprocess.run([proc.which("postgres"), "--version"], capture_output=True, text=True).stdout.strip()
    recipe = {"format": FORMAT, "version": version, "initdb": _binary_identity("initdb"),
              "postgres": _binary_identity("postgres"), "options": list(initdb_options), "hba": list(hba_lines)}
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]
    major = version.split()[-1].split(".")[0] if version else "pg"
    return f"pg{major}-{digest}", recipe


def _remove_stale_builds(root: Path) -> None:
    for d in root.glob(".build-*"):
        pid = d.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not proc.pid_alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


def ensure(initdb_options: list[str], hba_lines: list[str], user: str, uid: int, gid: int,
           root: Path | None = None) -> tuple[Path, bool]:
    """The template's data directory (built now if missing) and whether it was already there."""
    root = Path(root or CACHE_ROOT)
    key, recipe = key_of(initdb_options, hba_lines)
    final = root / key
    if (final / MARKER).is_file() and (final / "pgdata" / "PG_VERSION").is_file():
        return final / "pgdata", True
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    _remove_stale_builds(root)
    tmp = root / f".build-{key}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=0o755)
    try:
        data = tmp / "pgdata"
        data.mkdir(mode=0o700)
        os.chown(data, uid, gid)
        proc.run(None, [proc.which("initdb"), "-D", str(data), *initdb_options], user=user, timeout=120)
        with open(data / "pg_hba.conf", "a") as f:
            f.writelines(line + "\n" for line in hba_lines)
        (tmp / MARKER).write_text(json.dumps(recipe, indent=1) + "\n")
        if final.exists() and not (final / MARKER).is_file():
            shutil.rmtree(final, ignore_errors=True)      # not ours to trust: no completion marker
        try:
            os.rename(tmp, final)
        except OSError:               # another run built the same template first: use theirs
            if not (final / MARKER).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _remove_outdated(root, recipe)
    return final / "pgdata", False


def _remove_outdated(root: Path, current: dict) -> None:
    """Templates made by PostgreSQL binaries that are no longer installed (a package upgrade) are never used
    again: remove them. Templates with other options stay (another option set may still be in use)."""
    same = ("format", "version", "initdb", "postgres")
    for marker in root.glob(f"*/{MARKER}"):
        try:
            recipe = json.loads(marker.read_text())
        except (OSError, ValueError):
            continue
        if any(recipe.get(k) != current[k] for k in same):
            shutil.rmtree(marker.parent, ignore_errors=True)


def move_wal(data_dir: Path, waldir: Path) -> None:
    """The WAL into waldir (a device of its own) with pg_wal a symlink to it, as `initdb --waldir` makes it."""
    wal = data_dir / "pg_wal"
    subprocess.run(["cp", "-a", f"{wal}/.", str(waldir)], check=True, capture_output=True)
    shutil.rmtree(wal)
    os.symlink(waldir, wal)


class PreparedCluster:
    """The template found (or built, the first time) and `cp` started copying it into data_dir as a child process,
    so the copy overlaps the run's next steps; `wait()` returns the template's description or raises a UserError.
    A process, not a thread: the namespaces are built meanwhile by pyroute2, which forks helpers that run Python,
    and a fork copies whatever locks another thread holds at that moment."""

    def __init__(self, data_dir: Path, initdb_options: list[str], hba_lines: list[str], user: str, uid: int,
                 gid: int):
        import tempfile
        template, reused = ensure(initdb_options, hba_lines, user, uid, gid)
        self.data_dir = data_dir
        self.info = {"key": template.parent.name, "reused": reused}
        data_dir.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        self._err = tempfile.TemporaryFile()
        self._cp = subprocess.Popen(["cp", "-a", "--sparse=always", str(template), str(data_dir)],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._err)

    def wait(self) -> dict:
        if self._cp.wait() != 0:
            self._err.seek(0)
            detail = self._err.read().decode(errors="replace").strip()[-300:]
            raise UserError(f"copying the cached PostgreSQL cluster into {self.data_dir} failed: {detail}")
        return self.info
