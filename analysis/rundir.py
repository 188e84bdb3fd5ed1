"""The run directory: the only thing analysis reads, so a report made a month later says what the run said.
It is where run.json is opened and checked, and where the typed run model (analysis.run_model) is loaded from:
`RunDir.run` (run.json) and `RunDir.summary()` (the report document)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from pathprof.analysis.run_model import RunMeta, Summary
from pathprof.errors import UserError

# 1.1: merged runs (scope, hosts, clock_offsets, links); 1.2: busy_ns from the no-HZ idle time (cpu, windows and
# in_windows `busy_source` "nohz", with busy_tick_ns and asleep_ns) and the CPU component `idle` (idle.wakeups).
# A run without busy_source is tick-sampled and has no `idle` row: it reads and closes as it was recorded.
# workload.client (attach: the client's program, analysis.client) is optional within 1.2: a reader that does not
# know it names the client `pgbench`, as every run before it did. 1.3: `steal_ns` beside busy_ns (cpu, windows,
# in_windows): the hypervisor's steal time; a run without it says nothing of steal.
SCHEMA = "pathprof-run/1.3"
SCHEMA_MAJOR = 1


class RunDir:
    def __init__(self, path: Path, meta: dict | None = None):
        self.path = Path(path)
        self.meta = meta if meta is not None else {}

    @classmethod
    def create(cls, root: Path, topology: str, run_id: str | None = None) -> "RunDir":
        run_id = run_id or time.strftime("%Y%m%d-%H%M%S") + "-" + topology.replace("/", "_")
        root = Path(root).resolve()
        root.mkdir(parents=True, exist_ok=True)
        path, n = root / run_id, 1
        while True:      # claimed by its mkdir: agents started in one second (one per host) never share a directory
            try:
                path.mkdir()
                break
            except FileExistsError:
                n += 1
                path = root / f"{run_id}-{n}"
        (path / "pgbench").mkdir()
        # private: a run holds query texts, the path's addresses and whatever a DSN carried (its secrets are not
        # recorded, but its host and user are); `chmod` it to share
        os.chmod(path, 0o700)
        rd = cls(path, {"schema": SCHEMA, "run_id": path.name, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        rd.save()
        return rd

    @classmethod
    def open(cls, path: Path | str) -> "RunDir":
        path = Path(path)
        meta_path = path / "run.json"
        if not path.is_dir():
            raise UserError(f"{path} is not a run directory (no such directory)")
        if not meta_path.is_file():
            raise UserError(f"{path} is not a run directory (no run.json)")
        try:
            meta = json.loads(meta_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"{meta_path} is corrupt: {e}") from None
        if not isinstance(meta, dict) or not isinstance(meta.get("schema"), str):
            raise UserError(f"{meta_path} is corrupt: no schema field")
        name, _, version = meta["schema"].partition("/")
        try:
            major = int(version.split(".")[0])
        except ValueError:
            raise UserError(f"{meta_path}: unreadable schema '{meta['schema']}'") from None
        if name != "pathprof-run" or major != SCHEMA_MAJOR:
            raise UserError(f"{meta_path}: schema '{meta['schema']}' is not supported by this pathprof "
                            f"(it reads {SCHEMA}); use a matching pathprof version")
        return cls(path, meta)

    @property
    def run(self) -> RunMeta:
        """run.json as the typed run model (analysis.run_model), read from the document as it is now."""
        return RunMeta.of(self.meta)

    def summary(self) -> Summary:
        """The run/report document (analysis.summary.summarize) as the typed run model; `.doc` is what
        `--json` prints."""
        from pathprof.analysis.summary import summarize
        return Summary.of(summarize(self))

    def save(self) -> None:
        """Atomically: run.json is either the old document or the new one, never a torn one."""
        tmp = self.path / "run.json.tmp"
        try:
            tmp.write_text(json.dumps(self.meta, indent=2, default=str) + "\n")
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path / "run.json")
        except OSError:
            tmp.unlink(missing_ok=True)
            raise

    def update(self, **fields) -> None:
        self.meta.update(fields)
        self.save()

    def file(self, name: str) -> Path:
        return self.path / name

    def write_json(self, name: str, obj) -> Path:
        p = self.path / name
        p.write_text(json.dumps(obj, indent=2, default=str) + "\n")
        os.chmod(p, 0o600)
        return p

    def read_json(self, name: str):
        p = self.path / name
        if not p.exists():
            return None
        try:
            return json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise UserError(f"{p} is corrupt: {e}") from None

    def write_frame(self, name: str, frame) -> Path | None:
        if frame is None:
            return None
        p = self.path / name
        frame.to_parquet(p, index=False)
        return p

    def read_frame(self, name: str):
        import pandas as pd
        p = self.path / name
        if not p.exists():
            return None
        try:
            return pd.read_parquet(p)
        except Exception as e:  # pyarrow raises several types for a truncated or foreign file
            raise UserError(f"{p} is corrupt: {e}") from None
