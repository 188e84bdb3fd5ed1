"""The way each probe event is measured, chosen per kernel (pathprof.agent.probing.hooks), against fake kernels:
the 6.18 of this project's VM (tracepoints, fentry refused), Debian 12's 6.1 (no sk_data_ready & co, fentry works),
a kernel without kprobes or fentry. The program table is the real object's, read from pathprof-compat.bpf.o."""
from pathlib import Path

import pytest
from pathprof.agent.probing import hooks as H

PROBES = Path(__file__).resolve().parents[2] / "probes"
LATE_TRACEPOINTS = {"sk_data_ready", "sock_recv_length", "sock_send_length", "tcp_sendmsg_locked"}


class FakeKernel:
    """The KernelFacts methods, from sets."""

    def __init__(self, tracepoints=(), funcs=(), traceable=None, kprobes=False, fentry_error=None, symbols=(),
                 netfilter_links=False, helpers=None, map_types=None, fetch_atomics=True, switch_prev_state=True):
        self.tps, self.funcs, self.symbols = set(tracepoints), set(funcs), set(symbols)
        self.netfilter_links = netfilter_links
        # helpers and map types: None = every one (a kernel from 5.18 on has what the objects ask for)
        self.helpers, self.map_types = helpers, map_types
        self.fetch_atomics, self.switch_prev_state = fetch_atomics, switch_prev_state
        self._traceable = None if traceable is None else set(traceable)
        self.kprobes, self.fentry_error = kprobes, fentry_error

    def has_tracepoint(self, name):
        return name in self.tps

    def has_btf_func(self, name):
        return name in self.funcs

    def has_helper(self, name):
        return self.helpers is None or name in self.helpers

    def has_map_type(self, name):
        return self.map_types is None or name in self.map_types

    def traceable(self, name):
        return None if self._traceable is None else name in self._traceable

    def has_kprobes(self):
        return self.kprobes

    def has_symbol(self, name):
        return name in self.symbols


@pytest.fixture(scope="module")
def programs():
    from pathprof.agent.probing.bpf.libbpf import BpfObject
    with BpfObject(str(PROBES / "pathprof-compat.bpf.o")) as o:
        return {n: p.section for n, p in o.programs.items()}


def _all_tracepoints(programs):
    return {sec.split("/", 1)[1] for sec in programs.values() if sec.startswith("tp_btf/")}


FUNCS = {"sock_def_readable", "tcp_sendmsg_locked", "inet_recvmsg", "unix_stream_recvmsg", "inet_sendmsg",
         "unix_stream_sendmsg", "nf_hook_slow", "bpf_rdonly_cast", "bpf_sk_storage_get_tracing"}


def test_every_tracepoint_present_chooses_tp_btf_and_leaves_every_fallback_out(programs):
    # this VM: every tracepoint, fentry refused -- the fentry refusal is never even asked about
    k = FakeKernel(_all_tracepoints(programs), FUNCS, fentry_error="Operation not permitted", netfilter_links=True)
    choices = H.choose(programs, k)
    assert all(c.chosen and c.chosen.kind in ("tp_btf", "netfilter link") for c in choices)
    unused = H.unused_programs(choices)
    assert unused == {n for n in programs if "__" in n and H.kind_of(programs[n])}
    assert "pp_sk_data_ready__fentry" in unused and "pp_sk_data_ready" not in unused
    assert H.object_for(k) == H.MAIN_OBJECT


def test_debian_12_kernel_takes_fentry_fexit_for_the_late_tracepoints(programs):
    k = FakeKernel(_all_tracepoints(programs) - LATE_TRACEPOINTS, FUNCS - {"bpf_rdonly_cast"}, traceable=FUNCS)
    by_event = {H.event_name(c.event): c for c in H.choose(programs, k)}
    dr = by_event["sk_data_ready"]
    assert dr.chosen.describe() == "fentry sock_def_readable"
    assert [w.describe() for w, _ in dr.refused] == ["tp_btf sk_data_ready"]
    assert "no tracepoint sk_data_ready" in dr.refused[0][1]
    # both protocols' recvmsg make up one way: AF_UNIX and TCP paths alike
    assert sorted(n for n, _ in by_event["sock_recv"].chosen.programs) == ["pp_sock_recv__fexit_inet",
                                                                          "pp_sock_recv__fexit_unix"]
    assert by_event["tcp_send"].chosen.kind == "fentry/fexit"
    unused = H.unused_programs(list(by_event.values()))
    assert {"pp_sk_data_ready", "pp_sock_recv", "pp_sock_send", "pp_tcp_send"} <= unused
    assert not unused & {"pp_sk_data_ready__fentry", "pp_sched_switch"}
    assert H.object_for(k) == H.COMPAT_OBJECT
    # no BPF netfilter links (6.4): the brackets come from fentry/fexit on nf_hook_slow
    rec = {e["event"]: e for e in H.hooks_record(list(by_event.values()), H.COMPAT_OBJECT)["events"]}
    assert rec["nf_begin"]["hook"] == "fentry nf_hook_slow" and rec["nf_end"]["hook"] == "fexit nf_hook_slow"
    assert "Linux 6.4" in rec["nf_begin"]["refused"][0]["why"]


