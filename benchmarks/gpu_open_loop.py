"""An open loop on the GPU: what one vLLM server sustains, and its latencies under Poisson arrivals, against the
product's two readings of the same workload -- ``predict``'s saturated answer (the rate one server sustains,
B_max / L(B_max), prefill added to the decode) and the planner's (:func:`advisor.costmodel.plan.capacity_rps`, the
new prompts' chunks riding in the decode steps; its simulation for the latencies). docs/cost-model.md ("Known gap")
says the two disagree by 16-24 % at saturation; this run is the measurement that decides.

``measure`` (on the GPU)  -- per engine (the baseline; a speculative method at a synthetic acceptance), in its own
                            process: vLLM's ``AsyncLLM`` (the engine behind ``vllm serve``, without HTTP) with the
                            scheduler limits an answer's command sets (``--max-num-seqs 256``,
                            ``--max-num-batched-tokens 8192``, CUDA graphs), dummy weights of the catalog shapes.
                            Requests (P random prompt tokens, O output tokens, greedy, ignore_eos) arrive as a
                            Poisson process: first above the server's capacity (``--overload-rps``) to read the
                            rate it sustains with a queue, then at fractions of that rate. Each request's arrival,
                            first token and finish are recorded, with vLLM's counters per phase. Engines already
                            measured in ``--workdir`` are skipped.
``analyze`` (anywhere)    -- prices the same workload with the product (``services.plans.plan_input`` and
                            ``services.recommendations``' cost model, the shipped engine profile of the GPU × vLLM
                            0.24), simulates each measured Poisson run on its own arrivals (the planner's
                            ``simulate``), and prints measured vs predicted.

Usage on the device (after scripts/gpu-setup.sh): ``python -m benchmarks.gpu_open_loop measure --workdir W``;
here: ``python -m benchmarks.gpu_open_loop analyze --workdir benchmarks/data/h100-vllm0.24-open-loop``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.gpu_closed_loop import TARGET, drafted_share, drafter_method, load_jsonl, shapes  # noqa: E402

DRAFTER = "eagle3-llama-3.1-8b"
PROMPT_TOKENS = 1000
OUTPUT_TOKENS = 300
ACCEPTANCE = 0.7  # conditional per position (synthetic rejection sampling)
K = 3
OVERLOAD_REQUESTS = 900
RATE_REQUESTS = 300
FRACTIONS = (0.5, 0.8)
GPU_MEMORY_UTILIZATION = 0.92  # an answer's default (advisor/schemas.py)
MAX_NUM_SEQS = 256  # the scheduler limits an answer's command sets (advisor/costmodel/vllm_config.py)
MAX_NUM_BATCHED_TOKENS = 8192
WARMUP_SHARE = 0.25  # the overload run's first requests: the queue is still building
QUEUED_WAIT_S = 0.5  # a request that waited this long for its first token met a queue


@dataclass(frozen=True)
class Engine:
    label: str
    method: str | None  # None: the baseline
    k: int = 0
    drafter: str | None = None

    def speculative_config(self, draft_path: str | None) -> dict | None:
        """vLLM's speculative_config: the method at ``ACCEPTANCE`` per position (the product's probe helper)."""
        from calibration.probes import DrafterSpec, synthetic_rates

        if not self.method:
            return None
        spec = DrafterSpec(self.method, self.k, model=draft_path, draft_sample_method=None)
        return spec.speculative_config("", synthetic_rates(ACCEPTANCE, self.k))


def engines(drafter: str = DRAFTER) -> list[Engine]:
    return [Engine("baseline", None), Engine(f"{drafter_method(drafter)}-k{K}", drafter_method(drafter), K, drafter),
            Engine(f"ngram-k{K}", "ngram", K)]


def max_model_len(prompt_tokens: int, output_tokens: int) -> int:
    """Room for a whole request and its drafts. (With 4,096 for 4,000 + 200 tokens the first lease's engine took
    the overload's requests and finished none of them in eight minutes.)"""
    return 256 * math.ceil((prompt_tokens + output_tokens + 64) / 256)


def phase_timeout_s(requests: int, rate_rps: float) -> float:
    """The longest a phase may take: its arrivals, then two minutes; past that the run is stuck, not slow."""
    return requests / rate_rps + 120.0


def poisson_arrivals(n: int, rate: float, rng: random.Random) -> list[float]:
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def sustained_rps(requests: list[dict], warmup_share: float = WARMUP_SHARE) -> float | None:
    """Requests finished per second while a queue stood (the server full): from the finish of the first
    ``warmup_share`` of requests to the last admission (the last first token). None where no queue stood then
    (the requests that arrived in that window did not wait)."""
    done = sorted(r["done_s"] for r in requests)
    start = done[int(len(done) * warmup_share)]
    end = max(r["first_token_s"] for r in requests)
    waited = [r["first_token_s"] - r["arrival_s"] for r in requests if start <= r["arrival_s"] <= end]
    if end <= start or not waited or statistics.median(waited) < QUEUED_WAIT_S:
        return None
    return sum(1 for d in done if start < d <= end) / (end - start)


# --------------------------------------------------------------------------------------------- measure (GPU)
def _counters() -> dict[str, float]:
    from vllm.v1.metrics.reader import get_metrics_snapshot

    out: dict[str, float] = {}
    for m in get_metrics_snapshot():
        if m.name in ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                      "vllm:spec_decode_num_accepted_tokens", "vllm:num_preemptions",
                      "vllm:prompt_tokens", "vllm:generation_tokens"):
            out[m.name] = out.get(m.name, 0.0) + float(m.value)
        elif m.name == "vllm:iteration_tokens_total":
            out["engine_steps"] = out.get("engine_steps", 0.0) + float(getattr(m, "count", 0) or 0)
    return out


