"""bench/predict's summary over several rounds (PP_BENCH_ROUNDS): per target, scenario and client count, the
median prediction, the median measurement, the error of the medians, and each round's error (its range and how
many rounds were within 15 %). On this 2-CPU VM the same run's TPS moves by 15-25 % within minutes (the same
16-client loopback run: 104,682 then 75,796 TPS two minutes apart, 2026-11-28), so one pair of runs cannot tell a
model's error from the machine's drift; the medians of a few interleaved rounds can.

    bench/predict_lib/medians.py TABLE.md"""
import statistics
import sys

TARGET_PCT = 15.0


def number(cell: str) -> float:
    return float(cell.strip().lstrip("*").replace(",", "").replace("%", "").strip())


def rows(path: str) -> dict[tuple, list[tuple[float, float, float, float | None]]]:
    """(target, scenario, clients) -> [(predicted, measured, error %, the machine's speed drift from the base to
    the measured run or None)], one per round, in the table's order."""
    out: dict[tuple, list] = {}
    for line in open(path):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 7:
            continue
        try:
            key = (cells[0], cells[1], int(cells[2]))
            drift = number(cells[14]) if len(cells) > 15 and cells[14] not in ("", "–") else None
            out.setdefault(key, []).append((number(cells[3]), number(cells[5]), number(cells[6]), drift))
        except ValueError:
            continue          # a header or a line that is not a row
    return out


def main() -> int:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    table = rows(sys.argv[1])
    if not table:
        print(f"medians: no row in {sys.argv[1]}", file=sys.stderr)
        return 2
    print("| target | scenario | clients | rounds | predicted (median) | measured (median) | error of the medians | "
          "each round's error | rounds within 15 % | the machine's drift, base → measured | each round's error, "
          "drift removed | rounds within 15 %, drift removed |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (target, scenario, clients), got in table.items():
        pred = statistics.median(g[0] for g in got)
        meas = statistics.median(g[1] for g in got)
        errs = [g[2] for g in got]
        within = sum(abs(e) <= TARGET_PCT for e in errs)
        line = (f"| {target} | {scenario} | {clients} | {len(got)} | {pred:,.0f} | {meas:,.0f} | "
                f"{(pred - meas) / meas * 100:+.1f} % | {min(errs):+.1f} … {max(errs):+.1f} % | "
                f"{within} of {len(got)} |")
        drifts = [g for g in got if g[3]]
        if drifts:      # each round's prediction divided by the drift its own pair of runs saw
            fixed = [(p / d - m) / m * 100 for p, m, _, d in drifts]
            line += (f" {min(g[3] for g in drifts):.2f} … {max(g[3] for g in drifts):.2f} | "
                     f"{min(fixed):+.1f} … {max(fixed):+.1f} % | "
                     f"{sum(abs(e) <= TARGET_PCT for e in fixed)} of {len(fixed)} |")
        else:
            line += " – | – | – |"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
