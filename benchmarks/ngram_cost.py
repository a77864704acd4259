"""Where does a served n-gram step's extra time come from? (issue 12, docs/planner.md "What the model still misses")

Four diagnostics, on stored data except ``lookup``:

``cycles``   the calibration's n-gram cycle probes (``records.jsonl`` of each ``--run`` directory) against the
             product's step-time fit (:func:`calibration.fit.fit_step_time` through ``benchmarks.serving``): the
             fit's prediction at the probe's batch, and the probe's own accounting. The probe divides a wall-clock
             difference by the *mean* number of cycles per sequence (``calibration.probes.measure_step_time``), but
             ``llm.generate`` lasts until the slowest sequence: vLLM's iteration counter (``engine_steps``) shows
             how many steps the engine really ran. ``drained`` prices those engine steps at the mean batch still
             running (an upper bracket: the short generation the probe subtracts drains too).
``lookup``   host time of vLLM's n-gram lookup (``vllm.v1.spec_decode.ngram_proposer.batch_propose_numba``) as
             ``NgramProposer.batch_propose`` calls it (one numba thread below 8192 tokens in the batch), over
             batch size and context length, and whether calling it slows torch's next GEMM (numba's OpenMP layer
             and torch share the preloaded OpenMP runtime). It re-executes itself in the servers' environment
             (:func:`calibration.vllm_cpu.env.cpu_engine_env`: tcmalloc and libiomp5 preloaded, ``NUMBA_NUM_THREADS``
             = the cores unless set; ``NUMBA_NUM_THREADS=1`` shows the thread drop that setting prevents).
             CPU-heavy for a few seconds: run it under the CPU lock.
``idle``     the first-token time of requests that reached an idle server (nothing else in flight) in each stored
             served run and closed-loop probe: no n-gram work happens before such a request's first token, so a
             difference between runs of one server is the host's speed, not the n-gram step.
``slower``   each stored served run simulated again (``benchmarks.serving``'s re-analysis) on a host ``--slower``
             times slower throughout: every fitted time (step and prefill overheads, 1 / efficiencies, the front
             end's) scaled alike, nothing else changed. Which runs a uniformly slower host brings within 15 %.

``python -m benchmarks.ngram_cost --run benchmarks/data/serving-run-c [--lookup] [--slower 1.2]`` prints the tables
(``--json``: the results as JSON).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

ACCEPTANCE_30 = REPO_ROOT / "benchmarks/data/acceptance-ngram-code-30.jsonl"
LOOKUP_BATCHES = (1, 4, 16)
LOOKUP_CONTEXTS = (64, 150, 500, 2000)


@dataclass
class CycleRow:
    run: str
    batch: int
    measured_ms: float
    model_ms: float  # the fit's whole cycle at the probe's batch (every sequence running every step)
    mean_cycles: float  # per sequence in the probe's long generation: tokens after the first − accepted / B
    engine_steps: float  # decode steps vLLM ran for that generation (iteration counter − the prefill step)
    drained_ms: float  # the fit's step at the mean running batch × engine steps / mean cycles (upper bracket)

    @property
    def model_error(self) -> float:
        return (self.model_ms - self.measured_ms) / self.measured_ms

    @property
    def drained_error(self) -> float:
        return (self.drained_ms - self.measured_ms) / self.measured_ms


@dataclass
class LookupRow:
    batch: int
    context_tokens: int
    us_per_call: float


@dataclass
class IdleRow:
    run: str
    label: str  # a served run (mode-rate) or a closed-loop probe (probe-mode-c1)
    requests: int
    ttft_ms: list[tuple[int, float]]  # (prompt tokens, TTFT ms) of each request that reached an idle server


def cycle_rows(run_dir: Path) -> list[CycleRow]:
    from benchmarks.serving import calibration_of, read_jsonl
    from calibration.fit import normalize, predict_points, step_points

    records = read_jsonl(run_dir / "records.jsonl")
    gpu, target, cal, _ = calibration_of(records)
    params = cal.step_time[target.name]
    timed = [normalize(r) for r in records if r.get("probe") == "step_time"]
    # tokens after the first in the probe's long generation: a decode step's count (nothing accepted: one per step)
    decode_tokens = max(float(r.values["steps"]) for r in timed if r.values.get("kind") == "step")
    out = []
    for point, rec in zip(step_points(records, target), timed):  # step_points keeps the records' order
        if point.kind != "cycle":
            continue
        v = rec.values
        runs = max(1, len(v.get("step_s_samples") or ()))
        cycles = decode_tokens - float(v["accepted_tokens"]) / runs / point.batch
        steps = float(v["engine_steps"]) - 1.0
        running = point.batch * cycles / steps
        drafted = min(1.0, float(v["num_drafts"]) / runs / (point.batch * cycles))
        at_running = dataclasses.replace(point, batch=running, draft_fraction=drafted)
        model = float(predict_points([point], gpu, params)[0])
        drained = float(predict_points([at_running], gpu, params)[0]) * steps / cycles
        out.append(CycleRow(run_dir.name, int(point.batch), point.seconds * 1e3, model * 1e3, cycles, steps,
                            drained * 1e3))
    return out


def lookup_rows(repeats: int = 300) -> tuple[list[LookupRow], dict[str, float]]:
    import numpy as np
    import torch
    from numba import get_num_threads, set_num_threads
    from vllm.v1.spec_decode.ngram_proposer import batch_propose_numba

    max_len, k, min_n, max_n = 2048, 4, 2, 5  # the servers' max_model_len, k; vLLM's prompt_lookup_min/max
    rng = np.random.default_rng(0)
    tokens = rng.integers(100, 20000, (16, max_len)).astype(np.int32)  # no repeats: the scan reads every token
    drafts, counts = np.zeros((16, k), np.int32), np.zeros(16, np.int32)

    def lookup(batch: int, lengths) -> None:  # as NgramProposer.batch_propose around the numba call
        before = get_num_threads()
        set_num_threads(1)
        batch_propose_numba(list(range(batch)), lengths, tokens, min_n, max_n, max_len, k, drafts, counts)
        set_num_threads(before)

    # SmolLM2-135M's MLP up-projection over 64 tokens in bf16 (576 → 1536, ×8 for a measurable time)
    x, w = torch.randn(64, 576, dtype=torch.bfloat16), torch.randn(576, 1536 * 8, dtype=torch.bfloat16)

    def gemm_us(with_lookup: bool, n: int = 200) -> float:
        lengths = np.full(16, 150, np.int32)
        t = time.perf_counter()
        for _ in range(n):
            if with_lookup:
                lookup(4, lengths)
            x @ w
        return (time.perf_counter() - t) / n * 1e6

    gemm_us(False, 50)
    gemm = {"torch_threads_before": float(torch.get_num_threads()),
            "gemm_before_us": statistics.median(gemm_us(False) for _ in range(3))}
    lookup(1, np.full(16, 64, np.int32))  # numba compiles on the first call
    rows = []
    for b in LOOKUP_BATCHES:
        for ctx in LOOKUP_CONTEXTS:
            lengths = np.full(16, ctx, np.int32)
            t = time.perf_counter()
            for _ in range(repeats):
                lookup(b, lengths)
            rows.append(LookupRow(b, ctx, (time.perf_counter() - t) / repeats * 1e6))
    gemm["gemm_interleaved_us"] = statistics.median(gemm_us(True) for _ in range(3))
    gemm["torch_threads_after"] = float(torch.get_num_threads())
    return rows, gemm


def _idle_arrivals(run: dict) -> list[tuple[int, float]]:
    ok = [not e for e in run["errors"]]
    start, ttft, lat = run["start_times"], run["ttfts"], run["latencies"]
    out = []
    for i, good in enumerate(ok):
        if not good:
            continue
        busy = any(ok[j] and j != i and (start[j] < start[i] < start[j] + lat[j]
                                         or start[i] < start[j] < start[i] + ttft[i]) for j in range(len(ok)))
        if not busy:
            out.append((int(run["input_lens"][i]), ttft[i] * 1e3))
    return sorted(out)


def idle_rows(run_dir: Path) -> list[IdleRow]:
    rows = []
    for label, run in json.loads((run_dir / "runs.json").read_text()).items():
        arrivals = _idle_arrivals(run)
        rows.append(IdleRow(run_dir.name, label, len(run["ttfts"]), arrivals))
    for path in sorted(run_dir.glob("probe-*.json")):
        probe = json.loads(path.read_text())
        if "1" in probe:
            rows.append(IdleRow(run_dir.name, f"{path.stem}-c1", len(probe["1"]["ttfts"]),
                                _idle_arrivals(probe["1"])))
    return rows


STEP_TIMES_S = ("fixed_overhead_s", "per_layer_overhead_s", "verify_overhead_s", "proposer_overhead_s",
                "per_sequence_overhead_s", "rejection_sampling_s_per_seq", "rejection_sampling_s_per_draft",
                "draft_sampling_s_per_token", "eager_layer_overhead_s")


def slower_host(cal, frontend: dict[str, float], factor: float):
    """The calibration and front end of a host ``factor`` times slower: every time × factor (the roofline
    (m^p + c^p)^(1/p) is homogeneous of degree 1 in m and c, so efficiencies ÷ factor scale it alike)."""
    step = {name: dataclasses.replace(p, bandwidth_efficiency=p.bandwidth_efficiency / factor,
                                      compute_efficiency=p.compute_efficiency / factor,
                                      **{f: getattr(p, f) * factor for f in STEP_TIMES_S})
            for name, p in cal.step_time.items()}
    prefill = {name: dataclasses.replace(p, compute_efficiency=p.compute_efficiency / factor,
                                         fixed_overhead_s=p.fixed_overhead_s * factor)
               for name, p in cal.prefill.items()}
    return dataclasses.replace(cal, step_time=step, prefill=prefill), {k: v * factor for k, v in frontend.items()}


def slower_rows(run_dir: Path, factor: float) -> list:
    """``benchmarks.serving``'s re-analysis of a stored run (with the 30-prompt acceptance records) on a host
    ``factor`` times slower: one ``serving.Row`` per (mode, rate)."""
    from benchmarks import serving

    records = serving.read_jsonl(run_dir / "records.jsonl")
    records = [r for r in records if r.get("probe") != "acceptance"] + serving.read_jsonl(ACCEPTANCE_30)
    gpu, target, cal, _ = serving.calibration_of(records)
    kv_tokens = serving.kv_tokens_of(records)
    runs = json.loads((run_dir / "runs.json").read_text())
    rows = []
    longest = max(max(r["output_lens"]) for r in runs.values())  # the runs' --output-len
    for mode in sorted({r["mode"] for r in runs.values()}):
        spec = serving.spec_decode(cal, longest, serving.request_pmfs(records)) if mode == "ngram" else None
        probe = {int(c): v for c, v in json.loads((run_dir / f"probe-{mode}.json").read_text()).items()}
        slow_cal, frontend = slower_host(cal, serving.fit_frontend(probe, gpu, target, cal, spec), factor)
        for run in (r for r in runs.values() if r["mode"] == mode):
            sim = serving.simulate_run(run, gpu, target, slow_cal, kv_tokens, spec, frontend)
            row = serving.compare(mode, run["rate"], run, sim)
            row.load, row.others_cpu = run.get("load"), run["others_cpu"]
            rows.append(row)
    return rows


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", action="append", default=None,
                        help="a stored serving run directory (repeatable; default: Runs C and D)")
    parser.add_argument("--lookup", action="store_true", help="also time vLLM's n-gram lookup (under the CPU lock)")
    parser.add_argument("--slower", type=float, default=None,
                        help="also simulate the stored runs on a host this many times slower (e.g. 1.2)")
    parser.add_argument("--json", action="store_true")


def main(args: argparse.Namespace) -> int:
    runs = [Path(r) for r in (args.run or [REPO_ROOT / "benchmarks/data/serving-run-c",
                                           REPO_ROOT / "benchmarks/data/serving-run-d"])]
    cycles = [row for r in runs for row in cycle_rows(r)]
    idle = [row for r in runs for row in idle_rows(r)]
    lookup, gemm = lookup_rows() if args.lookup else ([], {})
    slower = {r.name: slower_rows(r, args.slower) for r in runs} if args.slower else {}
    if args.json:
        print(json.dumps({"cycles": [dataclasses.asdict(c) | {"model_error": c.model_error,
                                                               "drained_error": c.drained_error} for c in cycles],
                          "lookup": [dataclasses.asdict(x) for x in lookup], "gemm": gemm,
                          "idle": [dataclasses.asdict(x) for x in idle],
                          "slower": {k: [dataclasses.asdict(x) for x in v] for k, v in slower.items()}},
                         indent=1, default=str))
        return 0
    print("n-gram cycle probes: measured / fit at the probe's batch / fit over the engine steps vLLM ran")
    print("| run | B | measured ms | fit at B | mean cycles | engine steps | steps / cycles | drained (upper) |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for c in cycles:
        print(f"| {c.run} | {c.batch} | {c.measured_ms:.1f} | {c.model_ms:.1f} ({100 * c.model_error:+.0f} %) "
              f"| {c.mean_cycles:.1f} | {c.engine_steps:.1f} | {c.engine_steps / c.mean_cycles:.2f} "
              f"| {c.drained_ms:.1f} ({100 * c.drained_error:+.0f} %) |")
    if lookup:
        print("\nvLLM n-gram lookup (one numba thread), µs per step")
        print("| B | " + " | ".join(f"{ctx} tokens" for ctx in LOOKUP_CONTEXTS) + " |")
        print("|--:|" + "--:|" * len(LOOKUP_CONTEXTS))
        for b in LOOKUP_BATCHES:
            print(f"| {b} | " + " | ".join(f"{x.us_per_call:.1f}" for x in lookup if x.batch == b) + " |")
        print(f"torch bf16 GEMM before any lookup {gemm['gemm_before_us']:.0f} µs "
              f"({gemm['torch_threads_before']:.0f} torch threads); each after a lookup "
              f"{gemm['gemm_interleaved_us']:.0f} µs ({gemm['torch_threads_after']:.0f} torch threads)")
    print("\nfirst token of requests that reached an idle server (prompt tokens: TTFT ms)")
    for row in idle:
        if row.ttft_ms:
            cells = ", ".join(f"{p}: {t:.0f}" for p, t in row.ttft_ms)
            print(f"{row.run} {row.label}: {len(row.ttft_ms)} of {row.requests}, median "
                  f"{statistics.median(t for _, t in row.ttft_ms):.0f} ms ({cells})")
    if slower:
        from benchmarks.serving import TARGET_ERROR, format_table

        for name, rows in slower.items():
            within = sum(abs(e) <= TARGET_ERROR for r in rows for e in r.errors.values())
            print(f"\n{name} simulated on a host {args.slower:g}× slower: {within}/{4 * len(rows)} within "
                  f"{100 * TARGET_ERROR:.0f} %\n{format_table(rows)}")
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_cli_args(p)
    parsed = p.parse_args()
    if parsed.lookup:
        from calibration.vllm_cpu.env import reexec_with_cpu_env

        reexec_with_cpu_env(kv_cache_space_gib=None)
    raise SystemExit(main(parsed))