def test_a_function_ftrace_cannot_attach_to_is_refused_with_its_reason(programs):
    k = FakeKernel(_all_tracepoints(programs) - {"sk_data_ready"}, FUNCS, traceable=FUNCS - {"sock_def_readable"})
    dr = {H.event_name(c.event): c for c in H.choose(programs, k)}["sk_data_ready"]
    assert dr.chosen is None
    assert "available_filter_functions" in dr.refused[1][1]
    assert {"pp_sk_data_ready", "pp_sk_data_ready__fentry"} <= H.unused_programs([dr])
    label, ok, detail = H.describe_choices([dr])[0]
    assert not ok and "stage it feeds is missing" in detail


def test_fentry_refused_by_the_kernel_leaves_the_event_without_a_way(programs):
    k = FakeKernel(_all_tracepoints(programs) - {"sock_send_length"}, FUNCS, fentry_error="Operation not permitted")
    send = {H.event_name(c.event): c for c in H.choose(programs, k)}["sock_send"]
    assert send.chosen is None and "fentry/fexit refused here: Operation not permitted" in send.refused[-1][1]


def test_kprobe_way_needs_the_pmu_and_the_symbol():
    progs = {"pp_x": "tp_btf/x", "pp_x__kprobe": "kprobe/f"}
    assert H.choose(progs, FakeKernel(kprobes=True, symbols={"f"}))[0].chosen.kind == "kprobe"
    assert "no kprobes" in H.choose(progs, FakeKernel(symbols={"f"}))[0].refused[-1][1]
    assert "no symbol f" in H.choose(progs, FakeKernel(kprobes=True))[0].refused[-1][1]


def test_ways_are_tried_in_kind_order_whatever_the_object_order():
    progs = {"pp_y__kp": "kprobe/g", "pp_y__fe": "fentry/g", "pp_y": "tp_btf/y", "pp_z": "usdt"}
    ways = H.group_ways(progs)
    assert list(ways) == ["pp_y"] and [w.kind for w in ways["pp_y"]] == ["tp_btf", "fentry/fexit", "kprobe"]


def test_minimum_kernel_names_what_is_missing():
    assert H.kernel_shortfalls(False, set(), "6.1.0")[0].startswith("BTF")
    everything = {name for name, _ in H.REQUIREMENTS}
    assert H.kernel_shortfalls(True, everything, "6.1.0-56-amd64") == []
    assert H.kernel_shortfalls(True, everything, "5.10.0-32-amd64") == []    # the 510 object runs there
    old = H.kernel_shortfalls(True, everything - {"BPF_FUNC_ringbuf_output", "BPF_MAP_TYPE_RINGBUF"}, "5.4.0")
    assert any("ring buffers (Linux 5.8)" in m for m in old)


def test_debian_11_kernel_takes_the_510_object_and_doctor_says_why():
    """Debian 11's 5.10 (its BTF, checked 2026-11-27 in linux-image-5.10.0-32-amd64): no BPF_MAP_TYPE_TASK_STORAGE nor
    bpf_task_storage_get, bpf_get_current_task_btf, bpf_sk_storage_get_tracing (bpf_sk_storage_get is there, for
    networking programs only), sched_switch with three arguments; 5.10 < 5.12: no fetching atomics."""
    k = FakeKernel(funcs=FUNCS - {"bpf_rdonly_cast", "bpf_sk_storage_get_tracing"},
                   helpers={"sk_storage_get", "ringbuf_output", "probe_read_kernel", "get_current_task"},
                   map_types={"HASH", "RINGBUF", "SK_STORAGE"}, fetch_atomics=False, switch_prev_state=False)
    assert H.object_for(k) == H.OLD_OBJECT and H.conn_object_for(k) == H.CONN_OLD_OBJECT
    lacks = H.old_kernel_lacks(k)
    assert len(lacks) == 5 and "task-local storage" in lacks[0] and "Linux 5.12" in lacks[3]
    why = H.describe_object(k)
    assert why.startswith("pathprof-510.bpf.o (") and "hash maps" in why and "sched_switch" in why
    # 5.12 .. 5.17 (Ubuntu 22.04's 5.15): everything but sched_switch's prev_state: the 510 object as well
    assert H.object_for(FakeKernel(funcs=FUNCS - {"bpf_rdonly_cast"}, switch_prev_state=False)) == H.OLD_OBJECT
    # 5.18 .. 6.1: compat, as before
    assert H.object_for(FakeKernel(funcs=FUNCS - {"bpf_rdonly_cast"})) == H.COMPAT_OBJECT
    assert H.conn_object_for(FakeKernel(funcs=FUNCS)) == H.CONN_OBJECT


