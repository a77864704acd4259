"""Steady state on the GPU: a server at concurrency B against ``predict``'s answer for ``concurrency: B``.

The closed loop (``benchmarks/gpu_closed_loop.py``) times batches of B requests that start together. A speculative
batch drains: its sequences accept unevenly and finish apart, so it runs more engine steps than its mean sequence
needs (12-30 % at B = 4-256, every method; the stored loops' ``engine_steps``). A server whose clients send their
next request as the last one returns does not drain, but its sequences desynchronise, new prompts ride in the others'
decode steps, and each finished slot waits a step or two for its next request. This is what an answer's
``concurrency`` describes, and what this benchmark measures.

``measure`` (on the GPU)  -- ``gpu_closed_loop measure --steady``: per engine and synthetic acceptance, at each B,
                            B requests in flight, each replaced at once when it finishes (``steady_state``), 4B + 4
                            requests in all; then one batch of B that starts together, on the same engine.
``analyze`` (anywhere)    -- per (engine, B): the throughput (B / the mean request time, of the requests sent after
                            the first B and before the last B: the start together and the drain left out), their
                            decode time per token, and the batch's wall time; their ratios to the baseline's
                            against ``predict``'s speedup and decode speedup (the shipped engine profile of the
                            run's GPU × vLLM 0.24, or ``--calibration RUN``'s fit).

Usage on the device: ``STEADY=1 scripts/gpu-closed-loop.sh measure``; here:
``python -m benchmarks.gpu_steady_state --workdir benchmarks/data/h100-vllm0.24-steady``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


@dataclass(frozen=True)
class SteadyReading:
    """One steady-state run's measures (``gpu_closed_loop.steady_state``) and its batch that started together."""

    throughput_tok_s: float  # output tokens per second at B in flight (Little's law over the steady window)
    decode_s_per_token: float  # mean over the requests finished there: engine-clock decode span / (tokens - 1)
    batch_wall_s: float
    draft_fraction: float | None  # share of sequence-steps that drafted (vLLM's counters over the steady run)
    realised_al: float | None


def steady_window(requests: list[dict], batch: int) -> list[dict]:
    """The requests sent after the first B (which started together) and before the last B (sent while the run's
    end drained it): each ran with B requests in flight from its send to its finish."""
    n = len(requests)
    return [r for r in requests if r["index"] is not None and batch <= r["index"] < n - batch]


def read_steady(row: dict) -> SteadyReading:
    """A steady run's throughput by Little's law (B requests always in flight: B · O / the mean request's time from
    its send to its finish), its decode time per token, and the batch's wall time."""
    from benchmarks import gpu_closed_loop as gcl

    b, run = row["batch_size"], row["steady"]
    inside = steady_window(run["requests"], b)
    if not inside:
        raise ValueError(f"{row['engine']} B={b}: {len(run['requests'])} requests leave no steady window")
    latency_s = statistics.fmean(r["done_s"] - r["sent_s"] for r in inside)
    tokens = statistics.fmean(r["output_tokens"] for r in inside)
    per_token = [r["decode_span_s"] / (r["output_tokens"] - 1) for r in inside
                 if r.get("decode_span_s") is not None and r["output_tokens"] > 1]
    done, drafts, accepted = run["requests"], run["num_drafts"], run["num_accepted_tokens"]
    frac = gcl.drafted_share(drafts, accepted, sum(r["output_tokens"] for r in done), len(done)) if drafts else None
    al = gcl.realised_al(drafts, accepted)
    return SteadyReading(b * tokens / latency_s, statistics.fmean(per_token) if per_token else float("nan"),
                         row["batch"]["wall_s"], frac, al)


def load_rows(workdir: Path) -> list[dict]:
    """The steady rows (``steady.jsonl``, or gzipped as stored); an (engine, B) measured again keeps its last."""
    from benchmarks import gpu_closed_loop as gcl

    return gcl.measurement_rows(workdir, "steady.jsonl")


@dataclass
class SteadyPoint:
    engine: str
    method: str
    k: int
    acceptance: float
    batch_size: int
    measured: float  # steady throughput, speculative / baseline
    measured_decode: float  # steady decode time per token, baseline / speculative
    measured_batch: float  # one batch that starts together: baseline wall / speculative wall
    predicted: float  # predict's speedup at concurrency B
    low: float
    high: float
    predicted_decode: float
    decision: str
    draft_fraction: float | None
    realised_al: float | None

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1.0

    @property
    def decode_error(self) -> float:
        return self.predicted_decode / self.measured_decode - 1.0

    @property
    def batch_error(self) -> float:
        return self.predicted / self.measured_batch - 1.0


