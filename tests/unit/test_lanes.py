"""The suite's two lanes (tests/lanes.py): who runs alone, how modules are grouped and ordered, and the
readers-writer lock between the lanes, on real flock(2)ed files with threads standing for the two workers."""
import re
import threading
import time
from pathlib import Path

import lanes


class FakeItem:
    def __init__(self, nodeid, fixturenames=(), exclusive=False):
        self.nodeid, self.fixturenames = nodeid, list(fixturenames)
        self._exclusive = exclusive

    def get_closest_marker(self, name):
        return object() if name == "exclusive" and self._exclusive else None


EXCLUSIVE = {"test_stalls.py": "a timing ground truth", "test_faults.py::test_sigkill": "cleanup replays"}
MACHINE_OBJECTS = {"test_rules_scale.py": "cleanup replays", "test_foundation.py::test_sigkill": "cleanup replays"}


def test_who_runs_alone(monkeypatch):
    monkeypatch.setattr(lanes, "EXCLUSIVE", EXCLUSIVE)
    assert lanes.exclusive_reason(FakeItem("tests/integration/test_stalls.py::test_a_window_stall"))
    assert lanes.exclusive_reason(FakeItem("tests/integration/test_faults.py::test_sigkill_during_teardown[x]"))
    assert lanes.exclusive_reason(FakeItem("tests/integration/test_faults.py::test_link_down_mid_run")) is None
    assert lanes.exclusive_reason(FakeItem("tests/integration/test_paths.py::test_pgpool")) is None
    assert lanes.exclusive_reason(FakeItem("tests/integration/test_paths.py::test_pgpool", exclusive=True))


def test_how_each_test_holds_the_locks(monkeypatch):
    monkeypatch.setattr(lanes, "EXCLUSIVE", EXCLUSIVE)
    monkeypatch.setattr(lanes, "MACHINE_OBJECTS", MACHINE_OBJECTS)
    kinds = {n: lanes.hold_kind(FakeItem(n)) for n in (
        "tests/integration/test_stalls.py::t", "tests/integration/test_rules_scale.py::t",
        "tests/integration/test_foundation.py::test_sigkill_mid_run", "tests/integration/test_foundation.py::test_up",
        "tests/unit/test_lanes.py::t")}
    assert list(kinds.values()) == ["alone", "objects", "objects", "runs", "unit"], kinds


def test_the_tests_kept_from_live_runs_are_one_scope_between_the_integration_and_the_unit_tests(monkeypatch):
    monkeypatch.setattr(lanes, "EXCLUSIVE", EXCLUSIVE)
    monkeypatch.setattr(lanes, "MACHINE_OBJECTS", MACHINE_OBJECTS)
    items = [FakeItem("tests/unit/test_a.py::t1"), FakeItem("tests/integration/test_rules_scale.py::t1"),
             FakeItem("tests/integration/test_paths.py::t1"),
             FakeItem("tests/integration/test_foundation.py::test_sigkill_x"),
             FakeItem("tests/integration/test_foundation.py::test_up"), FakeItem("tests/integration/test_stalls.py::t")]
    scope_of = lanes.scope_and_order(items)
    assert [(it.nodeid.split("::")[0].rsplit("/", 1)[-1], scope_of[it.nodeid]) for it in items] == [
        ("test_stalls.py", "test_stalls:alone"), ("test_foundation.py", "test_foundation"),
        ("test_paths.py", "test_paths"), ("test_foundation.py", lanes.MACHINE_SCOPE),
        ("test_rules_scale.py", lanes.MACHINE_SCOPE), ("test_a.py", "test_a")], scope_of


def test_a_late_module_goes_after_the_shared_scopes_and_holds_the_lanes_as_a_unit_test(monkeypatch):
    """The TCG guest: after every shared integration scope, before the machine-objects scope, beside either lane."""
    monkeypatch.setattr(lanes, "EXCLUSIVE", EXCLUSIVE)
    monkeypatch.setattr(lanes, "MACHINE_OBJECTS", MACHINE_OBJECTS)
    monkeypatch.setattr(lanes, "LATE", {"test_kernel_guest.py": "a guest"})
    items = [FakeItem("tests/unit/test_a.py::t1"), FakeItem("tests/integration/test_kernel_guest.py::t1"),
             FakeItem("tests/integration/test_rules_scale.py::t1"), FakeItem("tests/integration/test_paths.py::t1")]
    scope_of = lanes.scope_and_order(items)
    assert [scope_of[it.nodeid] for it in items] == ["test_paths", "test_kernel_guest", lanes.MACHINE_SCOPE,
                                                     "test_a"], scope_of
    assert lanes.hold_kind(FakeItem("tests/integration/test_kernel_guest.py::t1")) == "unit"


