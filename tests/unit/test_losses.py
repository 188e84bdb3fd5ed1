"""Lost and unpaired events in words, with their share of all events of the same kind."""
import json
import shutil
from pathlib import Path

import pandas as pd
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
    assert "short by" in proc["text"]
    assert items[1]["text"].startswith("49 of 475,503 messages (<0.1 %)")
    assert items[2]["text"].startswith("2 of 552,459 device packets (<0.1 %)")
    head, *rest = losses.notes(items, 6_086_385)
    assert head.startswith("93,339 probe events were lost or could not be paired, 1.5 % of the ≈6.1 M")
    assert rest == [i["text"] for i in items]


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
