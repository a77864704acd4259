"""Validation benchmark: predict every published case and compare (issue 3).

Each row (a batch point, a k, a method or a load of a case) is predicted by ``advisor.costmodel.predict``
from the catalog, the case's stated inputs and the documented conventions below — no per-case constants.
The cases are the project's data (``advisor/data/published_cases.json``, each with its source). A case marked
``sets_default`` is one an engine default was set from: its rows are in-sample; the others are out-of-sample.
Exit code 0 when the median |speedup error| is ≤ 10 % in-sample and out-of-sample, the sign of the gain (speedup
above/below 1) is right in every row and the 5–95 % interval covers ≥ 85 % of the measurements; 1 otherwise,
2 on unreadable input.

Conventions (stated once, applied to every case):
- dataset → workload shape (structure, prompt and output tokens): DATASETS below;
- unreported temperature → 0.0 (greedy; what the cited benchmarks use by default);
- "QPS 1" → requests_per_second = 1 (concurrency by Little's law); "high QPS" → arrival rate above capacity,
  i.e. the server saturated at min(max_num_seqs, KV capacity);
- engine "SGLang" / "Spec-Bench (HF)" → the per-engine overhead defaults in costmodel.steptime.ENGINE_PROFILES;
- k not stated → the k the advisor picks at the case's first (lowest-load) point, held fixed across the case;
  with a stated AL but no k (tree methods in Spec-Bench) → the method's reference depth REFERENCE_K;
- "alpha~x" in an acceptance note is a stated i.i.d. per-token acceptance α: the AL it gives at the row's k,
  (1 − α^(k+1)) / (1 − α) (Leviathan et al. 2023), is the input;
- an AL the case says was "derived" (from another run's α, not measured in that run) is not an input: the
  method's prior, which holds that same measurement with its width, is used;
- "al_counts": "all steps" (Spec-Bench's mean accepted tokens per decoding step) → ``draft_fraction`` 1.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # allow `python benchmarks/validate.py` from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from advisor import costmodel as cm  # noqa: E402

DATA_DIR = REPO_ROOT / "advisor" / "data"
DEFAULT_CASES = DATA_DIR / "published_cases.json"
MEDIAN_ERROR_TARGET = 0.10
COVERAGE_TARGET = 0.85  # share of measurements inside the 5-95 % interval
CLOSED_LOOP_RUN = REPO_ROOT / "benchmarks" / "data" / "closed_loop_2026-11-30.json"

# dataset → (structure, prompt_tokens, output_tokens); lengths are the datasets' typical means.
DATASETS: dict[str, tuple[str, int, int]] = {
    "structured generation (JSON-like)": ("json", 256, 256),
    "MT-bench": ("prose", 128, 512),  # short questions, long answers (EAGLE evaluation: max 1024 new tokens)
    "ShareGPT": ("prose", 256, 256),  # vLLM benchmark_serving ShareGPT means ~220 in / ~200 out
    "CNN/DailyMail summarization": ("rag", 1024, 128),  # ~780-word articles, 3-4 sentence summaries
    "Spec-Bench overall": ("prose", 256, 512),
}
ENGINES = {"vLLM": "vllm", "SGLang": "sglang", "Spec-Bench (HF)": "hf"}
SATURATING_RPS = 1e6  # "high QPS": far above any capacity → saturated server
# Tree / multi-head methods evaluated with a stated AL but no k: the drafting depth of their reference setup.
REFERENCE_K = {"eagle": 5, "medusa": 4, "ngram": 8, "draft_model": 5}  # EAGLE tree depth 5; Medusa 4 levels;
# prompt lookup num_pred_tokens 10 (clipped to 8); HF assisted generation num_assistant_tokens=5
# Their reference trees: Medusa and EAGLE-1 on vicuna-7b verify the 63-node "mc_sim_7b_63" tree + root per step.
REFERENCE_TREE_TOKENS = {"eagle": 64, "medusa": 64}
METHOD_ALIASES = {"ngram (prompt lookup)": "ngram", "medusa": "medusa", "eagle": "eagle", "eagle3": "eagle3",
                  "draft_model": "draft_model", "ngram": "ngram", "suffix": "suffix", "mtp": "mtp"}


@dataclass
class Row:
    case_id: str
    label: str
    engine: str
    gpu: str
    measured: float
    predicted: float = float("nan")
    low: float = float("nan")
    high: float = float("nan")
    k: int | None = None
    al: float = float("nan")
    note: str = ""
    in_sample: bool = False

    @property
    def covered(self) -> bool:
        return self.low <= self.measured <= self.high

    @property
    def error(self) -> float:
        return (self.predicted - self.measured) / self.measured

    @property
    def sign_ok(self) -> bool:
        return (self.predicted > 1.0) == (self.measured > 1.0)


def load_catalog(data_dir: Path) -> tuple[dict[str, cm.GpuSpec], dict[str, cm.ModelSpec]]:
    gpus = json.loads((data_dir / "gpus.json").read_text(encoding="utf-8"))["items"]
    models = json.loads((data_dir / "models.json").read_text(encoding="utf-8"))["items"]
    return ({g["name"]: cm.GpuSpec.from_dict(g) for g in gpus}, {m["name"]: cm.ModelSpec.from_dict(m) for m in models})


def _alpha_from_note(note: str | None) -> float | None:
    match = re.search(r"alpha\s*~\s*([0-9.]+)", note or "")
    return float(match.group(1)) if match else None


def _load_to_rps(load: str) -> float:
    match = re.search(r"QPS\s*([0-9.]+)", load)
    if match:
        return float(match.group(1))
    if "high" in load.lower():
        return SATURATING_RPS
    raise ValueError(f"unknown load '{load}'")


def _method_and_draft(spec: str, default_draft: str | None) -> tuple[str, str | None]:
    head, _, rest = spec.partition(" ")
    method = METHOD_ALIASES.get(spec) or METHOD_ALIASES.get(head, head)
    draft = rest.strip() if method == "draft_model" and rest.strip() else default_draft
    return method, draft


def _points(case: dict[str, Any]) -> list[dict[str, Any]]:
    """Expand one case into its rows: batch points, k values, methods or loads."""
    base = {"method": case.get("method"), "draft": case.get("draft"), "k": case.get("k"),
            "al": case.get("mean_acceptance_length"), "alpha": _alpha_from_note(case.get("acceptance_note"))}
    rows = []
    if "methods" in case:
        for m in case["methods"]:
            method, draft = _method_and_draft(m["method"], m.get("draft"))
            rows.append({**base, "method": method, "draft": draft, "al": m.get("mean_acceptance_length"),
                         "alpha": None, "tree": REFERENCE_TREE_TOKENS.get(method), "batch": case.get("batch", [1])[0], "measured": m["speedup"],
                         "label": m["method"]})
    elif "load" in case:
        for load, sp in zip(case["load"], case["speedup"]):
            rows.append({**base, "rps": _load_to_rps(load), "measured": sp, "label": load})
    elif isinstance(case.get("k"), list):
        for k, sp in zip(case["k"], case["speedup"]):
            rows.append({**base, "k": k, "batch": case["batch"][0], "measured": sp, "label": f"k={k}"})
    else:
        for b, sp in zip(case["batch"], case["speedup"]):
            rows.append({**base, "batch": b, "measured": sp, "label": f"B={b}"})
    return rows


def scenario_for(case: dict[str, Any], point: dict[str, Any], k: int | None) -> cm.Scenario:
    structure, prompt, output = DATASETS[case["dataset"]]
    temperature = case.get("temperature")
    acceptance = None
    if point.get("al") is not None and "derived" in (case.get("acceptance_note") or ""):
        acceptance = None  # not measured in this run but derived from another's α: that measurement is the prior's
    elif point.get("al") is not None:  # Spec-Bench's "mean accepted tokens" counts every step (τ): drafting fraction 1
        acceptance = cm.AcceptanceInput(mean_acceptance_length=float(point["al"]),
                                        draft_fraction=1.0 if case.get("al_counts") == "all steps" else None)
    elif point.get("alpha") is not None and k is not None:
        acceptance = cm.AcceptanceInput(mean_acceptance_length=cm.expected_tokens_iid(float(point["alpha"]), k))
    workload = cm.Workload(prompt_tokens=prompt, output_tokens=output,
                           temperature=0.0 if temperature is None else float(temperature), structure=structure,
                           concurrency=point.get("batch"), requests_per_second=point.get("rps"))
    return cm.Scenario(gpu=case["gpu"], target_model=case["target"],
                       speculator=cm.Speculator(point["method"], point.get("draft"), k, point.get("tree")),
                       workload=workload, gpu_count=int(case.get("gpu_count", 1)), acceptance=acceptance,
                       engine=ENGINES.get(case.get("engine", "vLLM"), "vllm"))


def predict_case(case: dict[str, Any], gpus: dict[str, cm.GpuSpec],
                 models: dict[str, cm.ModelSpec]) -> tuple[list[Row], list[float]]:
    rows, seconds = [], []
    gpu = gpus[case["gpu"]]
    target = models[case["target"]]
    fixed_k: int | None = None
    for point in _points(case):
        k = point.get("k")
        if k is None and point.get("al") is not None:
            k = REFERENCE_K.get(point["method"])
        k = k if k is not None else fixed_k
        draft = models.get(point["draft"]) if point.get("draft") else None
        scenario = scenario_for(case, point, k)
        started = time.perf_counter()
        answer = cm.predict(scenario, gpu, target, draft).to_dict()
        seconds.append(time.perf_counter() - started)
        if fixed_k is None and k is None:
            fixed_k = answer["num_speculative_tokens"]  # advisor's pick at the first point, then held fixed
        rows.append(Row(case["id"], point["label"], case.get("engine", "vLLM"), case["gpu"], float(point["measured"]),
                        answer["speedup"]["expected"], answer["speedup"]["low"], answer["speedup"]["high"],
                        answer["num_speculative_tokens"], answer["acceptance"]["mean_acceptance_length"],
                        answer["acceptance"]["source"].split(":")[0], bool(case.get("sets_default"))))
    return rows, seconds


TIMING_BATCHES = 40  # timed batches per figure; the figure is their median (a shared, noisy 2-core machine)


def time_single_point(gpus: dict[str, cm.GpuSpec], models: dict[str, cm.ModelSpec], repeats: int) -> dict[str, float]:
    """µs per call: full answer (MC interval + curve + method comparison) and the point estimate alone.

    Median over TIMING_BATCHES batches of ``repeats`` calls each, after a warm-up (catalog-level caches filled).
    """
    scenario = cm.Scenario(gpu="H100-SXM", target_model="llama-3.1-8b-instruct",
                           speculator=cm.Speculator("eagle", "eagle-llama-3.1-8b", 2),
                           workload=cm.Workload(512, 256, 0.0, "prose", concurrency=8),
                           acceptance=cm.AcceptanceInput(mean_acceptance_length=2.04))
    args = (scenario, gpus["H100-SXM"], models["llama-3.1-8b-instruct"], models["eagle-llama-3.1-8b"])
    out = {}
    for label, kwargs in (("full_answer_us", {}), ("no_method_comparison_us", {"compare_methods": False}),
                          ("single_point_us", None)):
        def call() -> None:
            if kwargs is None:
                cm.speedup_point(*args)
            else:
                cm.predict(*args, **kwargs)
        for _ in range(max(repeats // 3, 3)):
            call()
        per_call = []
        for _ in range(TIMING_BATCHES):
            started = time.perf_counter()
            for _ in range(repeats):
                call()
            per_call.append((time.perf_counter() - started) / repeats)
        out[label] = statistics.median(per_call) * 1e6
    out["timing_calls"] = TIMING_BATCHES * repeats
    return out


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cases", default=os.environ.get("SPECADVISOR_VALIDATION_CASES", str(DEFAULT_CASES)),
                        help="published cases (default: the project's advisor/data/published_cases.json, or "
                             "$SPECADVISOR_VALIDATION_CASES)")
    parser.add_argument("--data-dir", default=str(DATA_DIR), help="directory with gpus.json and models.json")
    parser.add_argument("--json", action="store_true", help="print the rows and summary as JSON")
    parser.add_argument("--timing-repeats", type=int, default=30, help="calls per timing measurement")
    parser.add_argument("--max-median-error", type=float, default=MEDIAN_ERROR_TARGET,
                        help="fail above this median |relative speedup error|, in- or out-of-sample (default 0.10)")
    parser.add_argument("--overhead-sweep", metavar="CASE_ID",
                        help="instead: the case's errors with vLLM's per-drafter-forward overhead at "
                             "0.5/1/2/3 ms (how much of a miss a host overhead explains)")
    parser.add_argument("--closed-loop", nargs="?", const=str(CLOSED_LOOP_RUN), metavar="RUN_JSON",
                        help="instead: re-predict a CPU closed-loop run's held-out workloads from its calibration "
                             "records and report interval coverage and median error against what it measured")
    parser.add_argument("--min-coverage", type=float, default=COVERAGE_TARGET,
                        help="fail when the 5-95 %% interval covers fewer measurements (default 0.85)")


def overhead_sweep(case: dict[str, Any], gpus: dict[str, cm.GpuSpec], models: dict[str, cm.ModelSpec],
                   overheads_s: tuple[float, ...] = (5e-4, 1e-3, 2e-3, 3e-3)) -> list[tuple[float, list[Row]]]:
    """The case's rows with the vLLM profile's per-drafter-forward overhead set to each value (restored after)."""
    from dataclasses import replace

    from advisor.costmodel import steptime

    saved = steptime.ENGINE_PROFILES["vllm"]
    out = []
    try:
        for overhead in overheads_s:
            steptime.ENGINE_PROFILES["vllm"] = replace(saved, proposer_overhead_s=overhead)
            steptime.default_step_time_params.cache_clear()
            out.append((overhead, predict_case(case, gpus, models)[0]))
    finally:
        steptime.ENGINE_PROFILES["vllm"] = saved
        steptime.default_step_time_params.cache_clear()
    return out


def closed_loop_coverage(run_path: Path) -> int:
    """A closed-loop run re-predicted with today's cost model (benchmarks.closed_loop's own calibration and
    prediction code) against its measured speedups: coverage of the 5-95 % interval and median |error|."""
    import dataclasses

    from benchmarks import closed_loop

    run = json.loads(run_path.read_text(encoding="utf-8"))
    records = [json.loads(line) for line in (REPO_ROOT / run["records"]).read_text(encoding="utf-8").splitlines()
               if line.strip()]
    gpu, target = closed_loop.load_catalog()
    cal, _ = closed_loop.build_calibration(records, gpu, target)
    errors, covered = [], 0
    for case in closed_loop.workloads():
        w = run["workloads"].get(case.name)
        if w is None:
            continue
        pred = closed_loop.predict_case(dataclasses.replace(case, output_tokens=w["output_tokens"]),
                                        w["prompt_tokens"], gpu, target, cal)
        measured = w["measured_speedup"]
        inside = pred["low"] <= measured <= pred["high"]
        covered += inside
        errors.append(abs(pred["speedup"] / measured - 1))
        print(f"{case.name:<14} predicted {pred['speedup']:.2f} ({pred['low']:.2f}-{pred['high']:.2f})  measured "
              f"{measured:.2f}  {'in' if inside else 'OUT':<3}  {pred['decision']}")
    print(f"closed loop {run_path.name}: interval coverage {covered}/{len(errors)} = "
          f"{covered / len(errors) * 100:.0f} %, median |error| {statistics.median(errors) * 100:.1f} %")
    return 0


def main(args: argparse.Namespace) -> int:
    try:
        cases = json.loads(Path(args.cases).read_text(encoding="utf-8"))["cases"]
        gpus, models = load_catalog(Path(args.data_dir))
    except (OSError, KeyError, json.JSONDecodeError) as exc:
        print(f"validate: cannot read inputs: {exc}", file=sys.stderr)
        return 2
    if args.closed_loop:
        return closed_loop_coverage(Path(args.closed_loop))
    if args.overhead_sweep:
        case = next((c for c in cases if c["id"] == args.overhead_sweep), None)
        if case is None:
            print(f"validate: no case '{args.overhead_sweep}'", file=sys.stderr)
            return 2
        for overhead, rows in overhead_sweep(case, gpus, models):
            print(f"{overhead * 1e3:4.1f} ms per drafter forward: "
                  + "  ".join(f"{r.label} {r.predicted:.2f} ({r.error * 100:+.0f} %)" for r in rows))
        return 0
    rows: list[Row] = []
    seconds: list[float] = []
    for case in cases:
        case_rows, case_seconds = predict_case(case, gpus, models)
        rows += case_rows
        seconds += case_seconds
    s = summarize(rows)
    wrong_signs = [r for r in rows if not r.sign_ok]
    timing = time_single_point(gpus, models, args.timing_repeats)
    timing["validation_mean_us"] = statistics.mean(seconds) * 1e6
    medians = [m for m in (s["median_abs_error_in_sample"], s["median_abs_error_out_of_sample"]) if m is not None]
    ok = (all(m <= args.max_median_error for m in medians) and not wrong_signs
          and s["interval_coverage"] >= args.min_coverage)
    if args.json:
        print(json.dumps({"rows": [{**r.__dict__, "error": r.error, "sign_ok": r.sign_ok, "covered": r.covered}
                                   for r in rows], **s, "wrong_signs": len(wrong_signs),
                          "timing_us": timing, "passed": ok}, indent=2))
    else:
        print(render_table(rows))
        print()
        pct = lambda x: "-" if x is None else f"{x * 100:.1f} %"  # noqa: E731
        print(f"rows: {len(rows)}   median |error|: {pct(s['median_abs_error'])}   "
              f"mean |error|: {pct(s['mean_abs_error'])}")
        print(f"in-sample ({s['rows_in_sample']} rows of cases a default was set from): median |error| "
              f"{pct(s['median_abs_error_in_sample'])}   out-of-sample ({s['rows_out_of_sample']} rows): "
              f"median |error| {pct(s['median_abs_error_out_of_sample'])}   (target ≤ "
              f"{args.max_median_error * 100:.0f} % each)")
        print(f"sign of the gain right: {len(rows) - len(wrong_signs)}/{len(rows)}"
              + ("" if not wrong_signs else "  wrong: " + ", ".join(f"{r.case_id} {r.label}" for r in wrong_signs)))
        print(f"interval coverage (5-95 %): {s['covered']}/{len(rows)} = {s['interval_coverage'] * 100:.0f} % "
              f"(target ≥ {args.min_coverage * 100:.0f} %)")
        print(f"time per prediction (median of {TIMING_BATCHES} batches × {args.timing_repeats} calls): full answer "
              f"{timing['full_answer_us']:.0f} µs, without method comparison "
              f"{timing['no_method_comparison_us']:.0f} µs, single point {timing['single_point_us']:.0f} µs "
              f"(validation rows mean {timing['validation_mean_us']:.0f} µs)")
        print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def summarize(rows: list[Row]) -> dict[str, Any]:
    """Median |error| over all rows, in-sample and out-of-sample, and the interval's coverage."""
    def median(sub: list[Row]) -> float | None:
        return statistics.median(abs(r.error) for r in sub) if sub else None

    inside, outside = [r for r in rows if r.in_sample], [r for r in rows if not r.in_sample]
    covered = sum(r.covered for r in rows)
    return {"median_abs_error": median(rows), "mean_abs_error": statistics.mean(abs(r.error) for r in rows),
            "median_abs_error_in_sample": median(inside), "median_abs_error_out_of_sample": median(outside),
            "rows_in_sample": len(inside), "rows_out_of_sample": len(outside), "covered": covered,
            "interval_coverage": covered / len(rows)}


def render_table(rows: list[Row]) -> str:
    head = (f"{'case':<27} {'row':<22} {'engine':<15} {'gpu':<22} {'k':>2} {'AL':>5} {'pred':>6} {'interval':>12} "
            f"{'meas':>5} {'err':>7} sign  in interval  sample")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.case_id:<27} {r.label:<22} {r.engine:<15} {r.gpu:<22} {r.k or '':>2} {r.al:5.2f} "
                     f"{r.predicted:6.2f} {r.low:5.2f}-{r.high:<6.2f} {r.measured:5.2f} {r.error * 100:+6.1f}% "
                     f"{'ok' if r.sign_ok else 'WRONG':<5} {'yes' if r.covered else 'NO':<12} "
                     f"{'in' if r.in_sample else 'out'}")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cli_args(parser)
    sys.exit(main(parser.parse_args()))
