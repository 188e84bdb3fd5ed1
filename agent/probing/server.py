"""The processes a PostgreSQL server forks while a run goes on. The kernel makes each a backend at its fork
(pp_fork in sched.bpf.h: only then is a short connection's backend followed from its first message); the ones
that turn out not to be client backends (a walsender, an autovacuum or background worker) are re-tracked as
pg_aux of their kind, so their traffic is not counted as transactions nor their CPU as the backends'. What a
child is comes from the caller (`kind_of`, pathprof.agent.run.recorder.child_kind: the process title)."""
from __future__ import annotations

import time
from pathlib import Path

REFRESH_S = 0.5        # how often, inside a window, the postmaster's new children are looked at


class ServerChildren:
    def __init__(self, session, postmaster: int, kind_of):
        self.session, self.postmaster, self.kind_of = session, int(postmaster), kind_of
        self.seen: set[int] = set()      # children whose kind is settled
        self.at = 0.0

    def due(self) -> bool:
        return time.monotonic() - self.at >= REFRESH_S

    def refresh(self) -> None:
        """Look at the children not settled yet: "starting" (still the postmaster's title) waits for next time."""
        self.at = time.monotonic()
        try:
            kids = {int(c) for c in Path(f"/proc/{self.postmaster}/task/{self.postmaster}/children").read_text()
                    .split()}
        except OSError:
            return
        self.seen &= kids                # an exited child's pid may come back as a new process
        for child in kids - self.seen:
            kind = self.kind_of(child)
            if kind == "starting":
                continue
            self.seen.add(child)
            if kind != "backend":
                self.session.track(child, "pg_aux", aux=kind)
