"""What the probes' repeated timings do to the speedup interval (issue 8): every stored closed loop re-analysed with
the step-time fit's spread as before (rms residual; overhead σ from standard errors) and with the repeats' spread as
a floor (``calibration.fit.repeat_spread_floors``). Analysis of stored records only, no timing.

For each (measurements, calibration) pair: the pooled repeat σ of steps and of model drafters' cycles (and the
cycles' semi-deviations below / above each point's median), ``timing_rms_rel`` and ``proposer_overhead_log_std``,
and the closed loop's median |error|, signs right, interval coverage, median relative interval width
(high − low) / predicted, and go/no-go answers, over all points and per method, for three versions of the fit:
"before" (``repeat_spread_floors`` switched off), "symmetric" (as it ships: the proposer's σ floored on both
sides by the cycles' pooled σ, ``repeat_log_std``) and "split" (``split=True``: the cycles' semi-deviations,
``repeat_semi_log_stds``, floor a two-piece σ below / above the point estimate; not shipped, see
docs/gpu-closed-loop.md).

    python -m benchmarks.repeat_spread [--json OUT]
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path
from unittest import mock

import numpy as np

from advisor.costmodel.decision import GO_THRESHOLD as GO
from benchmarks import closed_loop as cl
from benchmarks import gpu_closed_loop as gcl
from calibration import fit

DATA = gcl.REPO_ROOT / "benchmarks" / "data"
H200 = "h200-vllm0.24"
# (measurements, calibration) of every stored H200 closed loop, as tests/calibration/test_gpu_data.py pairs them
GPU_PAIRS = ((H200, H200), (f"{H200}-run2", f"{H200}-run2"), (f"{H200}-run2", f"{H200}-run2-repeat"),
             (f"{H200}-run2", H200), (f"{H200}-run3", f"{H200}-run3"), (f"{H200}-run3", f"{H200}-run4"),
             (f"{H200}-run4", f"{H200}-run4"), (f"{H200}-run4", f"{H200}-run3"), (f"{H200}-run5", f"{H200}-run5"),
             (f"{H200}-run5", f"{H200}-run5-second"), (f"{H200}-run6", f"{H200}-run6"))
# (name, calibration records, measurements) of the CPU closed loop (docs/closed-loop.md)
CPU_RUNS = (("cpu plan", "closed_loop_2026-12-01-plan-records.jsonl",
             ("closed_loop_2026-12-01-plan-measurements.jsonl",)),
            ("cpu plan, repeat measurement", "closed_loop_2026-12-01-plan-records.jsonl",
             ("closed_loop_2026-12-01-plan-measurements-repeat.jsonl",)),
            ("cpu engine clock", "closed_loop_2026-12-01-engine-clock-records.jsonl",
             ("closed_loop_2026-12-01-plan-measurements.jsonl",)))


def _rows(points: list[tuple[str, float, float, float, float, str]]) -> dict:
    """(method, measured, predicted, low, high, decision) -> summary over all points and per method. ``decisive``:
    answers go or no-go (not "calibrate": the interval straddles the 1.05× threshold); ``wrong``: go where the
    measurement lost, or no-go where it gained more than 5 %."""
    def summary(ps):
        err = sorted(abs(p / m - 1) for _, m, p, _, _, _ in ps)
        return {"n": len(ps), "median_abs_error": err[len(err) // 2],  # gpu_closed_loop.summarise's median
                "sign_right": sum((p > 1) == (m > 1) for _, m, p, _, _, _ in ps),
                "coverage": sum(lo <= m <= hi for _, m, _, lo, hi, _ in ps) / len(ps),
                "median_rel_width": statistics.median((hi - lo) / p for _, _, p, lo, hi, _ in ps),
                "decisive": sum(d in ("go", "no-go") for *_, d in ps),
                "wrong": sum((d == "go" and m < 1) or (d == "no-go" and m > GO) for _, m, _, _, _, d in ps)}
    out = {"all": summary(points)}
    for method in sorted({p[0] for p in points}):
        out[method] = summary([p for p in points if p[0] == method])
    return out


def _spread(params: dict, residuals: list[float], points: list[fit.StepPoint]) -> dict:
    """The step-time fit's spread: the repeats' pooled σ (steps; model drafters' cycles), its rms residual, and
    the σ the interval samples."""
    steps, cycles = fit.repeat_spreads(points)
    return {"steps_sigma": steps, "cycles_sigma": cycles,
            "cycles_semi": fit.repeat_semi_log_stds([p for p in points if p.drafter_forwards]),
            "rms_residual": float(np.sqrt(np.mean(np.square(residuals)))),
            "timing_rms_rel": params["timing_rms_rel"],
            "proposer_overhead_log_std": params["proposer_overhead_log_std"],
            "proposer_overhead_log_std_low": params.get("proposer_overhead_log_std_low")}


def gpu_case(meas: str, calib: str) -> dict:
    records = gcl.calibration_records(DATA / calib)
    points, results = gcl.predict_measurements(DATA / meas, records)
    step = results[f"step_time:{gcl.TARGET}"]
    _, target, draft = gcl.catalog_specs()
    path, models = gcl.fit_models(records, draft)
    return {"name": meas if meas == calib else f"{meas} ← {calib}",
            "fit": _spread(step.params.to_dict(), step.residuals, fit.step_points(records, target, path, models)),
            "closed_loop": _rows([(p.method, p.measured, p.predicted, p.low, p.high, p.extra["decision"])
                                  for p in points])}


def cpu_case(name: str, records_file: str, measurement_files: tuple[str, ...]) -> dict:
    records = gcl.load_jsonl(DATA / records_file)
    measurements = cl.pool_measurements([m for f in measurement_files for m in gcl.load_jsonl(DATA / f)])
    results, fits = cl.compare(cl.workloads(), measurements, records)
    step = next(f for f in fits if f["kind"] == "step_time")
    _, target = cl.load_catalog()
    models = cl.truncated_models(records, target)
    path = next(p for p in fit.model_paths(records) if p not in models)  # as fit_run picks the target's records
    return {"name": name,
            "fit": _spread(step["params"], step["residuals"], fit.step_points(records, target, path, models)),
            "closed_loop": _rows([(r.method, r.measured_speedup, r.predicted_speedup, r.predicted_low,
                                   r.predicted_high, r.decision) for r in results])}


VARIANTS = ("before", "symmetric", "split")


def run_all() -> list[dict]:
    cases = [(gpu_case, pair) for pair in GPU_PAIRS] + [(cpu_case, run) for run in CPU_RUNS]
    out = []
    for fn, args in cases:
        with mock.patch.object(fit, "repeat_spread_floors", lambda *a, **k: {}):
            before = fn(*args)
        symmetric = fn(*args)
        with mock.patch.object(fit, "repeat_spread_floors", functools.partial(fit.repeat_spread_floors, split=True)):
            split = fn(*args)
        out.append({"name": split["name"], "before": before, "symmetric": symmetric, "split": split})
    return out


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _sigma(f: dict) -> str:
    """The proposer's σ ln: one number when symmetric, below/above when two-piece."""
    low, high = f["proposer_overhead_log_std_low"], f["proposer_overhead_log_std"]
    return f"{high:.2f}" if low is None or low == high else f"{low:.2f}/{high:.2f}"


def format_table(rows: list[dict]) -> str:
    """One row per closed loop; where a figure moves, before → symmetric → split."""
    lines = ["| closed loop (measurements ← calibration) | repeat σ steps / model cycles (below, above median) | "
             "timing_rms_rel | proposer σ ln (low/high) | median \\|error\\| | sign | coverage | median rel. width | "
             "go/no-go answers (wrong) | draft model: coverage; width |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        fits = [r[v]["fit"] for v in VARIANTS]
        loops = [r[v]["closed_loop"] for v in VARIANTS]

        def chain(key, of=loops) -> str:
            return " → ".join(key(x) for x in of)

        semi = fits[-1]["cycles_semi"]
        everything = loops[-1]["all"]
        dm = (f"{chain(lambda c: _fmt(c['draft_model']['coverage']))}; "
              f"{chain(lambda c: _fmt(c['draft_model']['median_rel_width']))}") if "draft_model" in loops[0] else "-"
        lines.append(
            f"| {r['name']} | {_fmt(fits[-1]['steps_sigma'])} / {_fmt(fits[-1]['cycles_sigma'])} "
            f"({'-' if semi is None else _fmt(semi[0]) + ', ' + _fmt(semi[1])}) | "
            f"{_fmt(fits[0]['timing_rms_rel'])} → {_fmt(fits[-1]['timing_rms_rel'])} | {chain(_sigma, fits)} | "
            f"{_fmt(everything['median_abs_error'])} | {everything['sign_right']} / {everything['n']} | "
            f"{chain(lambda c: _fmt(c['all']['coverage']))} | {chain(lambda c: _fmt(c['all']['median_rel_width']))} | "
            f"{chain(lambda c: '{decisive} ({wrong})'.format(**c['all']))} | {dm} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None, help="write the full comparison as JSON here")
    args = parser.parse_args(argv)
    rows = run_all()
    print(format_table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
