"""The suite in two lanes (scripts/test): two pytest-xdist workers, the second in network and mount namespaces of
its own (tests/lane-python), so the built-in paths' fixed names (pp-loopback, pp-dk-host, ...) and each lane's
root-namespace links and rules never meet. What the lanes still share is the machine: its two CPUs, the kernel's
machine-wide objects (cgroups, loop devices, uprobes and their USDT semaphores, the journal directory that
`pathprof cleanup` replays). Each test holds the lanes' two locks as it needs (LaneLock.hold):

  alone    (EXCLUSIVE)        the CPUs to itself: CPU accounting, timing ground truths. The other lane waits.
  objects  (MACHINE_OBJECTS)  no live run in the other lane: `cleanup` replays every dead journal and sweeps what
                              no live one names; cgroups, loop devices, USDT semaphores are machine-wide. The CPUs
                              are shared: these tests go last among the integration tests, in one scope, and run
                              beside the other lane's unit tests.
  runs     (any other integration test)  beside the other lane.
  unit     (tests/unit)       beside anything but an `alone` test; so is a LATE module (the TCG guest), whose scope
                              goes after the shared ones, while the other lane is on the machine-objects or the
                              unit tests.

Which tests are which is data (the tables below, each entry with its reason). The session-wide runs several modules
read (tests/conftest.py) are made alone too where they are a quiet machine's ground truth (`alone()`), while the
tests that read them share the machine; the modules reading one such run form one group, taken by one worker, so
the run is still made once (GroupScheduling: xdist's own `loadgroup` does not group under pytest 9).

Without xdist (`pytest tests/...`, or PATHPROF_TEST_LANES=1 bash scripts/test) nothing here changes anything.
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

# module file name, or "module::test name prefix" -> why it must have the machine to itself
EXCLUSIVE = {
    "test_backend_io.py::test_a_throttled": "cgroups and loop devices are machine-wide; a throttled device's timing",
    "test_foreign_load.py": "the same path alone and under a known load: the other lane would be a third load",
    "test_probe_cpu.py": "the CPU the kernel counted against the probes' per-role CPU",
    "test_cpu_reference.py": "the CPU view's reference is the machine's busy time",
    "test_compare_real.py": "the CPU gap between two paths, run one after the other",
    "test_sweep_real.py": "the knee of a client sweep is a timing ground truth",
    "test_probes_paths.py::test_pg_sleep": "2 ms of pg_sleep, and every other stage within 50 µs of the base run",
    "test_probes_paths.py::test_cpu_view_closes": "the CPU view's closure with both CPUs saturated by this run",
    "test_netem.py": "a delay's size in the latency's p50: beside the other lane a 1-client run's own run-queue waits "
                     "moved p50 by 726 µs for a 400-µs round trip (CI 2026-11-27)",
    "test_predict_clients.py": "a machine cost is learned only from runs without another load beside them: beside "
                                "a 16-client run one pair's exponent ranged -0.30 ... 0.38 (2026-11-28)",
    "test_predict_hops.py": "a machine cost is learned only from runs without another load beside them: beside the "
                            "other lane the base run had 0.33 CPUs of it and the pair taught nothing (CI on aad2faf)",
    "test_three_hosts.py": "three agents load their probes before one moment: beside a 16-client run they were "
                           "ready 1.4-3.0 s after a moment 6 s ahead (2026-11-26)",
}
# module file name, or "module::test name prefix" -> which machine-wide objects it must not share with a live run.
# `cleanup` beside the other lane's runs (CI runs 36, 39) kept a killed run's names a live run of the other lane
# held, and stopped its postmaster; unit tests make no run and no pp- object, so these run beside them.
MACHINE_OBJECTS = {
    "test_backend_io.py::test_a_killed": "cgroups and loop devices are machine-wide; `cleanup` replays the journal",
    "test_faults.py::test_sigkill": "a killed run's journal waits for `cleanup`, which replays every dead journal",
    "test_faults.py::test_cleanup": "`cleanup` replays every dead journal on the machine",
    "test_foundation.py::test_sigkill": "a killed run's journal waits for `cleanup`, which replays every dead journal",
    "test_rules_scale.py": "replays a killed run's journal with `cleanup`",
    "test_uprobe_multi.py": "USDT semaphores are counted by every uprobe on the binary, the other lane's too",
    "test_cpu_quota.py": "cgroups are machine-wide (its pp- CPU cgroup, and the state check that it is gone)",
}
# module file name -> why it goes after the shared integration scopes and holds the lanes as a unit test does: the
# other lane is then on the machine-objects tests or the unit tests, not on a run of its own that would starve it
LATE = {
    "test_kernel_guest.py": "a TCG guest at nice 19 for ~3 min: it makes no host object (its disk is a snapshot, its "
                            "image built by the suite's set-up), and beside a lane of runs it starves. As one "
                            "machine-objects test it ran after all of them (CI 2026-11-28: 282 s, the suite's tail)",
}
# a name -> (modules one worker takes whole, one after the other, why they must not run beside each other)
SAME_LANE = {
    "foreign_path": (("test_attach.py", "test_attach_client_name.py", "test_attach_idle.py", "test_attach_twin.py",
                      "test_status_feed.py"),
                     "each builds foreign_path.py's hand-made path, the same addresses in each lane: two attaches on "
                     "two copies at once (ci52a) opened and closed their windows in lockstep, each detach took 54 s, "
                     "until the application ended, and both counted 1.4x the exchanges (closure -49.74 %); stop 51: "
                     "-43.59 % in 2 of 11 -- not found yet, see MEASUREMENTS"),
}
MACHINE_SCOPE = "machine-objects"
SHARED_RUN_FIXTURES = ("connect_run", "pgpool_children_run", "always_on_run")
SESSION_ENV = "PATHPROF_TEST_LANES_SESSION"


def _reason(item, table: dict) -> str | None:
    module = item.nodeid.split("::")[0].rsplit("/", 1)[-1]
    name = item.nodeid.split("::", 1)[-1]
    for key, why in table.items():
        mod, _, prefix = key.partition("::")
        if mod == module and name.startswith(prefix):
            return why
    return None


def exclusive_reason(item) -> str | None:
    why = _reason(item, EXCLUSIVE)
    if why is None and item.get_closest_marker("exclusive"):
        return "marked exclusive"
    return why


def hold_kind(item) -> str:
    """How a test holds the lanes' locks: "alone", "objects", "runs" or "unit" (see the module's docstring)."""
    if exclusive_reason(item) is not None:
        return "alone"
    if _reason(item, LATE) is not None:
        return "unit"
    if _reason(item, MACHINE_OBJECTS) is not None:
        return "objects"
    return "runs" if "/integration/" in f"/{item.nodeid}" else "unit"


def scope_and_order(items) -> dict[str, str]:
    """Each test's scope for the scheduler (GroupScheduling; a worker takes a scope whole) and the order the
    scopes go in. A module is a scope; modules reading one session-wide run are one, and so are the modules of a
    SAME_LANE group. The tests of a module that run alone are a scope of their own ("module:alone"), and those
    scopes go first: they pass one after the other while the other lane waits, then the lanes share the rest
    (integration modules with most tests first, unit tests last). The tests that must not share machine-wide
    objects with a live run are one scope (MACHINE_SCOPE) between the integration modules and the unit tests: one
    lane takes it while the other goes on to the unit tests. Only where alone tests read a session-wide run does
    their group stay whole (the run is made once per worker), first among the shared. The scheduler gets the
    scopes in a file (write_scopes): only workers collect, and each writes the same one."""
    module_of = {it: it.nodeid.split("::")[0] for it in items}
    parent = {m: m for m in module_of.values()}

    def root(m):
        while parent[m] != m:
            m = parent[m]
        return m
    by_fixture: dict[str, str] = {}
    for it in items:
        for f in SHARED_RUN_FIXTURES:
            if f in getattr(it, "fixturenames", ()):
                first = by_fixture.setdefault(f, module_of[it])
                parent[root(module_of[it])] = root(first)
    for it in items:
        name = module_of[it].rsplit("/", 1)[-1]
        for group, (modules, _) in SAME_LANE.items():
            if name in modules:
                first = by_fixture.setdefault(f"same-lane:{group}", module_of[it])
                parent[root(module_of[it])] = root(first)
    groups: dict[str, list] = {}
    for it in items:
        groups.setdefault(root(module_of[it]), []).append(it)
    linked = {root(m) for m in by_fixture.values()}
    order = sorted(groups, key=lambda g: (g not in linked, -len(groups[g]) if "integration" in g else 0))
    scope_of, first, shared, late, machine, unit = {}, [], [], [], [], []
    for g in order:
        for it in groups[g]:
            name, kind = Path(g).stem, hold_kind(it)
            if g in linked:
                scope_of[it.nodeid] = name
                shared.append(it)
            elif kind == "alone":
                scope_of[it.nodeid] = f"{name}:alone"
                first.append(it)
            elif _reason(it, LATE) is not None:
                scope_of[it.nodeid] = name
                late.append(it)
            elif kind == "objects":
                scope_of[it.nodeid] = MACHINE_SCOPE
                machine.append(it)
            else:
                scope_of[it.nodeid] = name
                (unit if kind == "unit" else shared).append(it)
    items[:] = first + shared + late + machine + unit
    return scope_of


def write_scopes(scopes: dict[str, str]) -> None:
    target = lanes_file(".scopes.json")
    tmp = target.with_name(f"{target.name}.{os.getpid()}")
    tmp.write_text(json.dumps(scopes))
    tmp.rename(target)


def name_the_session(config) -> None:
    """The controller names the session's files; the workers it starts inherit the name."""
    if not hasattr(config, "workerinput") and getattr(config.option, "tx", None):
        os.environ[SESSION_ENV] = str(os.getpid())