def test_modules_sharing_a_session_run_are_one_group_and_lone_groups_come_first(monkeypatch):
    monkeypatch.setattr(lanes, "EXCLUSIVE", EXCLUSIVE)
    items = [FakeItem("tests/unit/test_a.py::t1"),
             FakeItem("tests/integration/test_paths.py::t1"), FakeItem("tests/integration/test_paths.py::t2"),
             FakeItem("tests/integration/test_conn_probe.py::t1", ["connect_run"]),
             FakeItem("tests/integration/test_stalls.py::t1"),
             FakeItem("tests/integration/test_conn_closure.py::t1", ["connect_run", "pgpool_children_run"]),
             FakeItem("tests/integration/test_pooler_counters.py::t1", ["pgpool_children_run"])]
    scope_of = lanes.scope_and_order(items)
    scopes = [scope_of[it.nodeid] for it in items]
    conn = {scope_of[it.nodeid] for it in items if "conn" in it.nodeid or "pooler" in it.nodeid}
    assert len(conn) == 1, "modules reading one session-wide run must run on one worker"
    assert scopes[0] == "test_stalls:alone", "the tests that run alone come first, in a scope of their own"
    assert scopes[1] in conn, "then the groups around a session-wide run"
    assert scopes[-1] == "test_a", "unit tests last"
    # each scope's tests stay together, so a worker takes it whole
    assert [g for i, g in enumerate(scopes) if i == 0 or scopes[i - 1] != g] == list(dict.fromkeys(scopes))


def test_modules_of_a_same_lane_group_are_one_scope(monkeypatch):
    monkeypatch.setattr(lanes, "SAME_LANE", {"copies": (("test_b.py", "test_d.py"), "one path's copies")})
    items = [FakeItem("tests/integration/test_a.py::t1"), FakeItem("tests/integration/test_b.py::t1"),
             FakeItem("tests/integration/test_c.py::t1"), FakeItem("tests/integration/test_d.py::t1"),
             FakeItem("tests/integration/test_d.py::t2")]
    scope_of = lanes.scope_and_order(items)
    assert scope_of["tests/integration/test_b.py::t1"] == scope_of["tests/integration/test_d.py::t2"] == "test_b"
    assert len({scope_of[it.nodeid] for it in items}) == 3
    assert [it.nodeid for it in items][:3] == ["tests/integration/test_b.py::t1", "tests/integration/test_d.py::t1",
                                              "tests/integration/test_d.py::t2"]


def test_the_machine_objects_scope_waits_while_the_other_lane_has_integration_tests():
    queue = [lanes.MACHINE_SCOPE, "test_a", "test_b"]
    first = {lanes.MACHINE_SCOPE: "tests/integration/test_faults.py::test_sigkill_x",
             "test_a": "tests/unit/test_a.py::t", "test_b": "tests/unit/test_b.py::t"}
    busy = ["tests/integration/test_loss.py::t1", "tests/unit/test_c.py::t"]
    assert lanes.next_scope(queue, first, busy) == "test_a", "a unit scope while the other lane runs a path"
    assert lanes.next_scope(queue, first, ["tests/unit/test_c.py::t"]) == lanes.MACHINE_SCOPE
    assert lanes.next_scope(queue, first, []) == lanes.MACHINE_SCOPE
    assert lanes.next_scope([lanes.MACHINE_SCOPE], first, busy) == lanes.MACHINE_SCOPE, "no unit scope left"
    assert lanes.next_scope(["test_b", lanes.MACHINE_SCOPE], first, busy) == "test_b"
    guest = [f"tests/integration/{next(iter(lanes.LATE))}::t", "tests/unit/test_c.py::t"]
    assert lanes.next_scope(queue, first, guest) == lanes.MACHINE_SCOPE, "beside a LATE module, as beside units"
    # the lane about to run the LATE module leaves the machine-objects tests to the other, not queued behind it
    assert lanes.next_scope(queue, first, [], own_pending=guest[:1]) == "test_a"
    assert lanes.next_scope([lanes.MACHINE_SCOPE], first, [], own_pending=guest[:1]) is None
    assert lanes.next_scope([lanes.MACHINE_SCOPE], first, [], own_pending=guest[1:]) == lanes.MACHINE_SCOPE


def _worker(lock, kind, events, name, hold_s):
    def run():
        with lock.hold(kind):
            events.append(("in", name, time.monotonic()))
            time.sleep(hold_s)
            events.append(("out", name, time.monotonic()))
    t = threading.Thread(target=run)
    t.start()
    return t


