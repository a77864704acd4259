"""The thirteen calibrations of the GPU plan as it ships, each predicting its own lease (issue 8): where one
calibration misses, and four changes tried on the stored records. Analysis of stored records only, no timing.

Each calibration (runs 10 and 13-17, their second and third calibrations included) is fitted with the product's
fit (``calibration.fit.fit_run`` through ``gpu_closed_loop.predict_measurements``) and predicts its lease's 36
measured speedups (pooled with the lease's later measurement where there is one, as docs/gpu-closed-loop.md
counts them). Five versions:

- ``as-shipped``: the calibration's own records, as ``advisor calibrate`` fits them.
- ``pooled-across-leases``: its records pooled with the other leases' calibrations (``calibration.fit.pool_runs``),
  as if a calibration refined the shared profile rather than replacing it.
- ``off-graph-left-out``: the verify engine's steps at widths vLLM 0.24 does not replay as a full CUDA graph (a
  speculative step without drafts, q = 1, and q < k + 1) left out of the records. That engine runs them piecewise
  (9.7-10.9 ms at B = 1, against 7.3 ms at its full width), and the uniform fit bends its verify overhead to meet
  them, which a full-width cycle does not pay.
- ``off-graph-left-out+start-spread``: as above, and the proposer overhead's σ in the interval at least the spread
  of that overhead between the thirteen fits (``start_spread``: a host-bound draft model changes speed between
  engine starts, which one calibration's repeats cannot see).
- ``off-graph-left-out+implied-spread``: the same, with the floor at how far a calibration's proposer overhead lands
  from what its lease's measurement ran (``implied_proposer_spread``).

Per version: the mean and median over the calibrations of the median |error|, how many are ≤ 10 %, the n-gram and
draft-model medians, signs right and intervals covering over all points, and the median signed n-gram error per
(acceptance, batch size). Then the fit as it ships and the two floored versions on every bf16 lease of the
tally's day (``FOURTEEN_LEASES``, one measurement each), from each lease's own first calibration and from the
engine profile (the changed fit's profile refitted in memory from the same five calibrations).

    python -m benchmarks.calibration_tally [--json OUT]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable
from unittest import mock

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import gpu_closed_loop as gcl  # noqa: E402

DATA = REPO_ROOT / "benchmarks" / "data"
# lease -> its calibrations of the plan as it ships (runs 10, 13-17: docs/gpu-closed-loop.md)
LEASES = {"run10": ("run10", "run10-second", "run10-third"), "run13": ("run13", "run13-second"),
          "run14": ("run14", "run14-second"), "run15": ("run15", "run15-second"),
          "run16": ("run16", "run16-second"), "run17": ("run17", "run17-second")}
# the bf16 leases this tally was taken over (benchmarks/data/calibration-tally-2026-12-05.json): runs 1-17
FOURTEEN_LEASES = tuple(name for name in gcl.BF16_LEASES if name != "h200-vllm0.24-run18")
VARIANTS = ("as-shipped", "pooled-across-leases", "off-graph-left-out", "off-graph-left-out+start-spread",
            "off-graph-left-out+implied-spread")


def run_dir(name: str) -> Path:
    return DATA / f"h200-vllm0.24-{name}"


def off_graph_left_out(records: list[dict]) -> list[dict]:
    """``records`` without the verify engine's plain steps at widths other than k + 1 on a graph engine (vLLM 0.24
    replays the full CUDA graph only at that width; the others run piecewise)."""
    def off_graph(r: dict) -> bool:
        engine = r["params"]["engine"]
        spec = engine.get("speculative_config") or {}
        v = r["values"]
        return (r["probe"] == "step_time" and spec.get("method") == "custom_class" and not engine.get("enforce_eager")
                and v.get("kind", "step") == "step" and int(v.get("q", 1)) != int(spec["num_speculative_tokens"]) + 1)
    return [r for r in records if not off_graph(r)]


def with_proposer_floor(sigma: float) -> Callable[[Any], Any]:
    """A calibration with every fitted proposer overhead's σ at least ``sigma``."""
    def adjust(cal: Any) -> Any:
        steps = {name: dataclasses.replace(p, proposer_overhead_log_std=max(p.proposer_overhead_log_std, sigma))
                 if p.proposer_overhead_log_std else p for name, p in cal.step_time.items()}
        return dataclasses.replace(cal, step_time=steps)
    return adjust


def lease_points(lease: str, records: list[dict], adjust: Callable[[Any], Any] | None = None) -> list[Any]:
    """The lease's measured points predicted from the calibration ``records``, each measured speedup pooled with the
    lease's later measurement where there is one (``gcl.pool_measurements``)."""
    points, _ = gcl.predict_measurements(run_dir(lease), records, adjust=adjust)
    later = run_dir(f"{lease}-remeasure")
    return gcl.pool_measurements(points, [gcl.measured_speedups(later)]) if later.exists() else points