def session_id() -> str | None:
    return os.environ.get(SESSION_ENV)


def lanes_file(suffix: str) -> Path:
    return Path("/tmp") / f"pp-test-lanes-{session_id()}{suffix}"


def _late(nodeid: str) -> bool:
    return Path(nodeid.split("::")[0]).name in LATE


def next_scope(queue: list[str], first_test: dict[str, str], others_pending: list[str],
               own_pending: list[str] = ()) -> str | None:
    """The scope a worker takes next: the queue's first, except MACHINE_SCOPE while another worker still has
    integration tests to run (each of them would make it wait): the first unit scope then, if one is left, so that
    the machine-objects tests begin when the other lane is on unit tests. A LATE module holds the lanes as a unit
    test does: the machine-objects tests go beside it (CI 2026-11-28: they waited for the guest, 58 s after it on
    its lane while the other lane had finished) -- and not behind it: a worker with a LATE test still to run leaves
    MACHINE_SCOPE to the other (None: nothing now; its next finished test asks again)."""
    if queue[0] != MACHINE_SCOPE:
        return queue[0]
    unit = next((s for s in queue if first_test[s].startswith("tests/unit/")), None)
    if any(_late(n) for n in own_pending):
        return unit
    if not any(n.startswith("tests/integration/") and not _late(n) for n in others_pending):
        return queue[0]
    return unit or queue[0]