async def _phase(llm, name: str, arrivals: list[float], prompts: list[list[int]], output_tokens: int) -> list[dict]:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(temperature=0.0, max_tokens=output_tokens, min_tokens=output_tokens, ignore_eos=True,
                            detokenize=False, output_kind=RequestOutputKind.DELTA)
    t0 = time.perf_counter() + 0.05

    async def one(i: int) -> dict:
        await asyncio.sleep(max(0.0, t0 + arrivals[i] - time.perf_counter()))
        sent = time.perf_counter() - t0
        first, tokens = None, 0
        async for out in llm.generate({"prompt_token_ids": prompts[i]}, params, request_id=f"{name}-{i}"):
            n = len(out.outputs[0].token_ids) if out.outputs else 0
            if n and first is None:
                first = time.perf_counter() - t0
            tokens += n
        done = time.perf_counter() - t0
        return {"arrival_s": round(arrivals[i], 6), "sent_s": round(sent, 6), "first_token_s": round(first or done, 6),
                "done_s": round(done, 6), "output_tokens": tokens, "prompt_tokens": len(prompts[i])}

    return list(await asyncio.gather(*(one(i) for i in range(len(arrivals)))))


def _prompts(n: int, length: int, rng: random.Random, repetitive: bool) -> list[list[int]]:
    from calibration.probes import _random_prompts

    return [p["prompt_token_ids"] for p in _random_prompts(n, length, rng, repetitive=repetitive)]


