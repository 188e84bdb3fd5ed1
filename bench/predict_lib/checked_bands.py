"""bench/predict's bands judged against its own rounds: for each target, the band each round's prediction was given
(the run's own spread, closure and probe effect: predict._band), against the band a machine that had checked the
*other* rounds' predictions of the same question on the same shape of path would give it (analysis.prediction_misses:
leave-one-round-out, as `compare` and `sweep` teach it), and how many rounds' measurements each band held. From the
table's rows alone: each row's error is what a check remembers.

    bench/predict_lib/checked_bands.py TABLE.md"""
import statistics
import sys

from medians import number, rows
from pathprof.analysis.prediction_misses import MIN_CHECKS, conformal_half

SHAPES = {"docker-dnat": "docker-proxy", "pgbouncer": "pgbouncer"}   # the topologies' hops; the rest are direct


def question_of(target: str, clients: int) -> tuple[str, str]:
    """(question, shape of path) of a bench target's row: every base is the 16-client run."""
    if target.startswith("without-"):
        return "without a hop", target[len("without-"):]
    topo = target[len("clients-"):]
    return ("fewer clients" if clients < 16 else "more clients"), SHAPES.get(topo, "direct")


def own_bands(path: str) -> dict[tuple, list[float]]:
    """(target, scenario, clients) -> each round's own band half-width, % of its prediction."""
    out: dict[tuple, list[float]] = {}
    for line in open(path):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        try:
            key, pred = (cells[0], cells[1], int(cells[2])), number(cells[3])
            low, high = (number(x) for x in cells[4].split("–"))
        except (ValueError, IndexError):
            continue
        out.setdefault(key, []).append((high - low) / 2 / pred * 100.0)
    return out


def main() -> int:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    table, own = rows(sys.argv[1]), own_bands(sys.argv[1])
    errors: dict[tuple, list[tuple[int, float]]] = {}     # (question, shape) -> [(round, error)]
    for (target, scenario, clients), rs in table.items():
        for rnd, (_p, _m, err, _d) in enumerate(rs):
            errors.setdefault(question_of(target, clients), []).append((rnd, err))
    print("| target | clients | rounds | own band (median) | rounds in it | checked band (median) | rounds in it |"
          " checks per band |")
    print("|---|---|---|---|---|---|---|---|")
    held = {"own": [0, 0], "checked": [0, 0]}
    for (target, scenario, clients), rs in table.items():
        q = question_of(target, clients)
        checked, n_checks = [], []
        for rnd, (_p, _m, err, _d) in enumerate(rs):
            others = [e for r, e in errors[q] if r != rnd]
            n_checks.append(len(others))
            checked.append(conformal_half(others) if len(others) >= MIN_CHECKS else None)
        mine = own[(target, scenario, clients)]
        in_own = sum(abs(e) <= b for (_p, _m, e, _d), b in zip(rs, mine))
        judged = [(abs(e) <= b) for (_p, _m, e, _d), b in zip(rs, checked) if b is not None]
        held["own"][0] += in_own
        held["own"][1] += len(rs)
        held["checked"][0] += sum(judged)
        held["checked"][1] += len(judged)
        med = statistics.median(b for b in checked if b is not None) if judged else None
        print(f"| {target} | {clients} | {len(rs)} | ±{statistics.median(mine):.1f} % | {in_own} of {len(rs)} | "
              f"{'–' if med is None else f'±{med:.1f} %'} | {sum(judged)} of {len(judged)} | "
              f"{min(n_checks)}–{max(n_checks)} |")
    for name, (k, n) in held.items():
        print(f"{name} bands held {k} of {n} rounds' measurements")
    return 0


if __name__ == "__main__":
    sys.exit(main())
