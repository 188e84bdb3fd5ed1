"""Per transaction, what each process of a run spent on the CPUs and how often it was switched in: the figures a hop
removal changes (issue #36.1). Reads recorded run directories (their cpu.parquet and the report's closure).

    bench/predict_lib/parts.py RUN_DIR [RUN_DIR ...] [--json]

Prints one column per run: TPS outside the windows, steal, each role's user and sys µs per transaction, its
switches per transaction, softirq, netfilter, other processes, the CPUs' idle switches and the probes' cost."""
import argparse
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parents[2]


def parts(run_dir: str) -> dict:
    rep = json.loads(subprocess.run([str(HERE / ".venv/bin/pathprof"), "report", run_dir, "--json"], check=True,
                                    capture_output=True, text=True).stdout)
    txns = rep["closure"]["txns"]
    cpu = pd.read_parquet(Path(run_dir) / "cpu.parquet")
    out = {"run": Path(run_dir).name, "tps": rep.get("tps_whole_run") or rep["tps"],
           "steal %": (rep.get("steal") or {}).get("pct") or 0.0, "probes": rep.get("probe_cost_ns_per_txn", 0) / 1e3}
    for (role, hop, comp), g in cpu.groupby(["role", "hop", "comp"]):
        who = hop or role or comp
        if comp in ("user", "sys"):
            out[f"{who}.{comp}"] = g.ns.sum() / 1e3 / txns
            if comp == "user":
                out[f"{who} switches"] = g["count"].sum() / txns
        elif comp == "idle":
            out["idle switches"] = g["count"].sum() / txns
        else:
            out[comp] = out.get(comp, 0.0) + g.ns.sum() / 1e3 / txns
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = [parts(r) for r in a.runs]
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    keys = [k for k in dict.fromkeys(k for r in rows for k in r if k != "run")
            if any(abs(r.get(k, 0.0)) >= 0.005 for r in rows)]
    print(f"{'':24}" + "".join(f"{r['run'][-24:]:>26}" for r in rows))
    for k in keys:
        print(f"{k:24}" + "".join(f"{r.get(k, 0.0):>26,.2f}" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
