"""Lost and unpaired events in words, with their share of all events of the same kind."""
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from pathprof.analysis import losses
from pathprof.analysis.report.render import render_to_string, report_view
from pathprof.analysis.rundir import RunDir
from pathprof.analysis.summary import summarize

DATA = Path(__file__).parent / "data" / "runs"


def _stages(**counts):
    return pd.DataFrame([{"kind": k, "count": n} for k, n in counts.items()])


def test_each_counter_is_said_with_its_share_and_meaning():
    counters = {"messages": 475_503, "piece_late": 0, "proc_unpaired": 93_288, "wire_unpaired": 49,
                "dev_overwritten": 2, "traces": 0}
    lost = {"proc_unpaired": 93_288, "wire_unpaired": 49, "dev_overwritten": 2}
    cpu = pd.DataFrame([{"comp": "user", "count": 1000}, {"comp": "sys", "count": 1000}])
    items = losses.describe(lost, counters, _stages(proc=459_157, dev=552_457), cpu, run_cnt=6_086_385)
    assert [i["name"] for i in items] == ["proc_unpaired", "wire_unpaired", "dev_overwritten"]   # largest first
    proc = items[0]
    assert proc["of"] == 459_157 + 93_288 and proc["share_pct"] == round(93_288 / 552_445 * 100, 3)
    assert proc["text"].startswith("93,288 of 552,445 sends (16.9 %) had no read before them")
    assert "may be in no stage" in proc["text"] and "short by" not in proc["text"]   # no closure to say so
    assert items[1]["text"].startswith("49 of 475,503 messages (<0.1 %)")
    assert items[2]["text"].startswith("2 of 552,459 device packets (<0.1 %)")
    head, *rest = losses.notes(items, 6_086_385)
    assert head.startswith("93,339 probe events were lost or could not be paired, 1.5 % of the ≈6.1 M")
    assert rest == [i["text"] for i in items]


def test_a_hops_relayed_forwards_began_messages_but_are_not_unpaired():
    # pgbouncer relaying a 2 MB result (2026-11-28, 1 client, 3 s): its forwards of the reply's later parts have no
    # proc span (relay.bpf.h) but begin messages into the client; counted, they are neither paired nor unpaired
    counters = {"messages": 46_425, "proc_unpaired": 54_732, "piece_more": 24_899, "wire_unpaired": 1}
    stages = _stages(wire=46_424, proc=43_902)       # 21,526 messages begun, 19,003 of them by a paired send
    before = losses.describe({"proc_unpaired": 54_732}, counters, stages, None)[0]
    after = losses.describe({"proc_unpaired": 54_732}, {**counters, "relay_sent": 2_500}, stages, None)[0]
    assert before["count"] == 2_523 and after["count"] == 23 and after["of"] == before["of"] + 2_500
    assert after["parts"] + after["count"] == 54_732


def test_without_a_denominator_the_count_is_still_explained():
    (item,) = losses.describe({"socks_full": 3}, {}, None, None)
    assert item["share_pct"] is None and item["text"].startswith("3 sockets could not be given probe storage")
    assert losses.describe({}, {"messages": 10}) == [] and losses.notes([], None) == []


def test_report_of_a_recorded_run_words_its_losses(tmp_path):
    shutil.copytree(DATA / "loopback", tmp_path / "run")
    meta_path = tmp_path / "run" / "run.json"
    meta = json.loads(meta_path.read_text())
    meta["probes"]["notes"] = list(meta["probes"].get("notes") or []) + ["lost/unpaired events: wire_unpaired=2"]
    meta_path.write_text(json.dumps(meta))
    s = summarize(RunDir.open(tmp_path / "run"))
    assert {i["name"] for i in s["losses"]} == set(meta["probes"]["lost"])
    assert not any(n.startswith("lost/unpaired events:") for n in s["notes"])   # the bare note is replaced
    out = render_to_string(report_view(s))
    wire = next(i for i in s["losses"] if i["name"] == "wire_unpaired")
    assert wire["of"] > 2 and f"2 of {wire['of']:,} messages" in out.replace("\n", " ")


def _big_result_stages():
    """The stage counts of a 2 MB result per query over nic (1 client, extended, 3 s, 97 transactions,
    2026-11-27): 262 sends per reply, 129 further pieces per reply, the backend's work timed piece to piece."""
    return pd.DataFrame([{"kind": "proc", "count": 10_871, "sum_ns": 2_702_711_186},
                         {"kind": "wire", "count": 12_732, "sum_ns": 196_605_000}])


BIG = {"proc_unpaired": 25_449, "ready_race": 1}
BIG_COUNTERS = {**BIG, "messages": 3_307, "piece_late": 9_425, "piece_more": 12_530, "wire_unpaired": 0}


def test_later_parts_of_a_reply_are_not_unpaired():
    items = losses.describe(BIG, BIG_COUNTERS, _big_result_stages(), None, run_cnt=145_513)
    proc = items[0]
    assert proc["parts"] == 25_449 - 202 and proc["count"] == 202           # at most the messages begun
    assert proc["count"] / proc["of"] <= 0.01, proc                          # ≤ 1 % of sends called unpaired
    assert proc["text"].startswith("at most 202 of 36,320 sends (0.6 %)")
    assert "25,247 further sends were later parts of messages sent in parts (12,530 further pieces" in proc["text"]
    head = losses.notes(items, 145_513)[0]
    assert head.startswith("203 probe events were lost or could not be paired, 0.1 %"), head
    # a run whose messages are whole (no further pieces) keeps every unpaired send
    whole = losses.describe(BIG, {**BIG_COUNTERS, "piece_more": 0}, _big_result_stages(), None)
    assert whole[0]["count"] == 25_449 and "parts" not in whole[0]


def test_every_loss_states_its_time_against_the_closure():
    items = losses.describe(BIG, BIG_COUNTERS, _big_result_stages(), None, run_cnt=145_513)
    closed = {"closure": {"latency_error_pct": 0.19, "cycle_us": 31_019.6, "txns": 97}}
    losses.against_closure(items, closed, _big_result_stages())
    proc = items[0]
    # 202 sends × the mean sender span (248.6 µs) over 97 transactions
    assert proc["cost_us_per_txn"] == pytest.approx(202 * 2_702_711_186 / 10_871 / 1e3 / 97, abs=0.1)
    assert proc["closure_short_us_per_txn"] == 0.0
    assert "the latency view closes at +0.19 %, so it is not short by them" in proc["text"]
    assert proc["text"].endswith("their work is timed between the pieces, not unpaired")
    assert "cost_us_per_txn" not in items[1]                                 # a race resolved costs nothing
    short = {"closure": {"latency_error_pct": -4.0, "cycle_us": 1_000.0, "txns": 97}}
    items = losses.describe({"wire_unpaired": 500}, {"messages": 20_000}, _big_result_stages(), None)
    losses.against_closure(items, short, _big_result_stages())
    assert items[0]["closure_short_us_per_txn"] == 40.0
    assert "closes at -4.00 %: at most 40.0 µs per transaction is missing from it, so they cost no more" in \
        items[0]["text"]
    cpu = losses.describe({"switch_in_unseen": 7}, {}, None, pd.DataFrame([{"comp": "user", "count": 900}]))
    losses.against_closure(cpu, {"closure": {"cpu_error_pct": 0.4, "txns": 97}, "cpu_us_per_txn": 55.0}, None)
    assert "their time is not known: the cpu view closes at +0.40 %, so it is not short by them" in cpu[0]["text"]