async def _measure_engine(engine: Engine, args: argparse.Namespace, out: Path) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from calibration.probes import environment_info

    workdir = Path(args.workdir)
    target, draft = shapes(workdir, engine.drafter or DRAFTER)
    if args.model:  # a smoke test of this script on a small real checkpoint (the CPU build)
        target, draft = args.model, args.model
    spec = engine.speculative_config(draft if engine.drafter else None)
    t0 = time.perf_counter()
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(
        model=target, load_format="auto" if args.model else "dummy", skip_tokenizer_init=True,
        max_model_len=max_model_len(args.prompt_tokens, args.output_tokens), seed=0,
        max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        gpu_memory_utilization=GPU_MEMORY_UTILIZATION, disable_log_stats=False, speculative_config=spec))
    startup_s = time.perf_counter() - t0
    cache = llm.vllm_config.cache_config
    info = {"engine": engine.label, "method": engine.method, "k": engine.k, "drafter": engine.drafter,
            "acceptance": ACCEPTANCE if engine.method else None, "speculative_config": spec,
            "startup_s": round(startup_s, 1), "kv_cache_tokens": int((cache.num_gpu_blocks or 0) * cache.block_size),
            "block_size": cache.block_size, "max_num_seqs": MAX_NUM_SEQS,
            "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS, "gpu_memory_utilization": GPU_MEMORY_UTILIZATION,
            "prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens, **environment_info()}
    print(f"[{engine.label}] started in {startup_s:.0f} s, KV {info['kv_cache_tokens']} tokens", flush=True)
    rng = random.Random(11)
    copy = engine.method == "ngram"  # n-gram drafts only where the prompt repeats itself
    try:
        await _phase(llm, "warmup", [0.0] * 32, _prompts(32, args.prompt_tokens, rng, copy), 32)
        phases = [("overload", args.overload_rps, args.overload_requests)]
        capacity = None
        for name, rate, n in phases + [(f"{f:g}x", None, args.rate_requests) for f in FRACTIONS]:
            if rate is None:
                if not capacity:
                    break
                rate = float(name[:-1]) * capacity
            before = _counters()
            c0 = time.perf_counter()
            reqs = await asyncio.wait_for(
                _phase(llm, name, poisson_arrivals(n, rate, rng), _prompts(n, args.prompt_tokens, rng, copy),
                       args.output_tokens), phase_timeout_s(n, rate))
            wall = time.perf_counter() - c0
            after = _counters()
            row = {**info, "phase": name, "rate_rps": rate, "wall_s": round(wall, 2), "requests": reqs,
                   "counters": {k: v - before.get(k, 0.0) for k, v in after.items()}}
            if name == "overload":
                capacity = sustained_rps(reqs)
                row["sustained_rps"] = capacity
            with out.open("a") as f:
                f.write(json.dumps(row, default=str) + "\n")
            ttft = statistics.median(r["first_token_s"] - r["arrival_s"] for r in reqs)
            print(f"[{engine.label}] {name} at {rate:.2f} req/s: {wall:.0f} s, TTFT p50 {ttft * 1e3:.0f} ms"
                  + (f", sustained {capacity:.2f} req/s" if name == "overload" and capacity else ""), flush=True)
    finally:
        llm.shutdown()


def measured_labels(out: Path) -> set[str]:
    """Engines whose every phase is in ``out``."""
    if not out.exists():
        return set()
    phases: dict[str, set] = {}
    for line in out.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            phases.setdefault(row["engine"], set()).add(row["phase"])
    want = {"overload", *(f"{f:g}x" for f in FRACTIONS)}
    return {e for e, p in phases.items() if p >= want}


def measure(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / "open-loop.jsonl"
    done = measured_labels(out)
    status = 0
    for e in engines(args.drafter):
        if e.label in done or (args.engines and e.label not in args.engines.split(",")):
            continue
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, "-m", "benchmarks.gpu_open_loop", "_engine", "--engine",
                              json.dumps(asdict(e)), *sys.argv[2:]])
        print(f"[measure] {e.label}: exit {rc} in {time.perf_counter() - t0:.0f} s", flush=True)
        status = status or rc
    return status