def test_the_lock_shares_readers_and_a_writer_is_alone_and_not_overtaken(tmp_path):
    path = tmp_path / "lanes.lock"
    # two readers at once: both inside together
    events: list = []
    ts = [_worker(lanes.LaneLock(path), "runs", events, n, 0.3) for n in ("r1", "r2")]
    for t in ts:
        t.join(5)
    ins = sorted(e[2] for e in events if e[0] == "in")
    outs = sorted(e[2] for e in events if e[0] == "out")
    assert ins[1] < outs[0], "two shared holders must overlap"

    # a reader inside, a writer waiting, then a second reader: the writer goes before the second reader
    events = []
    r1 = _worker(lanes.LaneLock(path), "runs", events, "r1", 0.8)
    time.sleep(0.25)
    w = _worker(lanes.LaneLock(path), "alone", events, "w", 0.2)
    time.sleep(0.25)
    r2 = _worker(lanes.LaneLock(path), "runs", events, "r2", 0.1)
    for t in (r1, w, r2):
        t.join(5)
    order = [(kind, name) for kind, name, _ in sorted(events, key=lambda e: e[2])]
    assert order == [("in", "r1"), ("out", "r1"), ("in", "w"), ("out", "w"), ("in", "r2"), ("out", "r2")], order


def _overlap(kind_a, kind_b, tmp_path) -> bool:
    events: list = []
    path = tmp_path / f"{kind_a}-{kind_b}.lock"
    ts = [_worker(lanes.LaneLock(path), kind_a, events, "a", 0.2)]
    time.sleep(0.03)
    ts.append(_worker(lanes.LaneLock(path), kind_b, events, "b", 0.2))
    for t in ts:
        t.join(5)
    at = {(k, n): t for k, n, t in events}
    return at[("in", "b")] < at[("out", "a")]


def test_a_test_kept_from_live_runs_shares_the_cpus_with_unit_tests_only(tmp_path):
    assert _overlap("objects", "unit", tmp_path) and _overlap("unit", "objects", tmp_path)
    assert not _overlap("objects", "runs", tmp_path) and not _overlap("runs", "objects", tmp_path)
    assert not _overlap("objects", "objects", tmp_path)
    assert not _overlap("alone", "unit", tmp_path) and not _overlap("unit", "alone", tmp_path)
    assert _overlap("runs", "unit", tmp_path) and _overlap("runs", "runs", tmp_path)


def test_alone_inside_a_run_while_the_other_lane_waits_to_keep_runs_out_does_not_deadlock(tmp_path):
    """One lane inside a test that holds the objects shared asks to be alone (a session run) while the other
    waits for the objects exclusively: the first drops what it holds before it waits, so both get through."""
    path = tmp_path / "lanes.lock"
    done: list = []

    def runs_then_alone():
        lock = lanes.LaneLock(path)
        with lock.hold("runs"):
            time.sleep(0.3)
            with lock.alone():
                time.sleep(0.1)
        done.append("runs")

    def objects():
        lock = lanes.LaneLock(path)
        time.sleep(0.1)
        with lock.hold("objects"):
            time.sleep(0.1)
        done.append("objects")
    ts = [threading.Thread(target=runs_then_alone), threading.Thread(target=objects)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(5)
    assert sorted(done) == ["objects", "runs"], done


def test_alone_inside_shared_holds_waits_for_the_other_lane_and_two_at_once_do_not_deadlock(tmp_path):
    path = tmp_path / "lanes.lock"
    events: list = []

    def lane(name, hold_before, hold_alone):
        lock = lanes.LaneLock(path)
        with lock.hold("runs"):
            time.sleep(hold_before)
            with lock.alone():
                events.append(("in", name, time.monotonic()))
                time.sleep(hold_alone)
                events.append(("out", name, time.monotonic()))
    ts = [threading.Thread(target=lane, args=("a", 0.1, 0.3)), threading.Thread(target=lane, args=("b", 0.1, 0.3))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    assert not any(t.is_alive() for t in ts), "two lanes asking to be alone at once must not deadlock"
    spans = sorted((t_in, next(t for k, n, t in events if k == "out" and n == name))
                   for k, name, t_in in events if k == "in")
    assert len(spans) == 2 and spans[0][1] <= spans[1][0], f"the two alone blocks overlapped: {spans}"


def test_every_alone_entry_names_a_module_and_a_test_that_exist():
    """A renamed test would silently lose its entry and run beside the other lane."""
    integration = Path(__file__).resolve().parent.parent / "integration"
    for key in [*lanes.EXCLUSIVE, *lanes.MACHINE_OBJECTS, *lanes.LATE]:
        module, _, prefix = key.partition("::")
        text = (integration / module).read_text()
        assert not prefix or re.search(rf"^def {re.escape(prefix)}", text, re.M), key
    for modules, _ in lanes.SAME_LANE.values():
        assert all((integration / m).exists() for m in modules), modules