def start_spread() -> float:
    """σ of ln(the fitted proposer overhead) over the thirteen calibrations, off-graph steps left out."""
    logs = []
    for cals in LEASES.values():
        for cal in cals:
            records = off_graph_left_out(gcl.calibration_records(run_dir(cal)))
            gpu, target, draft = gcl.catalog_specs(gcl.run_drafter(records))
            fitted, _ = gcl.build_gpu_calibration(records, gpu, target, draft)
            logs.append(math.log(fitted.step_time[target.name].proposer_overhead_s))
    return statistics.stdev(logs)


def implied_proposer_spread() -> float:
    """How far a calibration's draft-model proposer overhead lands from what its lease's measurement ran, in log
    (RMS over the thirteen calibrations' draft-model points, off-graph steps left out): each point's
    ln(predicted / measured speedup) over the drafter's share of the cycle (the answer's ``step_ms``), as
    ``calibration.fit.repeat_spread_floors`` scales a cycle's spread to its proposer's (delta method)."""
    import advisor.costmodel as costmodel

    logs = []
    for lease, cals in LEASES.items():
        for cal in cals:
            shares: list[float] = []
            predict = costmodel.predict

            def sharing(*args: Any, **kwargs: Any) -> Any:
                answer = predict(*args, **kwargs)
                step = answer.to_dict()["step_ms"]
                shares.append(step["draft"] / step["cycle"])
                return answer

            with mock.patch.object(costmodel, "predict", sharing):  # predict_measurements: one answer per point
                points = lease_points(lease, off_graph_left_out(gcl.calibration_records(run_dir(cal))))
            logs += [math.log(p.predicted / p.measured) / share for p, share in zip(points, shares, strict=True)
                     if p.method != "ngram"]
    return math.sqrt(statistics.fmean(x * x for x in logs))


def fit_version(variant: str, spread: float) -> tuple[Callable[[list[dict]], list[dict]], Callable[[Any], Any] | None]:
    """(records -> the records the variant fits, calibration -> the one it predicts from)."""
    keep = off_graph_left_out if variant.startswith("off-graph-left-out") else (lambda records: records)
    return keep, with_proposer_floor(spread) if variant.endswith("-spread") else None


def profile_for(variant: str, spread: float) -> Any:
    """The shipped profile, or the profile the variant's fit makes of the same five calibrations (in memory)."""
    from advisor.costmodel.types import MeasuredEngineProfile

    if variant == "as-shipped":
        return gcl.shipped_profile()
    keep, adjust = fit_version(variant, spread)
    records = keep(gcl.pooled_records([REPO_ROOT / p for p in gcl.PROFILE_POOL],
                                      gcl.load_jsonl(REPO_ROOT / gcl.PROFILE_LONG_CONTEXT)))
    gpu, target, draft = gcl.catalog_specs(gcl.run_drafter(records))
    cal, _ = gcl.build_gpu_calibration(records, gpu, target, draft)
    cal = adjust(cal) if adjust else cal
    item = next(p for p in json.loads(gcl.PROFILES_FILE.read_text())["items"] if p["name"] == "H200-SXM × vLLM 0.24")
    drafters = {**item["drafters"], draft.name: cal.step_time[draft.name].to_dict()}
    return MeasuredEngineProfile.from_dict({**item, "step_time": cal.step_time[target.name].to_dict(),
                                            "prefill": cal.prefill[target.name].to_dict(), "drafters": drafters})


@dataclass
class LeaseTally:
    """Every bf16 lease's closed loop (one measurement each) from its own first calibration or from the profile."""
    variant: str
    source: str  # "own" | "profile"
    medians: dict[str, float]
    mean: float
    median: float
    signs_right: int
    covered: int
    points: int


def fourteen_leases(variant: str, source: str, spread: float) -> LeaseTally:
    keep, adjust = fit_version(variant, spread)
    profile = profile_for(variant, spread) if source == "profile" else None
    medians, signs, covered, n = {}, 0, 0, 0
    for name in FOURTEEN_LEASES:
        lease = DATA / name
        points, _ = gcl.predict_measurements(lease, keep(gcl.calibration_records(lease)), profile,
                                             adjust=None if profile else adjust)
        summary = gcl.summarise(points)
        medians[lease.name] = summary["median_abs_error"]
        signs += summary["sign_right"]
        covered += sum(p.low <= p.measured <= p.high for p in points)
        n += len(points)
    return LeaseTally(variant, source, medians, statistics.fmean(medians.values()), statistics.median(medians.values()),
                      signs, covered, n)


