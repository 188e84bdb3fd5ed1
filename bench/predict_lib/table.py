"""bench/predict's table: predict from BASE (with SCENARIO options) the client counts of the measured runs."""
import json
import shlex
import subprocess
import sys
from pathlib import Path

from pathprof.analysis.speed import sampled_ratio

target, base, scenario, *measured = sys.argv[1:]
# columns: target | scenario | clients | predicted | band | measured (no probes) | error | in band | limited by |
#          foreign CPUs during the measured run (other processes on this shared machine) | predicted with that
#          foreign load (--foreign-cpus) | its error | the hypervisor's steal in base / measured run (a row with
#          steal >= 2 % is the host's weather, not the model's: analysis.steal) | base -> measured run |
#          the machine's speed at the measured run against the base's (run.json host.cpu_speed: 1.20 =
#          the same work took 20 % longer) | the error with that drift removed (the prediction divided by it)
HERE = Path(__file__).resolve().parents[2]
pp = str(HERE / ".venv/bin/pathprof")
points = dict(m.split("=", 1) for m in measured)
clients = ",".join(sorted(points, key=int))
want = "as recorded" if not scenario else None


def predicted(c: str, foreign: float) -> dict:
    doc = json.loads(subprocess.run([pp, "predict", base, "--clients", c, "--json", "--foreign-cpus", f"{foreign:.3f}",
                                     *shlex.split(scenario)], check=True, capture_output=True, text=True).stdout)
    return [r for r in doc["scenarios"] if r["clients"] == int(c) and (r["scenario"] == want if want
                                                                       else r["scenario"] != "as recorded")][0]


def steal_of(run: str) -> float:
    doc = json.loads(subprocess.run([pp, "report", run, "--json"], check=True, capture_output=True, text=True).stdout)
    return float((doc.get("steal") or {}).get("pct") or 0.0)


def host_of(run: str) -> dict | None:
    return json.loads((Path(run) / "run.json").read_text()).get("host")


base_steal = steal_of(base)
base_host = host_of(base)
for c, run_dir in sorted(points.items(), key=lambda kv: int(kv[0])):
    s = json.loads(subprocess.run([pp, "report", run_dir, "--json"], check=True, capture_output=True, text=True).stdout)
    steal = float((s.get("steal") or {}).get("pct") or 0.0)
    meas = (s.get("windows") or {}).get("tps_out") or s["tps"]
    other = {c["component"]: c["us_per_txn"] for c in s.get("cpu") or []}.get("other", 0.0)
    foreign = other * ((s.get("windows") or {}).get("tps_in") or s["tps"]) / 1e6
    row = predicted(c, 0.0)
    shared = predicted(c, foreign)
    err_shared = (shared["tps"] - meas) / meas * 100.0
    err = (row["tps"] - meas) / meas * 100.0
    inside = row["tps_low"] <= meas <= row["tps_high"]
    ub = "*" if row.get("idle_wakeups_unpriced") else ""
    drift = sampled_ratio(base_host, host_of(run_dir))
    drift_cells = (f"{drift:.2f} | {(row['tps'] / drift - meas) / meas * 100:+.1f} %" if drift else "– | –")
    print(f"| {target} | {row['scenario']} | {c} | {ub}{row['tps']:,.0f} | "
          f"{row['tps_low']:,.0f}–{row['tps_high']:,.0f} | "
          f"{meas:,.0f} | {err:+.1f} % | {'yes' if inside else 'no'} | {row['limited_by']} | {foreign:.2f} | "
          f"{'*' if shared.get('idle_wakeups_unpriced') else ''}{shared['tps']:,.0f} | {err_shared:+.1f} % | "
          f"{base_steal:.1f} / {steal:.1f} % | {Path(base).name} → {Path(run_dir).name} | {drift_cells} |", flush=True)
