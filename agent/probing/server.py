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
        self.odd: set[int] = set()       # children whose title read as neither a client's nor an auxiliary's once
        self.at = 0.0

    def due(self) -> bool:
        return time.monotonic() - self.at >= REFRESH_S

    def refresh(self) -> None:
        """Look at the children not settled yet: "starting" (still the postmaster's title) waits for next time, and
        so does a title that is neither a client's nor an auxiliary's, once."""
        self.at = time.monotonic()
        try:
            kids = {int(c) for c in Path(f"/proc/{self.postmaster}/task/{self.postmaster}/children").read_text()
                    .split()}
        except OSError:
            return
        self.seen &= kids                # an exited child's pid may come back as a new process
        self.odd &= kids
        for child in kids - self.seen:
            kind = self.kind_of(child)
            if kind == "starting":
                continue
            if kind == "other" and child not in self.odd:
                # settled at the second look: a title read while PostgreSQL wrote it over its argv can be torn
                # ("15/main: postg"), and a client's backend taken for a background worker stays pg_aux for the
                # whole run (ci46c-1: the one backend of a 1-client netem run, every stage named pg_aux)
                self.odd.add(child)
                continue
            self.odd.discard(child)
            self.seen.add(child)
            if kind != "backend":
                self.session.track(child, "pg_aux", aux=kind)