@dataclass
class Tally:
    variant: str
    calibrations: dict[str, dict[str, float]]  # name -> median, ngram, draft_model (and signed), coverage
    mean_median: float
    median_median: float
    within_10_percent: int
    ngram_mean: float
    draft_model_mean: float
    signs_right: int
    covered: int
    points: int
    min_coverage: float
    ngram_bias: dict[str, float] = field(default_factory=dict)  # "acceptance/B" -> median signed error


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]  # as gcl.summarise counts it


def tally(variant: str, spread: float) -> Tally:
    per: dict[str, dict[str, float]] = {}
    signs = covered = n = 0
    bias: dict[tuple[float, int], list[float]] = {}
    keep, adjust = fit_version(variant, spread)
    for lease, cals in LEASES.items():
        others = [run_dir(c) for other, cs in LEASES.items() if other != lease for c in cs]
        for cal in cals:
            if variant == "pooled-across-leases":
                records = gcl.pooled_records([run_dir(cal), *others])
            else:
                records = keep(gcl.calibration_records(run_dir(cal)))
            points = lease_points(lease, records, adjust)
            summary = gcl.summarise(points)
            per[cal] = {"median": summary["median_abs_error"],
                        "ngram": _median([abs(p.error) for p in points if p.method == "ngram"]),
                        "draft_model": _median([abs(p.error) for p in points if p.method != "ngram"]),
                        "draft_model_signed": statistics.median(p.error for p in points if p.method != "ngram"),
                        "coverage": summary["interval_coverage"]}
            signs += summary["sign_right"]
            covered += sum(p.low <= p.measured <= p.high for p in points)
            n += len(points)
            for p in points:
                if p.method == "ngram":
                    bias.setdefault((p.acceptance, p.batch_size), []).append(p.error)
    medians = [c["median"] for c in per.values()]
    return Tally(variant, per, statistics.fmean(medians), statistics.median(medians), sum(m <= 0.10 for m in medians),
                 statistics.fmean(c["ngram"] for c in per.values()),
                 statistics.fmean(c["draft_model"] for c in per.values()), signs, covered, n,
                 min(c["coverage"] for c in per.values()),
                 {f"{a:g}/{b}": statistics.median(e) for (a, b), e in sorted(bias.items())})


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    parser.add_argument("--spread", type=float, help="the proposer σ floor of the start-spread versions "
                        "(default: start_spread(), the spread between the thirteen fits; the implied-spread "
                        "versions take implied_proposer_spread())")
    parser.add_argument("--json", type=Path, help="also write the tallies here")


def main(args: argparse.Namespace) -> int:
    measured, implied = start_spread(), implied_proposer_spread()
    print(f"start spread: sigma of ln(proposer overhead) over {sum(map(len, LEASES.values()))} fits = {measured:.3f}; "
          f"calibration to measurement: {implied:.3f}")
    spread = measured if args.spread is None else args.spread

    def floor(variant: str) -> float:
        return implied if variant.endswith("implied-spread") else spread

    tallies = [tally(v.strip(), floor(v.strip())) for v in args.variants.split(",") if v.strip()]
    print(f"\n{'version':34s} {'mean':>6s} {'median':>6s} {'<=10%':>5s} {'n-gram':>6s} {'draft':>6s} "
          f"{'signs':>9s} {'covers':>9s} {'min cov':>7s}")
    for t in tallies:
        print(f"{t.variant:34s} {t.mean_median:6.1%} {t.median_median:6.1%} {t.within_10_percent:5d} "
              f"{t.ngram_mean:6.1%} {t.draft_model_mean:6.1%} {t.signs_right:4d}/{t.points} {t.covered:4d}/{t.points} "
              f"{t.min_coverage:7.0%}")
    for t in tallies:
        print(f"\n{t.variant}: n-gram signed error by acceptance/B: "
              + " ".join(f"{k} {v:+.3f}" for k, v in t.ngram_bias.items()))
    leases = [fourteen_leases(v, source, floor(v)) for v in ("as-shipped", "off-graph-left-out+start-spread",
                                                             "off-graph-left-out+implied-spread")
              for source in ("own", "profile")]
    print(f"\nevery bf16 lease of 2026-12-05 ({len(FOURTEEN_LEASES)}), one measurement each:")
    for t in leases:
        print(f"{t.variant:34s} {t.source:8s} mean {t.mean:6.1%} median {t.median:6.1%} "
              f"signs {t.signs_right}/{t.points} covers {t.covered}/{t.points}")
    if args.json:
        args.json.write_text(json.dumps({"start_spread": spread, "implied_spread": implied,
                                         "tallies": [dataclasses.asdict(t) for t in tallies],
                                         "leases": [dataclasses.asdict(t) for t in leases]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cli_args(parser)
    sys.exit(main(parser.parse_args()))
