"""Capacity plan (issue 12): which GPU, how many replicas, with or without speculation, under a latency SLO at a load.

For each GPU × tensor-parallel size × {no speculation, the best speculation config}:
1. memory: does the target (and the drafter) fit, and how many KV slots remain (:func:`.memory.memory_report`);
2. the highest per-replica arrival rate λ* whose simulated percentiles meet the SLO (:func:`.simulate.simulate`,
   Poisson arrivals, seeded: every rate sees the same draws scaled, so the search is monotone): check at near-idle
   load (else "SLO unreachable at any load"), step down from just below the replica's steady-state capacity
   (:func:`capacity_rps`: above it the queue grows without end, whatever a finite run shows) until the SLO holds,
   then bisect to ``RATE_TOLERANCE``;
3. per load level L: replicas n = ⌈L / λ*⌉ (load spread evenly, each replica a Poisson stream of L/n), simulated at
   L/n for the percentiles, concurrency (Little's law: λ·E[latency]), headroom, $/month = n · TP · $/GPU-h · h/month
   and $ per 1M output tokens = $/month / (L · output tokens · seconds per month) · 1e6.
The speculation config per GPU × TP: the (speculator, k) with the most output tokens per second of engine time at the
baseline's operating batch (E[tokens per cycle] / cycle time vs 1 / decode step, the same step clock as the
simulation). Ranked by monthly cost at the first load level, then at the following ones.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .acceptance import at_output, draft_fraction_at, per_position_rates
from .checks import check_tensor_parallel
from .memory import MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS, beyond_context_window, memory_report
from .predict import EngineSteps, engine_steps, timing_run
from .simulate import EngineLimits, SimResult, SpecDecode, StepModel, Traffic, _StepClock, kv_capacity_tokens, simulate
from .steptime import forward_cost
from .types import (AcceptanceModel, Calibration, CostModelError, GpuSpec, MeasuredEngineProfile, ModelSpec,
                    PrefillParams, StepTimeParams)

TP_SIZES = (1, 2, 4, 8)
MAX_TP_CHOICES = 3  # default: the smallest TP that fits and the next two doublings (up to 8)
MAX_K = 6  # longest draft the planner considers
RATE_TOLERANCE = 0.05  # relative precision of λ*
STABLE_UTILISATION = 0.97  # the search starts just below the steady-state capacity
SIM_REQUESTS = 120  # requests per simulated rate while λ* is searched
# ... and where the answer is read: λ* refined, and each load level's percentiles. A p90 TTFT near the queue's knee
# grows with the run's length until the run spans the queue's long excursions: on the README's plan λ* from
# 200-request runs came out 6.7 % above that of 4,000-request runs on average over the options whose λ* moved (up
# to 25 %); refined on 400-request runs, 2.5 % (up to 12 %) in twice the time. docs/planner.md "Run length"
STEADY_REQUESTS = 400
REFINE_STEP = 1.1  # the steady-state search steps down from the short runs' λ* by this factor until the SLO holds
IDLE_REQUESTS = 40
WARMUP_FRACTION = 0.1
SECONDS_PER_HOUR = 3600.0
METRICS = ("ttft", "tpot", "latency")
MAX_REPLICAS = 100_000  # beyond this a load is not a plan but an error


@dataclass(frozen=True)
class PlanSlo:
    percentile: float  # 50, 90 or 99
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    latency_ms: float | None = None

    def targets(self) -> dict[str, float]:
        return {m: v for m, v in (("ttft", self.ttft_ms), ("tpot", self.tpot_ms), ("latency", self.latency_ms))
                if v is not None}


@dataclass(frozen=True)
class GpuOffer:
    """A candidate GPU with its price and the step-time parameters that apply to it (calibrated or default)."""

    gpu: GpuSpec
    gpu_hour_usd: float
    price_source: str  # "input" | "catalog:<gpu> (<date>)"
    step: StepTimeParams
    prefill: PrefillParams
    timing_source: str  # "default" | "calibration:<run id>" | "profile:<name>"
    # the measured profile of this GPU × the plan's vLLM version, if any: it times the GPU where no calibration run
    # did, and where one did, a drafter of a method no run timed (engine_steps)
    profile: MeasuredEngineProfile | None = None
    # the calibration runs that timed the target on this GPU, newest first (the first times the baseline)
    calibrations: tuple[Calibration, ...] = ()

    def speculative_steps(self, target: ModelSpec, drafter: ModelSpec | None, method: str) -> EngineSteps:
        """This GPU's engine speculating with ``drafter`` by ``method``, timed as ``predict`` times it: by the run
        a recommendation would take (``timing_run``: the one that timed that drafter, else one of its method) and
        ``engine_steps``' rule (a timed drafter's fit for the target's steps too, an untimed one's stand-in of its
        method, else the offer's fit for the target and the method's prior)."""
        cal = timing_run(self.calibrations, target.name, drafter.name if drafter is not None else None, method)
        return engine_steps(self.gpu, "vllm", target, drafter, method, cal, self.profile)


@dataclass(frozen=True)
class SpeculatorCandidate:
    method: str
    draft: ModelSpec | None
    acceptance: AcceptanceModel
    acceptance_source: str
    num_speculative_tokens: int | None = None  # None: the planner chooses k


@dataclass(frozen=True)
class PlanInput:
    target: ModelSpec
    prompt_tokens: int
    output_tokens: int
    temperature: float
    requests_per_second: float
    slo: PlanSlo
    offers: tuple[GpuOffer, ...]
    speculators: tuple[SpeculatorCandidate, ...]
    growth: tuple[float, ...] = (1.0,)
    tp_sizes: tuple[int, ...] | None = None
    weights_dtype: str = "bf16"
    kv_cache_dtype: str = "auto"  # vLLM's --kv-cache-dtype (KV capacity and the attention's bytes)
    length_spread: float = 0.0  # lengths uniform in mean·(1 ± spread) (vLLM bench's random-range-ratio)
    hours_per_month: float = 730.0
    gpu_memory_utilization: float = 0.92
    max_num_seqs: int = MAX_NUM_SEQS
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS
    sim_requests: int = SIM_REQUESTS
    steady_requests: int = STEADY_REQUESTS
    seed: int = 0

    @property
    def loads(self) -> list[float]:
        return [self.requests_per_second * g for g in self.growth]


@dataclass
class _Mode:
    """One engine configuration on one GPU × TP: what the simulation needs and caches."""

    model: StepModel
    limits: EngineLimits
    spec: SpecDecode | None
    cache: dict[float, SimResult] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------- pieces
def tp_candidates(plan: PlanInput, offer: GpuOffer) -> list[int]:
    if plan.tp_sizes:
        return sorted(set(plan.tp_sizes))
    ctx = plan.prompt_tokens + plan.output_tokens
    sizes = [tp for tp in TP_SIZES if not check_tensor_parallel(plan.target, tp)]  # vLLM can shard
    for i, tp in enumerate(sizes):
        mem = memory_report(offer.gpu, plan.target, None, 1, ctx, plan.weights_dtype, tp, plan.gpu_memory_utilization,
                            kv_cache_dtype=plan.kv_cache_dtype)
        if mem.fits_baseline:
            return sizes[i:i + MAX_TP_CHOICES]
    return [sizes[-1]]


def _lengths(plan: PlanInput, n: int) -> tuple[np.ndarray | int, np.ndarray | int]:
    if plan.length_spread <= 0:
        return plan.prompt_tokens, plan.output_tokens
    rng = np.random.default_rng(plan.seed + 1)
    s = plan.length_spread

    def draw(mean: int) -> np.ndarray:
        lo, hi = max(1, int(math.floor(mean * (1 - s)))), max(1, int(math.ceil(mean * (1 + s))))
        return rng.integers(lo, hi + 1, n)

    return draw(plan.prompt_tokens), draw(plan.output_tokens)


def _run(plan: PlanInput, mode: _Mode, rate: float, requests: int | None = None) -> SimResult:
    requests = requests or plan.sim_requests
    key = (round(rate, 12), requests)
    if key not in mode.cache:
        prompt, output = _lengths(plan, requests)
        traffic = Traffic(prompt, output, requests_per_second=rate, num_requests=requests, seed=plan.seed,
                          warmup_fraction=WARMUP_FRACTION, max_queue=max(2 * mode.limits.max_num_seqs, 64))
        mode.cache[key] = simulate(mode.model, mode.limits, traffic, mode.spec)
    return mode.cache[key]


def _values(plan: PlanInput, sim: SimResult) -> dict[str, float]:
    return {m: sim.percentile_ms(m, plan.slo.percentile) for m in plan.slo.targets()}


def _meets(plan: PlanInput, sim: SimResult) -> bool:
    targets = plan.slo.targets()
    return not sim.saturated and all(v <= targets[m] for m, v in _values(plan, sim).items())


def capacity_rps(plan: PlanInput, mode: _Mode) -> float:
    """Steady-state requests/s of one replica kept full (the most it can sustain; a higher arrival rate queues
    without end): B requests decode together, B·E[tokens per cycle]/output of them finish per step and as many
    prompts are prefilled in the same step (chunked prefill rides along with the decodes, within the token budget).
    B = max_num_seqs, or what the KV cache holds at the mean context."""
    clock = _StepClock(mode.model, mode.spec)
    lim, k = mode.limits, (mode.spec.k if mode.spec else 0)
    mean_ctx = plan.prompt_tokens + plan.output_tokens / 2.0
    per_seq_kv = mean_ctx + k + lim.block_size / 2.0
    batch = max(1, min(lim.max_num_seqs, int(lim.kv_capacity_tokens // per_seq_kv)))
    tokens_per_cycle = float(mode.spec.tokens_pmf() @ np.arange(1, mode.spec.k + 2)) if mode.spec else 1.0
    finishing = batch * tokens_per_cycle / plan.output_tokens  # requests leaving (and entering) per step
    prompt_tokens = min(finishing * plan.prompt_tokens, max(lim.max_num_batched_tokens - batch * (1 + k), 1))
    step = clock(batch, batch * mean_ctx, prompt_tokens, prompt_tokens * plan.prompt_tokens / 2.0, 0.0)
    steps_per_request = plan.prompt_tokens / prompt_tokens  # prompt tokens per step bound the admissions too
    return min(finishing, 1.0 / steps_per_request) / step


def _search(plan: PlanInput, mode: _Mode, lo: float, hi: float, rate: float, step: float,
            requests: int) -> tuple[float, float]:
    """The highest rate in [lo, hi) meeting the SLO on ``requests``-request runs, to ``RATE_TOLERANCE``: from
    ``rate`` down by ``step`` until the SLO holds, then geometric bisection (``lo`` is known to meet it, ``hi``
    not). Returns the bracket (the rate found, the lowest rate seen to miss)."""
    while rate > lo * (1 + RATE_TOLERANCE):
        if _meets(plan, _run(plan, mode, rate, requests)):
            lo = rate
            break
        hi = rate
        rate /= step
    while hi / lo > 1 + RATE_TOLERANCE:
        mid = math.sqrt(lo * hi)
        if _meets(plan, _run(plan, mode, mid, requests)):
            lo = mid
        else:
            hi = mid
    return lo, hi


def max_rate(plan: PlanInput, mode: _Mode) -> tuple[float, str | None]:
    """λ*: the highest per-replica rate meeting the SLO (0 with the reason when none does), below the replica's
    steady-state capacity (a finite simulation above it would show a transient, not a service level). Searched on
    short runs from just below the capacity, by halves; then refined on ``steady_requests``-request runs, whose
    percentiles are the steady state's (short runs read the knee's percentiles low, so refining steps down)."""
    capacity = capacity_rps(plan, mode)
    idle = capacity / 200.0
    sim = _run(plan, mode, idle, IDLE_REQUESTS)
    if not _meets(plan, sim):
        return 0.0, "SLO unreachable at any load: " + "; ".join(_violations(plan, sim)) + " on an idle replica"
    lam, missed = _search(plan, mode, idle, capacity, capacity * STABLE_UTILISATION, 2.0, plan.sim_requests)
    if plan.steady_requests > plan.sim_requests:  # what misses on short runs misses on long ones
        lam, _ = _search(plan, mode, idle, missed, lam, REFINE_STEP, plan.steady_requests)
    return lam, None


def _violations(plan: PlanInput, sim: SimResult) -> list[str]:
    targets = plan.slo.targets()
    out = []
    for m, v in _values(plan, sim).items():
        if v > targets[m]:
            out.append(f"p{plan.slo.percentile:g} {m.upper()} {v:.0f} ms > {targets[m]:g} ms")
    return out or ["queue grows without bound"]


def tokens_per_engine_second(model: StepModel, spec: SpecDecode | None, batch: float, ctx: float) -> float:
    """Output tokens per second of a decode-only step at ``batch`` (the speculation choice's criterion)."""
    clock = _StepClock(model, spec)
    b = max(1, int(round(batch)))
    per_cycle = float(spec.tokens_pmf() @ np.arange(1, spec.k + 2)) if spec else 1.0
    return b * per_cycle / clock(b, b * ctx, 0.0, 0.0, 0.0)


def _spec_decode(cand: SpeculatorCandidate, k: int, plan: PlanInput) -> SpecDecode:
    r = per_position_rates(at_output(cand.acceptance, plan.output_tokens), plan.temperature, k)
    return SpecDecode(cand.method, k, tuple(float(x) for x in r),
                      draft_fraction_at(cand.acceptance, plan.temperature, plan.output_tokens))


# ----------------------------------------------------------------------------------------------- the plan
def plan_capacity(plan: PlanInput) -> dict[str, Any]:
    """The ranked plan as a JSON-able dict (``options`` ranked by monthly cost; see docs/planner.md)."""
    _validate(plan)
    options: list[dict[str, Any]] = []
    for offer in plan.offers:
        for tp in tp_candidates(plan, offer):
            options += _options_for(plan, offer, tp)
    _rank(plan, options)
    best = []
    for i, load in enumerate(plan.loads):
        feasible = [o for o in options if o["feasible"]]
        cheapest = min(feasible, key=lambda o: (o["loads"][i]["monthly_usd"], o["rank"]), default=None)
        base = min((o for o in feasible if o["mode"] == "baseline"),
                   key=lambda o: (o["loads"][i]["monthly_usd"], o["rank"]), default=None)
        best.append({"requests_per_second": load, "option": cheapest["key"] if cheapest else None,
                     "monthly_usd": cheapest["loads"][i]["monthly_usd"] if cheapest else None,
                     "best_without_speculation": base["key"] if base else None,
                     "monthly_usd_without_speculation": base["loads"][i]["monthly_usd"] if base else None,
                     "speculation_changes_answer": bool(cheapest and base and cheapest["key"] != base["key"])})
    return {
        "options": options,
        "best": best,
        "feasible": any(o["feasible"] for o in options),
        "loads_requests_per_second": plan.loads,
        "slo": {"percentile": plan.slo.percentile, **{f"{m}_ms": v for m, v in plan.slo.targets().items()}},
        "simulation": {"requests_per_rate": plan.steady_requests, "search_requests_per_rate": plan.sim_requests,
                       "warmup_fraction": WARMUP_FRACTION, "seed": plan.seed, "arrivals": "poisson",
                       "rate_tolerance": RATE_TOLERANCE, "max_num_seqs": plan.max_num_seqs,
                       "max_num_batched_tokens": plan.max_num_batched_tokens},
    }


def _validate(plan: PlanInput) -> None:
    if not plan.slo.targets():
        raise CostModelError("slo", "give at least one of ttft_ms, tpot_ms, latency_ms")
    if plan.slo.percentile not in (50.0, 90.0, 99.0):
        raise CostModelError("slo.percentile", "one of 50, 90, 99")
    if not plan.offers:
        raise CostModelError("gpus", "no candidate GPU")
    if not plan.requests_per_second > 0 or not all(g > 0 for g in plan.growth):
        raise CostModelError("load", "loads must be > 0")
    if not 0.0 <= plan.length_spread < 1.0:
        raise CostModelError("workload.length_spread", "must be in [0, 1)")


def _options_for(plan: PlanInput, offer: GpuOffer, tp: int) -> list[dict[str, Any]]:
    gpu, target = offer.gpu, plan.target
    ctx = plan.prompt_tokens + plan.output_tokens
    mem = memory_report(gpu, target, None, 1, ctx, plan.weights_dtype, tp, plan.gpu_memory_utilization,
                        kv_cache_dtype=plan.kv_cache_dtype)
    base_row = _row(plan, offer, tp, "baseline", None)
    why = beyond_context_window(target, ctx) or next(
        (i.message for i in check_tensor_parallel(target, tp)), None)
    if why is not None:
        return [_infeasible(base_row, why), _infeasible(_row(plan, offer, tp, "speculative", None), why)]
    if not mem.fits_baseline:
        why = (f"does not fit: {mem.target_weights_gb:.1f} GB of weights + activations leave no KV space for a "
               f"{ctx}-token request on {tp}× {gpu.name} ({mem.usable_gb * tp:.0f} GB usable)")
        return [_infeasible(base_row, why), _infeasible(_row(plan, offer, tp, "speculative", None), why)]
    base = mode_of(plan, offer, tp)
    rows = [_fill(plan, base_row, base, offer, tp)]

    # the speculation config: most output tokens per engine-second at the baseline's operating batch
    op_batch = rows[0].get("_batch") or 1.0
    mean_ctx = plan.prompt_tokens + plan.output_tokens / 2.0
    base_tps = tokens_per_engine_second(base.model, None, op_batch, mean_ctx)
    chosen, chosen_gain, reasons = None, -math.inf, []
    for cand in plan.speculators:
        kmax = cand.num_speculative_tokens
        smem = memory_report(gpu, target, cand.draft, 1, ctx, plan.weights_dtype, tp, plan.gpu_memory_utilization,
                             None, kmax or MAX_K, plan.kv_cache_dtype)
        if not smem.fits:
            reasons.append(f"{_spec_name(cand)}: drafter + KV do not fit")
            continue
        unsharded = check_tensor_parallel(target, tp, cand.draft, cand.method)
        if unsharded:
            reasons.append(f"{_spec_name(cand)}: {unsharded[0].message}")
            continue
        engine = mode_of(plan, offer, tp, cand)
        for k in ([kmax] if kmax else range(1, MAX_K + 1)):
            mode = replace(engine, spec=_spec_decode(cand, k, plan), cache={})
            gain = tokens_per_engine_second(mode.model, mode.spec, op_batch, mean_ctx) / base_tps
            if gain > chosen_gain:
                chosen, chosen_gain = (cand, mode), gain
    spec_row = _row(plan, offer, tp, "speculative", None)
    if chosen is None:
        rows.append(_infeasible(spec_row, "; ".join(reasons) or "no speculator applies to this target"))
        return rows
    cand, mode = chosen
    steps = offer.speculative_steps(target, cand.draft, cand.method)
    spec_row["sources"]["step_time"] = steps.spec_source or steps.source
    spec_row["speculator"] = {"method": cand.method, "draft_model": cand.draft.name if cand.draft else None,
                              "num_speculative_tokens": mode.spec.k,
                              "mean_acceptance_length": float(mode.spec.tokens_pmf() @ np.arange(1, mode.spec.k + 2)),
                              "draft_fraction": mode.spec.draft_fraction,
                              "decode_gain_at_operating_batch": chosen_gain, "acceptance_source": cand.acceptance_source}
    rows.append(_fill(plan, spec_row, mode, offer, tp))
    return rows


def mode_of(plan: PlanInput, offer: GpuOffer, tp: int, cand: SpeculatorCandidate | None = None,
            k: int | None = None) -> _Mode:
    """One replica's engine as the planner simulates it: the offer's step clock and the KV cache the memory model
    leaves at the plan's context; with ``cand``, its drafter's steps and KV share, speculating ``k`` drafts (None:
    the engine without its SpecDecode, for the k search)."""
    gpu, target = offer.gpu, plan.target
    ctx = plan.prompt_tokens + plan.output_tokens
    cost = forward_cost(gpu, target, plan.weights_dtype, tp, plan.kv_cache_dtype)
    if cand is None:
        mem = memory_report(gpu, target, None, 1, ctx, plan.weights_dtype, tp, plan.gpu_memory_utilization,
                            kv_cache_dtype=plan.kv_cache_dtype)
        limits = EngineLimits(kv_capacity_tokens(mem.kv_space_gb_baseline, mem.kv_bytes_per_token_target),
                              plan.max_num_seqs, plan.max_num_batched_tokens)
        return _Mode(StepModel(cost, offer.step, offer.prefill, temperature=plan.temperature), limits, None)
    smem = memory_report(gpu, target, cand.draft, 1, ctx, plan.weights_dtype, tp, plan.gpu_memory_utilization,
                         None, cand.num_speculative_tokens or MAX_K, plan.kv_cache_dtype)
    dcost = forward_cost(gpu, cand.draft, "bf16", tp, plan.kv_cache_dtype) if cand.draft is not None else None
    steps = offer.speculative_steps(target, cand.draft, cand.method)
    smodel = StepModel(cost, steps.target_step, offer.prefill, dcost, steps.draft_step, plan.temperature)
    limits = EngineLimits(kv_capacity_tokens(smem.kv_space_gb, smem.kv_bytes_per_token_target,
                                             smem.kv_bytes_per_token_draft), plan.max_num_seqs,
                          plan.max_num_batched_tokens)
    return _Mode(smodel, limits, _spec_decode(cand, k, plan) if k else None)


def _spec_name(cand: SpeculatorCandidate) -> str:
    return cand.method + (f" ({cand.draft.name})" if cand.draft is not None else "")


def _row(plan: PlanInput, offer: GpuOffer, tp: int, mode: str, speculator: dict | None) -> dict[str, Any]:
    return {"key": f"{offer.gpu.name}/tp{tp}/{mode}", "gpu": offer.gpu.name, "tensor_parallel_size": tp,
            "mode": mode, "speculator": speculator, "feasible": False, "infeasible_reason": None,
            "gpu_hour_usd": offer.gpu_hour_usd, "max_requests_per_second_per_replica": None,
            "capacity_requests_per_second_per_replica": None,
            "kv_capacity_tokens": None, "loads": [],
            "sources": {"gpu_hour_usd": offer.price_source, "step_time": offer.timing_source,
                        "latency": "simulation"}}


def _infeasible(row: dict[str, Any], why: str) -> dict[str, Any]:
    row.update(feasible=False, infeasible_reason=why, loads=[])
    return row


def _fill(plan: PlanInput, row: dict[str, Any], mode: _Mode, offer: GpuOffer, tp: int) -> dict[str, Any]:
    lam, why = max_rate(plan, mode)
    row["kv_capacity_tokens"] = mode.limits.kv_capacity_tokens
    if mode.spec is not None:
        row["sources"]["acceptance"] = row["speculator"]["acceptance_source"]
    if why:
        row["_batch"] = 1.0
        return _infeasible(row, why)
    row["max_requests_per_second_per_replica"] = lam
    row["capacity_requests_per_second_per_replica"] = capacity_rps(plan, mode)
    row["_batch"] = max(_run(plan, mode, lam, plan.steady_requests).mean_decode_batch, 1.0)
    q = plan.slo.percentile
    targets = plan.slo.targets()
    loads = []
    for load in plan.loads:
        replicas = math.ceil(load / lam * (1 - 1e-9))
        if replicas > MAX_REPLICAS:
            raise CostModelError("load.requests_per_second",
                                 f"{load:g} req/s needs {replicas} replicas of {offer.gpu.name}: beyond {MAX_REPLICAS}")
        per = load / replicas
        sim = _run(plan, mode, per, plan.steady_requests)
        gpus = replicas * tp
        monthly = gpus * offer.gpu_hour_usd * plan.hours_per_month
        tokens_per_month = load * plan.output_tokens * SECONDS_PER_HOUR * plan.hours_per_month
        vals = {m: sim.percentile_ms(m, q) for m in METRICS}
        headroom = min((targets[m] - vals[m]) / targets[m] for m in targets)
        lat = sim.latency_s.mean() if len(sim.latency_s) else math.nan
        loads.append({"requests_per_second": load, "replicas": replicas, "gpus": gpus,
                      "requests_per_second_per_replica": per, "concurrency_per_replica": per * float(lat),
                      "monthly_usd": monthly, "usd_per_million_output_tokens": monthly / tokens_per_month * 1e6,
                      f"ttft_p{q:g}_ms": _finite(vals["ttft"]), f"tpot_p{q:g}_ms": _finite(vals["tpot"]),
                      f"latency_p{q:g}_ms": _finite(vals["latency"]), "slo_headroom": headroom,
                      "meets_slo": _meets(plan, sim)})
    row.update(feasible=True, loads=loads)
    return row


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _rank(plan: PlanInput, options: list[dict[str, Any]]) -> None:
    """Rank feasible options by monthly cost at each load level in turn; infeasible ones last. Add what speculation
    saves (negative: costs) on each GPU × TP."""
    by_key = {o["key"]: o for o in options}
    for o in options:
        o.pop("_batch", None)
        if o["mode"] == "speculative":
            base = by_key.get(o["key"].replace("/speculative", "/baseline"))
            o["speculation_saves_monthly_usd"] = [
                (b["monthly_usd"] - s["monthly_usd"]) if b and s else None
                for b, s in _pairs(base["loads"] if base and base["feasible"] else [], o["loads"], len(plan.loads))]
        else:
            o["speculation_saves_monthly_usd"] = None

    def cost_key(o: dict[str, Any]) -> tuple:
        if not o["feasible"]:
            return (1,) + (math.inf,) * len(plan.loads) + (o["key"],)
        return (0,) + tuple(x["monthly_usd"] for x in o["loads"]) + (o["key"],)

    options.sort(key=cost_key)
    for i, o in enumerate(options, 1):
        o["rank"] = i


def _pairs(a: list, b: list, n: int) -> list[tuple[Any, Any]]:
    return [(a[i] if i < len(a) else None, b[i] if i < len(b) else None) for i in range(n)]