# --------------------------------------------------------------------------------------------- CLI
def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("command", choices=("measure", "analyze", "_engine"))
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--engines", default=None, help="comma-separated labels (default: every engine)")
    parser.add_argument("--drafter", default=DRAFTER)
    parser.add_argument("--prompt-tokens", type=int, default=PROMPT_TOKENS)
    parser.add_argument("--output-tokens", type=int, default=OUTPUT_TOKENS)
    parser.add_argument("--overload-rps", type=float, default=32.0,
                        help="arrival rate of the overload phase: above what one server sustains")
    parser.add_argument("--overload-requests", type=int, default=OVERLOAD_REQUESTS)
    parser.add_argument("--rate-requests", type=int, default=RATE_REQUESTS)
    parser.add_argument("--output", "-o", default=None, help="analyze: write the results as JSON here")
    parser.add_argument("--model", default=None, help="measure: a real checkpoint instead of the shapes (smoke test)")
    parser.add_argument("--engine", default=None, help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    if args.command == "measure":
        return measure(args)
    if args.command == "_engine":
        engine = Engine(**json.loads(args.engine))
        asyncio.run(_measure_engine(engine, args, Path(args.workdir) / "open-loop.jsonl"))
        return 0
    return analyze(args)


# --------------------------------------------------------------------------------------------- analyze (CPU)
def _body(engine: Engine, gpu: str, rate: float, prompt_tokens: int, output_tokens: int,
          draft_fraction: float | None = None) -> dict[str, Any]:
    """The workload as a plan request (and, less its plan fields, a scenario): the measured engine's settings,
    the shipped profile of ``gpu`` × vLLM 0.24, the synthetic acceptance as the input."""
    body: dict[str, Any] = {
        "target_model": TARGET, "vllm_version": "0.24", "gpu_memory_utilization": GPU_MEMORY_UTILIZATION,
        "workload": {"prompt_tokens": prompt_tokens, "output_tokens": output_tokens, "temperature": 0.0,
                     "structure": "code"}}
    if engine.method:
        acc: dict[str, Any] = {"per_position": [ACCEPTANCE ** (i + 1) for i in range(engine.k)]}
        if draft_fraction is not None:
            acc["draft_fraction"] = round(draft_fraction, 4)
        body["speculator"] = {"method": engine.method, "num_speculative_tokens": engine.k, "acceptance": acc,
                              **({"draft_model": engine.drafter} if engine.drafter else {})}
    body["_plan"] = {"gpus": [gpu], "tensor_parallel_sizes": [1], "load": {"requests_per_second": rate},
                     "slo": {"percentile": 90, "ttft_ms": 1e6}, "max_num_seqs": MAX_NUM_SEQS,
                     "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS}
    return body


def plan_request(body: dict[str, Any]) -> dict[str, Any]:
    from advisor.plan_schemas import PlanRequestSchema

    req = {k: v for k, v in body.items() if k not in ("_plan", "speculator")}
    req.update(body["_plan"])
    if "speculator" in body:
        req["speculators"] = [body["speculator"]]
    return PlanRequestSchema().load(req)


def scenario_request(body: dict[str, Any], rate: float) -> dict[str, Any]:
    from advisor.schemas import ScenarioSchema

    req = {k: v for k, v in body.items() if k != "_plan"}
    req.update(gpu=body["_plan"]["gpus"][0], gpu_count=1,
               workload={**body["workload"], "requests_per_second": rate})
    spec = dict(req.pop("speculator", None) or {"method": "eagle3", "draft_model": DRAFTER,
                                                 "num_speculative_tokens": K})
    if "acceptance" in spec:
        req["acceptance"] = spec.pop("acceptance")
    req["speculator"] = spec
    return ScenarioSchema().load(req)


def predicted_latency_ms(engine: Engine, gpu: str, prompt_tokens: int, output_tokens: int, rate_rps: float,
                         draft_fraction: float | None = None) -> float:
    """``predict``'s mean request latency for this engine at an arrival rate (its fluid model: Little's law)."""
    from advisor.services import recommendations

    body = _body(engine, gpu, rate_rps, prompt_tokens, output_tokens, draft_fraction)
    answer = recommendations.predict(scenario_request(body, rate_rps))[0]
    return float(answer["latency_ms"]["speculative" if engine.method else "baseline"]["total"])


def product_readings(engine: Engine, gpu: str, prompt_tokens: int, output_tokens: int,
                     draft_fraction: float | None = None) -> dict[str, Any]:
    """What the product says one server of this engine sustains: the planner's steady-state capacity, and the rate
    in ``predict``'s saturated answer (its throughput over the output tokens: the rate its reasons quote, "one server
    sustains X req/s", at full precision)."""
    from advisor.costmodel.plan import capacity_rps, mode_of
    from advisor.services import plans, recommendations

    body = _body(engine, gpu, 1.0, prompt_tokens, output_tokens, draft_fraction)
    plan, _ = plans.plan_input(plan_request(body))
    offer = plan.offers[0]
    cand = plan.speculators[0] if engine.method else None
    mode = mode_of(plan, offer, 1, cand, engine.k if engine.method else None)
    answer = recommendations.predict(scenario_request(body, 10_000.0))[0]
    if not answer["concurrency"]["saturated"]:
        raise ValueError(f"{engine.label}: 10,000 req/s did not saturate the answer's server")
    sustained = answer["throughput_tok_s"]["speculative" if engine.method else "baseline"] / output_tokens
    return {"planner_capacity_rps": capacity_rps(plan, mode), "predict_sustained_rps": sustained,
            "kv_capacity_tokens": mode.limits.kv_capacity_tokens, "plan": plan, "mode": mode}


SIM_REPLICATES = 8  # speculative runs: simulations of the same arrivals with their own acceptance draws, pooled
METRICS = (("ttft", 50.0), ("ttft", 90.0), ("tpot", 50.0), ("tpot", 90.0))


def load_rows(workdir: Path) -> list[dict]:
    return load_jsonl(workdir / "open-loop.jsonl")


def measured_draft_fraction(row: dict) -> float | None:
    """Share of a sequence's decode steps that drafted, from vLLM's counters: a sequence-step yields 1 + its
    accepted drafts, and each request's first token comes from its prefill."""
    c = row["counters"]
    if "vllm:spec_decode_num_drafts" not in c:
        return None
    return drafted_share(c["vllm:spec_decode_num_drafts"], c.get("vllm:spec_decode_num_accepted_tokens", 0.0),
                         c.get("vllm:generation_tokens", 0.0), len(row["requests"]))


def measured_ms(requests: list[dict]) -> dict[str, float]:
    import numpy as np

    ttft = [r["first_token_s"] - r["arrival_s"] for r in requests]
    tpot = [(r["done_s"] - r["first_token_s"]) / (r["output_tokens"] - 1) for r in requests if r["output_tokens"] > 1]
    data = {"ttft": ttft, "tpot": tpot}
    return {f"{m}_p{q:g}": float(np.percentile(data[m], q)) * 1e3 for m, q in METRICS}


def simulated(requests: list[dict], mode, replicates: int = SIM_REPLICATES):  # noqa: ANN001
    """The planner's simulation of one measured run: its arrivals and token counts, the mode's engine."""
    from advisor.costmodel.simulate import Traffic, simulate

    order = sorted(requests, key=lambda r: r["arrival_s"])
    traffic = Traffic(prompt_tokens=[r["prompt_tokens"] for r in order],
                      output_tokens=[max(r["output_tokens"], 1) for r in order],
                      arrival_s=[r["arrival_s"] for r in order], seed=1)
    runs = [simulate(mode.model, mode.limits, replace(traffic, seed=seed), mode.spec)
            for seed in range(1, 1 + (replicates if mode.spec is not None else 1))]
    return runs, order


def simulated_requests(run, order: list[dict]) -> list[dict]:  # noqa: ANN001
    """One simulation's requests in the measured form (arrival, first token, finish), for :func:`sustained_rps`."""
    return [{"arrival_s": r["arrival_s"], "first_token_s": r["arrival_s"] + float(t),
             "done_s": r["arrival_s"] + float(lat)} for r, t, lat in zip(order, run.ttft_s, run.latency_s)]


@dataclass
class EngineResult:
    engine: str
    measured_sustained_rps: float | None
    simulated_sustained_rps: float | None  # the planner's simulation of the overload run, read the same way
    planner_capacity_rps: float
    predict_sustained_rps: float
    kv_cache_tokens: int
    kv_cache_tokens_model: float
    draft_fraction: float | None
    rates: list[dict]


def analyze_engine(rows: list[dict], gpu: str) -> EngineResult:
    from advisor.costmodel.simulate import pooled

    first = rows[0]
    engine = Engine(first["engine"], first["method"], first["k"], first["drafter"])
    over = next(r for r in rows if r["phase"] == "overload")
    f = measured_draft_fraction(over) if engine.method == "ngram" else None
    got = product_readings(engine, gpu, first["prompt_tokens"], first["output_tokens"], f)
    mode = got["mode"]
    runs, order = simulated(over["requests"], mode)
    sims = [x for x in (sustained_rps(simulated_requests(run, order)) for run in runs) if x]
    rates = []
    for row in rows:
        if row["phase"] == "overload":
            continue
        sim = pooled(simulated(row["requests"], mode)[0])
        meas = measured_ms(row["requests"])
        simv = {f"{m}_p{q:g}": sim.percentile_ms(m, q) for m, q in METRICS}
        mean_ms = statistics.mean(r["done_s"] - r["arrival_s"] for r in row["requests"]) * 1e3
        rates.append({"phase": row["phase"], "rate_rps": row["rate_rps"], "measured_ms": meas, "simulated_ms": simv,
                      "errors": {key: simv[key] / meas[key] - 1 for key in meas},
                      "mean_latency_ms": {"measured": mean_ms, "predict": predicted_latency_ms(
                          engine, gpu, first["prompt_tokens"], first["output_tokens"], row["rate_rps"], f)}})
    return EngineResult(engine.label, over.get("sustained_rps"), statistics.median(sims) if sims else None,
                        got["planner_capacity_rps"], got["predict_sustained_rps"], first["kv_cache_tokens"],
                        got["kv_capacity_tokens"], f, rates)


def format_results(results: list[EngineResult]) -> str:
    def pct(a: float | None, b: float | None) -> str:
        return f"{(a / b - 1) * 100:+.1f} %" if a and b else "-"

    lines = ["| engine | measured req/s | planner's capacity | its simulation | predict's sustained rate |",
             "|---|--:|--:|--:|--:|"]
    for r in results:
        m = r.measured_sustained_rps
        lines.append(f"| {r.engine} | {m or float('nan'):.2f} | {r.planner_capacity_rps:.2f} "
                     f"({pct(r.planner_capacity_rps, m)}) | {r.simulated_sustained_rps or float('nan'):.2f} "
                     f"({pct(r.simulated_sustained_rps, m)}) | {r.predict_sustained_rps:.2f} "
                     f"({pct(r.predict_sustained_rps, m)}) |")
    lines += ["", "| engine | rate | " + " | ".join(f"{m} p{q:g} ms: measured / simulated" for m, q in METRICS)
              + " | mean latency ms: measured / predict |", "|---|--:|" + "--:|" * (len(METRICS) + 1)]
    for r in results:
        for x in r.rates:
            cells = [f"{x['measured_ms'][k]:.0f} / {x['simulated_ms'][k]:.0f} ({x['errors'][k] * 100:+.0f} %)"
                     for k in x["measured_ms"]]
            lat = x["mean_latency_ms"]
            cells.append(f"{lat['measured']:.0f} / {lat['predict']:.0f} ({pct(lat['predict'], lat['measured'])})")
            lines.append(f"| {r.engine} | {x['phase']} ({x['rate_rps']:.1f} req/s) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def analyze(args: argparse.Namespace) -> int:
    from advisor import create_app
    from benchmarks.gpu_closed_loop import catalog_gpu

    rows = load_rows(Path(args.workdir))
    app = create_app({"SQLALCHEMY_DATABASE_URI": "sqlite://", "REDIS_URL": ""})
    results = []
    with app.app_context():
        for label in dict.fromkeys(r["engine"] for r in rows):
            mine = [r for r in rows if r["engine"] == label]
            results.append(analyze_engine(mine, catalog_gpu(mine[0].get("gpu_name"))))
    print(format_results(results))
    if args.output:
        Path(args.output).write_text(json.dumps([asdict(r) for r in results], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_cli_args(p)
    sys.exit(main(p.parse_args()))