def GroupScheduling(config, log):     # noqa: N802 (a class made on demand: xdist is imported only when used)
    from xdist.scheduler import LoadScopeScheduling

    class _GroupScheduling(LoadScopeScheduling):
        """xdist's scope scheduling with scope_and_order's scopes, in the order collected: a worker takes a whole
        scope, and the next one when it is almost done with its own."""

        def __init__(self, config, log=None):
            super().__init__(config, log)
            config.option.loadscopereorder = False
            self._scopes: dict | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._scopes is None:
                f = lanes_file(".scopes.json")
                self._scopes = json.loads(f.read_text()) if f.exists() else {}
            return self._scopes.get(nodeid, nodeid.split("::", 1)[0])

        def _assign_work_unit(self, node) -> None:
            queue = list(self.workqueue)
            others = [t for n, assigned in self.assigned_work.items() if n is not node
                      for unit in assigned.values() for t, done in unit.items() if not done]
            own = [t for unit in self.assigned_work.get(node, {}).values() for t, done in unit.items() if not done]
            scope = next_scope(queue, {s: next(iter(self.workqueue[s])) for s in queue}, others, own)
            if scope is None:
                return
            if scope != queue[0]:
                self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)
    return _GroupScheduling(config, log)


class LaneLock:
    """The lanes' two locks, each a readers-writer lock on a flock(2)ed file: `rw` for the CPUs (an alone test
    holds it exclusively, every other test shared) and `objects` for the machine-wide objects (a test of
    MACHINE_OBJECTS holds it exclusively, every other integration test shared, a unit test not at all). The
    turnstile keeps a waiting exclusive holder from being overtaken by the other lane's next shared one."""

    MODES = {"alone": (fcntl.LOCK_EX, fcntl.LOCK_SH), "objects": (fcntl.LOCK_SH, fcntl.LOCK_EX),
             "runs": (fcntl.LOCK_SH, fcntl.LOCK_SH), "unit": (fcntl.LOCK_SH, None)}

    def __init__(self, path: Path):
        self.rw = open(path, "a+")                       # noqa: SIM115 (held for the whole session)
        self.objects = open(f"{path}.objects", "a+")     # noqa: SIM115
        self.turnstile = open(f"{path}.turnstile", "a+")  # noqa: SIM115
        self.mode: int | None = None                     # what this lane holds of rw now
        self.objects_mode: int | None = None
        self.kind = "runs"                               # the test's kind of hold (MODES)
        self.since = 0.0
        self.seconds = {"waiting": 0.0, "alone": 0.0, "shared": 0.0}    # this lane's time, for the summary

    def _take(self, mode: int, objects_mode: int | None = None) -> None:
        t0 = time.monotonic()
        fcntl.flock(self.turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(self.rw, mode)
            if objects_mode is not None:
                fcntl.flock(self.objects, objects_mode)
                self.objects_mode = objects_mode
        finally:
            fcntl.flock(self.turnstile, fcntl.LOCK_UN)
        self.mode, self.since = mode, time.monotonic()
        self.seconds["waiting"] += self.since - t0

    def _drop(self) -> None:
        fcntl.flock(self.rw, fcntl.LOCK_UN)
        if self.objects_mode is not None:
            fcntl.flock(self.objects, fcntl.LOCK_UN)
            self.objects_mode = None
        self.seconds["alone" if self.mode == fcntl.LOCK_EX else "shared"] += time.monotonic() - self.since
        self.mode = None

    @contextmanager
    def hold(self, kind: str):
        """kind: one of MODES (hold_kind)."""
        self.kind = kind
        self._take(*self.MODES[self.kind])
        try:
            yield
        finally:
            self._drop()

    @contextmanager
    def alone(self):
        """Inside a shared hold: the machine to this lane for a while (a run other tests read, made once). What
        the test holds is dropped first and taken again after: a lane never waits at the turnstile holding a lock,
        so two lanes asking at once cannot deadlock."""
        if self.mode != fcntl.LOCK_SH:
            yield
            return
        self._drop()
        self._take(*self.MODES["alone"])
        try:
            yield
        finally:
            self._drop()
            self._take(*self.MODES[self.kind])


@contextmanager
def alone(config):
    """The machine to this test alone while the block runs, when the suite runs in lanes; else nothing."""
    lock = getattr(config, "_pp_lane_lock", None)
    if lock is None:
        yield
    else:
        with lock.alone():
            yield


def lane_lock(config) -> LaneLock | None:
    """The session's lock when this process is one of several xdist workers, else None."""
    workerinput = getattr(config, "workerinput", None)
    if not workerinput or int(workerinput.get("workercount", 1)) < 2 or not session_id():
        return None
    lock = getattr(config, "_pp_lane_lock", None)
    if lock is None:
        lock = LaneLock(lanes_file(".lock"))
        config._pp_lane_lock = lock
    return lock


def write_stats(config) -> None:
    lock = getattr(config, "_pp_lane_lock", None)
    if lock is not None:
        lanes_file(f".stats-{config.workerinput['workerid']}").write_text(json.dumps(lock.seconds))


def summary(config) -> str | None:
    """One line per lane: its time in tests beside the other lane, alone, and waiting for the lock."""
    if hasattr(config, "workerinput") or not session_id():
        return None
    lines = []
    for f in sorted(Path("/tmp").glob(f"pp-test-lanes-{session_id()}.stats-*")):
        s = json.loads(f.read_text())
        lines.append(f"lane {f.name.rsplit('-', 1)[-1]}: {s['shared']:.0f} s beside the other lane, "
                     f"{s['alone']:.0f} s alone, {s['waiting']:.0f} s waiting")
    return "\n".join(lines) or None


def remove_files(config) -> None:
    """The controller, when the session ends, removes the lock and group files."""
    if not hasattr(config, "workerinput") and session_id():
        for f in Path("/tmp").glob(f"pp-test-lanes-{session_id()}*"):
            f.unlink(missing_ok=True)