def predict_steady(workdir: Path, calibration_dir: Path | None = None) -> list[SteadyPoint]:
    """Each measured (engine, B) against ``predict`` at concurrency B: by the shipped profile of the run's GPU, or
    by ``calibration_dir``'s fit (``gpu_closed_loop.build_gpu_calibration``), as the closed loop's analyze prices."""
    from advisor.costmodel import predict
    from benchmarks import gpu_closed_loop as gcl

    rows = load_rows(workdir)
    gpu_name = gcl.catalog_gpu(rows[0].get("gpu_name"))
    target_name, drafter = gcl.measured_models(rows, [])
    gpu, target, draft = gcl.catalog_specs(drafter, gpu_name, target_name)
    profile, cal = None, None
    if calibration_dir is not None:
        records = gcl.calibration_records(calibration_dir)
        cal, _ = gcl.build_gpu_calibration(records, *gcl.catalog_specs(gcl.run_drafter(records), gpu_name))
    else:
        profile = gcl.shipped_profile(gpu=gpu_name)
    base = {r["batch_size"]: read_steady(r) for r in rows if r["engine"] == "baseline"}
    points = []
    for r in rows:
        if r["engine"] == "baseline" or r["batch_size"] not in base:
            continue
        got, ref = read_steady(r), base[r["batch_size"]]
        copy = r["method"] == "ngram"
        scen = gcl.point_scenario(r, gpu.name, target.name, draft.name, r.get("tensor_parallel_size") or 1,
                                  got.draft_fraction)
        ans = predict(scen, gpu, target, None if copy else draft, cal, compare_methods=False,
                      profile=profile).to_dict()
        sp = ans["speedup"]
        points.append(SteadyPoint(r["engine"], r["method"], r["k"], r["acceptance"], r["batch_size"],
                                  got.throughput_tok_s / ref.throughput_tok_s,
                                  ref.decode_s_per_token / got.decode_s_per_token, ref.batch_wall_s / got.batch_wall_s,
                                  sp["expected"], sp["low"], sp["high"], sp["decode"], ans["decision"],
                                  got.draft_fraction, got.realised_al))
    return points


def summarise(points: list[SteadyPoint]) -> dict:
    def med(xs: list[float]) -> float:
        return round(100 * statistics.median(abs(x) for x in xs), 1) if xs else float("nan")

    wrong = sum(1 for p in points
                if (p.decision == "go" and p.measured < 1) or (p.decision == "no-go" and p.measured > 1))
    by_method = {m: med([p.error for p in points if p.method == m]) for m in sorted({p.method for p in points})}
    return {"points": len(points), "median_abs_error_pct": med([p.error for p in points]),
            "median_abs_error_pct_by_method": by_method,
            "signed_median_error_pct": round(100 * statistics.median(p.error for p in points), 1),
            "decode_median_abs_error_pct": med([p.decode_error for p in points]),
            "batch_median_abs_error_pct": med([p.batch_error for p in points]),
            "signs_right": sum(1 for p in points if (p.predicted > 1) == (p.measured > 1)),
            "intervals_cover": sum(1 for p in points if p.low <= p.measured <= p.high),
            "verdicts": {d: sum(1 for p in points if p.decision == d) for d in ("go", "no-go", "calibrate")},
            "wrong_verdicts": wrong}


def format_table(points: list[SteadyPoint]) -> str:
    lines = ["| engine | B | steady: measured / predicted | decode: measured / predicted | batch together: measured "
             "(predicted's error) | verdict |", "|---|--:|--:|--:|--:|---|"]
    for p in sorted(points, key=lambda p: (p.engine, p.batch_size)):
        lines.append(f"| {p.engine} | {p.batch_size} | {p.measured:.2f}× / {p.predicted:.2f}× ({100 * p.error:+.0f} %)"
                     f" | {p.measured_decode:.2f}× / {p.predicted_decode:.2f}× ({100 * p.decode_error:+.0f} %) | "
                     f"{p.measured_batch:.2f}× ({100 * p.batch_error:+.0f} %) | {p.decision} |")
    return "\n".join(lines)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", type=Path, required=True, help="a run's folder with steady.jsonl")
    parser.add_argument("--calibration", type=Path, default=None,
                        help="price by this closed-loop run's calibration instead of the shipped profile")
    parser.add_argument("--out-json", type=Path, default=None)


def main(args: argparse.Namespace) -> int:
    points = predict_steady(args.workdir, args.calibration)
    summary = summarise(points)
    print(format_table(points))
    print(json.dumps(summary, indent=1))
    if args.out_json:
        args.out_json.write_text(json.dumps({"summary": summary, "points": [asdict(p) | {
            "error": p.error, "decode_error": p.decode_error, "batch_error": p.batch_error} for p in points]},
            indent=1) + "\n")
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_cli_args(p)
    raise SystemExit(main(p.parse_args()))