def test_pretended_lacks_take_this_kernel_for_a_510_one(monkeypatch):
    monkeypatch.setenv(H.LACKS_ENV, "TASK_STORAGE,fetch_atomics,prev_state")
    f = H.KernelFacts()
    assert not f.has_map_type("TASK_STORAGE") and not f.fetch_atomics and not f.switch_prev_state
    assert H.object_for(f) == H.OLD_OBJECT
    assert not H.KernelFacts(release="5.10.0-32-amd64").fetch_atomics
    monkeypatch.delenv(H.LACKS_ENV)
    assert H.KernelFacts(release="6.1.0-56-amd64").fetch_atomics and H.KernelFacts(release="weird").fetch_atomics


def test_diff_warns_when_two_runs_were_measured_through_different_hooks():
    from pathprof.analysis.host_diff import hook_differences
    vm = {"object": "pathprof.bpf.o", "events": [{"event": "sk_data_ready", "hook": "tp_btf sk_data_ready"},
                                                 {"event": "netfilter", "hook": "netfilter link"}]}
    deb12 = {"object": "pathprof-compat.bpf.o", "events": [
        {"event": "sk_data_ready", "hook": "fentry sock_def_readable"}, {"event": "netfilter", "hook": None}]}
    lines = hook_differences(vm, deb12)
    assert "sk_data_ready: tp_btf sk_data_ready → fentry sock_def_readable" in lines[0]
    assert lines[0].startswith("WARNING measured through different hooks")
    assert "netfilter: netfilter link → none (stage missing)" in lines[1]
    assert "probe object" in lines[2]
    assert hook_differences(vm, vm) == [] and hook_differences(vm, None) == []


def test_this_kernel_with_every_tracepoint_keeps_the_first_ways():
    """On a kernel that has every tracepoint and netfilter links (this project's 6.18), the real lookups choose
    the main object and the first way of every event: nothing the probes measure or cost changes there."""
    from pathprof.agent.probing.bpf.libbpf import BpfObject, kernel_has_tracepoint
    facts = H.KernelFacts()
    if not all(kernel_has_tracepoint(tp) for tp in LATE_TRACEPOINTS) or not facts.netfilter_links:
        pytest.skip("not a kernel with every first way")
    assert H.object_for(facts) == H.MAIN_OBJECT
    with BpfObject(str(PROBES / H.MAIN_OBJECT)) as o:
        choices = H.choose({n: p.section for n, p in o.programs.items()}, facts)
    assert all(c.chosen is c.ways[0] and not c.refused for c in choices), [c.to_json() for c in choices if c.refused]


def test_a_kernel_without_skc_to_unix_sock_is_not_refused_and_the_run_says_what_it_lacks(monkeypatch):
    """bpf_skc_to_unix_sock (5.16) is optional: the minimum kernel no longer needs it (Ubuntu 22.04's 5.15 and
    RHEL 9's 5.14 have everything else), and a kernel without it records what its runs lack."""
    everything = {name for name, _ in H.REQUIREMENTS}
    assert "BPF_FUNC_skc_to_unix_sock" not in everything
    assert H.kernel_shortfalls(True, everything, "5.15.0-91-generic") == []
    assert H.kernel_shortfalls(True, everything, "5.14.0-362.el9.x86_64") == []

    class Helpers:
        lacks = frozenset()

        def __init__(self, helpers):
            self.helpers = helpers

        def has_helper(self, name):
            return name in self.helpers
    (d,) = H.degraded(Helpers(set()))
    assert d["feature"] == "unix stream peer" and "5.16" in d["needs"] and "window stall" in d["effect"]
    assert H.degraded(Helpers({"skc_to_unix_sock"})) == []
    rec = H.hooks_record([], "pathprof-compat.bpf.o", facts=Helpers(set()))
    assert rec["degraded"] == [d] and "pretended" not in rec


def test_pretended_lacks_hide_what_the_kernel_has(monkeypatch):
    """PATHPROF_KERNEL_LACKS takes this kernel as an older one: tracepoints, kfuncs, helpers, netfilter links and
    fentry named there are absent for the selection, without a lookup."""
    monkeypatch.setenv(H.LACKS_ENV, "sk_data_ready, bpf_rdonly_cast,skc_to_unix_sock,netfilter_links,fentry")
    f = H.KernelFacts()
    assert f.lacks == {"sk_data_ready", "bpf_rdonly_cast", "skc_to_unix_sock", "netfilter_links", "fentry"}
    assert not f.has_tracepoint("sk_data_ready") and not f.has_btf_func("bpf_rdonly_cast")
    assert not f.has_helper("skc_to_unix_sock") and not f.netfilter_links
    assert "PATHPROF_KERNEL_LACKS" in f.fentry_error
    assert H.object_for(f) == H.COMPAT_OBJECT
    rec = H.hooks_record([], H.COMPAT_OBJECT, facts=f)
    assert rec["pretended"] == sorted(f.lacks) and rec["degraded"][0]["feature"] == "unix stream peer"
    monkeypatch.delenv(H.LACKS_ENV)
    assert H.KernelFacts().lacks == frozenset()
