"""Discrete-event simulation of vLLM's V1 scheduler at iteration level (issue 12): latency percentiles under load.

One engine step = one scheduler iteration (vLLM ``Scheduler.schedule``; Kwon et al. 2023 §4.5, Agrawal et al. 2024
"Sarathi-Serve" for chunked prefill):
- running requests first, in admission order: each decoding request gets 1 token (+ its k draft tokens with
  speculation), a request still prefilling gets min(remaining prompt, budget left) tokens; then waiting requests,
  first come first served, while the ``max_num_batched_tokens`` budget, ``max_num_seqs`` and the KV cache allow
  (a new request needs KV space for its first chunk);
- when the decoding requests' KV (context + k lookahead slots, rounded up to blocks) outgrows the cache, the newest
  running request is preempted (recompute: its prompt and generated tokens are prefilled again when it resumes);
- the step's duration comes from the fitted step-time model (:mod:`.steptime`): one forward over all scheduled
  tokens (decode and verify tokens at the step-time fit's compute efficiency, prompt chunks at the prefill fit's),
  the engine's fixed overheads, and with speculation the verify, rejection-sampling and drafter costs
  (:mod:`.speculation`'s cycle, design.md §3);
- a speculative cycle turns 1 + accepted tokens into output, accepted drawn per cycle from the per-position
  acceptance r_i (P(first i+1 drafts accepted), design.md §2) and the fraction of steps that draft.

Speed: every decoding request advances by exactly one cycle per step, so between events (an arrival that can be
admitted, a completion, KV overflow) the batch is constant and the simulation jumps over whole stretches of steps
(context growth priced at the stretch's midpoint). A request's cycles are drawn once when it starts decoding
(exact sums of per-cycle draws). Arrivals are Poisson (seeded) or given; lengths are constants or per-request
arrays. The number of requests and the simulated time are bounded (``MAX_REQUESTS``, ``horizon_s``): a run that
would queue without end stops early and says so (``saturated``).
"""
from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from .memory import GB, MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS
from .speculation import COPY_PROPOSER_S_PER_SEQ, MODEL_DRAFTERS
from .steptime import ALLREDUCE_LATENCY_S, ForwardCost, forward_time_s, smooth_max_s, weight_bytes_read
from .types import CostModelError, PrefillParams, StepTimeParams

MAX_REQUESTS = 20_000  # bound on requests per simulation (bad input beyond this is refused)
DEFAULT_BLOCK_SIZE = 16  # vLLM GPU default KV block (tokens); the CPU backend uses 128
PERCENTILES = (50.0, 90.0, 99.0)


# ----------------------------------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class EngineLimits:
    """The scheduler's knobs (vLLM ``SchedulerConfig`` / ``CacheConfig``)."""

    kv_capacity_tokens: int  # KV cache slots (vLLM start-up log "KV cache size: N tokens"), target + drafter share
    max_num_seqs: int = MAX_NUM_SEQS
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS
    block_size: int = DEFAULT_BLOCK_SIZE


@dataclass(frozen=True)
class SpecDecode:
    """Speculation as the simulation needs it: k drafts per cycle, per-position acceptance, drafting fraction."""

    method: str
    k: int
    per_position: tuple[float, ...]  # r_i, i < k (non-increasing)
    draft_fraction: float = 1.0
    # Optional: P(a step yields j tokens), j = 1..k+1, of single requests as measured (vLLM's per-request
    # spec-decode metrics, vllm/v1/metrics/stats.py RequestSpecDecodeMetrics). A copy drafter's acceptance is a
    # property of each request's text (repeats to copy or none), not an i.i.d. draw per step: each simulated
    # request takes one of these (uniformly) for all its steps; the step's cost keeps the pooled draft fraction.
    request_pmfs: tuple[tuple[float, ...], ...] = ()

    def tokens_pmf(self) -> np.ndarray:
        """P(a cycle yields j tokens), j = 1..k+1: no draft (1 − f) or j − 1 accepted drafts then the bonus token."""
        r = np.clip(np.asarray(self.per_position[: self.k], dtype=float), 0.0, 1.0)
        r = np.minimum.accumulate(r)
        f = min(max(self.draft_fraction, 0.0), 1.0)
        reach = np.concatenate([[1.0], r])  # P(≥ j accepted), j = 0..k
        exact = reach - np.concatenate([r, [0.0]])  # P(exactly j accepted)
        pmf = f * exact
        pmf[0] += 1.0 - f
        return pmf / pmf.sum()


@dataclass(frozen=True)
class StepModel:
    """Everything the step time of a mixed batch needs (one model on one GPU type at one TP size)."""

    target: ForwardCost
    step: StepTimeParams
    prefill: PrefillParams
    draft: ForwardCost | None = None  # a drafter model (draft_model / EAGLE / MTP); None for n-gram and baselines
    draft_step: StepTimeParams | None = None
    temperature: float = 0.0
    # A serving front end (HTTP, tokenisation, detokenising and streaming each new token) that shares the engine's
    # cores: engine time lost per step and per decoding sequence per step, and the delay before a request reaches
    # the scheduler. 0 where the front end has cores of its own (GPU hosts); calibrated by a closed-loop serving
    # probe on CPU hosts (benchmarks/serving.py).
    frontend_s_per_step: float = 0.0
    frontend_s_per_seq: float = 0.0
    frontend_latency_s: float = 0.0


@dataclass(frozen=True)
class Traffic:
    """Arrivals and lengths: Poisson at ``requests_per_second`` (seeded) or the given ``arrival_s``."""

    prompt_tokens: int | Sequence[int]
    output_tokens: int | Sequence[int]
    requests_per_second: float | None = None
    arrival_s: Sequence[float] | None = None
    num_requests: int = 400
    seed: int = 0
    warmup_fraction: float = 0.0  # requests dropped from the statistics (the empty-system start)
    horizon_s: float | None = None  # stop admitting arrivals after this much simulated time (None: no bound)
    max_queue: int | None = None  # stop (saturated) once this many requests wait (None: simulate every request)


# ----------------------------------------------------------------------------------------------- results
@dataclass
class SimResult:
    ttft_s: np.ndarray  # per finished request (after warm-up), in arrival order
    tpot_s: np.ndarray  # (finish − first token) / (output − 1); requests with one output token excluded
    latency_s: np.ndarray
    finished: int
    requests: int
    duration_s: float
    output_tokens: int
    steps: int
    preemptions: int
    mean_decode_batch: float
    saturated: bool  # stopped with requests still queued beyond the horizon, or the queue grew without bound
    events: int = 0  # stretches simulated (speed diagnostics)
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def throughput_tok_s(self) -> float:
        return self.output_tokens / self.duration_s if self.duration_s > 0 else 0.0

    def percentile_ms(self, metric: str, q: float) -> float:
        """q-th percentile (numpy's linear method) of ``ttft`` / ``tpot`` / ``latency`` in ms; inf when saturated
        or nothing finished."""
        data = {"ttft": self.ttft_s, "tpot": self.tpot_s, "latency": self.latency_s}[metric]
        if self.saturated or len(data) == 0:
            return math.inf
        return float(np.percentile(data, q)) * 1e3

    def summary(self, percentiles: Sequence[float] = PERCENTILES) -> dict[str, float | int | bool | None]:
        out: dict[str, float | int | bool | None] = {}
        for m in ("ttft", "tpot", "latency"):
            for q in percentiles:
                v = self.percentile_ms(m, q)
                out[f"{m}_p{q:g}_ms"] = v if math.isfinite(v) else None
        out.update(throughput_tok_s=self.throughput_tok_s, mean_decode_batch=self.mean_decode_batch,
                   preemptions=self.preemptions, finished=self.finished, saturated=self.saturated)
        return out


# ----------------------------------------------------------------------------------------------- step time
class _StepClock:
    """Scalar step time of one engine iteration (plain floats: called thousands of times per simulation).

    Same terms as :func:`.steptime.step_time_from_cost` / :func:`.steptime.prefill_time_s` (smooth roofline over
    the memory and compute times of all scheduled tokens; Williams et al. 2009), per sequence rather than per batch.
    """

    def __init__(self, model: StepModel, spec: SpecDecode | None) -> None:
        c, s, p = model.target, model.step, model.prefill
        self.c, self.s, self.spec = c, s, spec
        self.inv_bw = 1.0 / (c.bandwidth_bytes_per_s * s.bandwidth_efficiency)
        self.inv_f_decode = 1.0 / (c.peak_flops_per_s * s.compute_efficiency)
        self.inv_f_prefill = 1.0 / (c.peak_flops_per_s * p.compute_efficiency)
        self.dense_weights = None if c.model.num_experts else float(weight_bytes_read(c, 1.0))
        self.layer_s = c.num_layers * s.per_layer_overhead_s
        self.p = s.roofline_sharpness
        self.fixed_decode = s.fixed_overhead_s
        self.fixed_prefill = max(p.fixed_overhead_s, s.fixed_overhead_s)
        self.hot = model.temperature > 0.0
        self.k = spec.k if spec else 0
        self.f = spec.draft_fraction if spec else 0.0
        self.draft = model.draft if spec and spec.method in MODEL_DRAFTERS else None
        self.catch_up = bool(spec and spec.method == "draft_model")
        self.draft_step = model.draft_step or s
        self.copy_s_per_seq = COPY_PROPOSER_S_PER_SEQ.get(spec.method, 0.0) if spec else 0.0
        self.inv_f_draft_prefill = 1.0 / (self.draft.peak_flops_per_s * p.compute_efficiency) if self.draft else 0.0
        # target all-reduce time = ar0 + ar1·tokens (two per layer: Megatron-LM TP, Shoeybi et al. 2019)
        g = c.gpu_count
        self.ar0 = 2 * c.num_layers * ALLREDUCE_LATENCY_S if g > 1 else 0.0
        self.ar1 = 2 * c.num_layers * 2 * (g - 1) / g * c.hidden_size * 2 / c.interconnect_bytes_per_s if g > 1 else 0.0
        self.q = 1.0 + self.f * self.k  # tokens per decoding sequence in a step (verify: 1 + f·k)
        self.ragged = s.ragged_step_s if spec else 0.0  # host-bound floor of a step not every sequence drafted in
        self.kv = c.kv_bytes_per_ctx_token
        self.flops, self.attn = c.flops_per_token, c.attn_flops_per_token_per_ctx
        self.fe_step, self.fe_seq = model.frontend_s_per_step, model.frontend_s_per_seq

    def _weights(self, cost: ForwardCost, tokens: float) -> float:
        if cost is self.c and self.dense_weights is not None:
            return self.dense_weights
        return float(weight_bytes_read(cost, tokens))

    @staticmethod
    def _allreduce(cost: ForwardCost, tokens: float) -> float:
        """Two all-reduces per layer (Megatron-LM TP, Shoeybi et al. 2019), as steptime.tp_allreduce_s."""
        g = cost.gpu_count
        if g == 1:
            return 0.0
        return 2 * cost.num_layers * (ALLREDUCE_LATENCY_S
                                      + 2 * (g - 1) / g * tokens * cost.hidden_size * 2 / cost.interconnect_bytes_per_s)

    def __call__(self, decodes: int, ctx_sum: float, prefill_tokens: float, prefill_attn: float,
                 prefill_ctx: float) -> float:
        """Seconds for a step of ``decodes`` decoding requests (total context ``ctx_sum``) plus prompt chunks of
        ``prefill_tokens`` tokens (causal attention FLOP weight ``prefill_attn`` = Σ chunk·(start + chunk/2), KV
        read ``prefill_ctx``)."""
        q = self.q
        dec_tokens = decodes * q
        tokens = dec_tokens + prefill_tokens
        weights = self.dense_weights if self.dense_weights is not None else self._weights(self.c, tokens)
        mem = (weights + (ctx_sum + prefill_ctx) * self.kv) * self.inv_bw
        comp = ((dec_tokens * self.flops + self.attn * q * ctx_sum) * self.inv_f_decode
                + (prefill_tokens * self.flops + self.attn * prefill_attn) * self.inv_f_prefill)
        p = self.p
        t = (self.fixed_prefill if prefill_tokens else self.fixed_decode) + self.layer_s \
            + (self.ar0 + self.ar1 * tokens if self.ar0 else 0.0) + smooth_max_s(mem, comp, p) \
            + self.fe_step + self.fe_seq * decodes
        if decodes and self.k:
            s = self.s
            t += s.verify_overhead_s + decodes * s.per_sequence_overhead_s
            if self.hot:  # rejection sampling at T > 0 (steptime.rejection_sampling_s)
                t += s.rejection_sampling_s_per_seq * decodes + s.rejection_sampling_s_per_draft * decodes * self.f * self.k
            if self.ragged:  # as speculation.evaluate_grid: uniform (a full CUDA graph) with probability f^B
                t += (1.0 - self.f ** decodes) * max(self.ragged - t, 0.0)
            t += self._drafter_s(decodes, ctx_sum / decodes)
        if prefill_tokens and self.draft is not None:  # the drafter prefills the prompt chunks too (compute)
            d = self.draft
            t += (prefill_tokens * d.flops_per_token + d.attn_flops_per_token_per_ctx * prefill_attn) \
                * self.inv_f_draft_prefill
        return t

    def _drafter_s(self, batch: int, ctx: float) -> float:
        """k drafter forwards per cycle (speculation.drafter_time_s), or host-side copy lookups (n-gram, suffix)."""
        if self.draft is None:  # (+ vLLM's in-line host step of copy speculation, uncalibrated: drafter_time_s)
            return batch * self.copy_s_per_seq + self.s.copy_sync_step_s
        d, ds = self.draft, self.draft_step
        mem = (self._weights(d, batch) + batch * ctx * d.kv_bytes_per_ctx_token) / (d.bandwidth_bytes_per_s
                                                                                     * ds.bandwidth_efficiency)
        comp = batch * (d.flops_per_token + d.attn_flops_per_token_per_ctx * ctx) / (d.peak_flops_per_s
                                                                                    * ds.compute_efficiency)
        p = ds.roofline_sharpness
        one = smooth_max_s(mem, comp, p) + d.num_layers * ds.per_layer_overhead_s + self._allreduce(d, batch)
        t = self.k * (ds.proposer_overhead_s + one)
        if self.catch_up:  # the first draft-model forward spans the k + 2 tokens just verified (drafter_time_s)
            t += float(forward_time_s(d, ds, batch, self.k + 2.0, ctx) - forward_time_s(d, ds, batch, 1.0, ctx))
        if self.hot:
            t += ds.draft_sampling_s_per_token * self.k * batch
        return t


# ----------------------------------------------------------------------------------------------- helpers
def _lengths(value: int | Sequence[int], n: int, name: str) -> np.ndarray:
    arr = np.full(n, int(value)) if np.isscalar(value) else np.asarray(value, dtype=int)
    if arr.shape != (n,):
        raise CostModelError(name, f"give one length or {n} lengths (one per request)")
    if arr.min(initial=1) < 1:
        raise CostModelError(name, "lengths must be >= 1")
    return arr


def _arrivals(traffic: Traffic, rng: np.random.Generator) -> np.ndarray:
    if traffic.arrival_s is not None:
        arr = np.asarray(traffic.arrival_s, dtype=float)
        if arr.ndim != 1 or len(arr) == 0 or np.any(np.diff(arr) < 0) or arr[0] < 0:
            raise CostModelError("arrival_s", "arrival times must be non-negative and non-decreasing")
        return arr
    rate = traffic.requests_per_second
    if rate is None or not rate > 0 or not math.isfinite(rate):
        raise CostModelError("requests_per_second", "must be > 0")
    return np.cumsum(rng.exponential(1.0 / rate, traffic.num_requests))


def decode_cycles(spec: SpecDecode | None, tokens_after_first: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Engine steps each request needs after its first token: one per token without speculation; with it, the
    first cycle count whose drawn tokens (per-cycle pmf of :meth:`SpecDecode.tokens_pmf`, or the request's own of
    ``SpecDecode.request_pmfs``) reach the output."""
    n = np.asarray(tokens_after_first, dtype=int)
    if spec is None or spec.k == 0 or len(n) == 0:
        return n.copy()
    values = np.arange(1, spec.k + 2)
    longest = int(n.max(initial=0))
    if longest == 0:
        return n.copy()
    if spec.request_pmfs:  # each request one measured request's pmf, uniformly
        pmfs = np.asarray(spec.request_pmfs, dtype=float)
        pmf = (pmfs / pmfs.sum(axis=1, keepdims=True))[rng.integers(len(pmfs), size=len(n))]  # (requests, k + 1)
        if len(n) * longest <= 400_000:  # exact: per-cycle draws (inverse CDF), cumulative, first crossing
            u = rng.random((len(n), longest))
            draws = 1 + (u[:, :, None] >= np.cumsum(pmf, axis=1)[:, None, :-1]).sum(axis=2)
            return np.where(n > 0, (np.cumsum(draws, axis=1) < n[:, None]).sum(axis=1) + 1, 0)
        mu, var = pmf @ values, pmf @ values ** 2 - (pmf @ values) ** 2
    else:
        pmf = spec.tokens_pmf()
        if len(n) * longest <= 400_000:  # exact: per-cycle draws, cumulative, first crossing
            draws = rng.choice(values, size=(len(n), longest), p=pmf)
            cycles = (np.cumsum(draws, axis=1) < n[:, None]).sum(axis=1) + 1
            return np.where(n > 0, cycles, 0)
        mu = float(pmf @ values)
        var = float(pmf @ values ** 2) - mu * mu
    draw = n / mu + rng.standard_normal(len(n)) * np.sqrt(n * var / mu ** 3)  # renewal CLT: N(n/μ, n·σ²/μ³)
    lo = np.ceil(n / values[-1])
    return np.where(n > 0, np.clip(np.round(draw), lo, n), 0).astype(int)


# ----------------------------------------------------------------------------------------------- simulation
def simulate(model: StepModel, limits: EngineLimits, traffic: Traffic, spec: SpecDecode | None = None) -> SimResult:
    """Run the scheduler over ``traffic``; per-request TTFT, TPOT and latency as vLLM's bench computes them."""
    if spec is not None and not 1 <= spec.k <= len(spec.per_position):
        raise CostModelError("speculator.num_speculative_tokens", "k must be in 1..len(per_position)")
    if limits.max_num_seqs < 1 or limits.max_num_batched_tokens < 1 or limits.kv_capacity_tokens < 1:
        raise CostModelError("limits", "max_num_seqs, max_num_batched_tokens and kv_capacity_tokens must be >= 1")
    rng = np.random.default_rng(traffic.seed)
    arrival = _arrivals(traffic, rng)
    n_req = len(arrival)
    if n_req > MAX_REQUESTS:
        raise CostModelError("num_requests", f"at most {MAX_REQUESTS} requests per simulation")
    prompt = _lengths(traffic.prompt_tokens, n_req, "prompt_tokens")
    output = _lengths(traffic.output_tokens, n_req, "output_tokens")
    k = spec.k if spec else 0
    block = limits.block_size
    cap = float(limits.kv_capacity_tokens)
    too_long = prompt + output + k > cap
    if np.any(too_long):
        raise CostModelError("workload.prompt_tokens", "a request's prompt + output exceeds the KV cache")
    cycles_needed = decode_cycles(spec, output - 1, rng)
    rate = np.where(cycles_needed > 0, (output - 1) / np.maximum(cycles_needed, 1), 0.0)  # tokens per cycle
    clock = _StepClock(model, spec)
    budget_max = limits.max_num_batched_tokens
    horizon = traffic.horizon_s if traffic.horizon_s is not None else math.inf

    arrival_l = arrival.tolist()
    latency = model.frontend_latency_s
    pending: list[tuple[float, int]] = []  # (when the scheduler sees it, id): requests still in the front end
    prompt_l, output_l = prompt.tolist(), output.tolist()
    cycles_l, rate_l = cycles_needed.tolist(), rate.tolist()
    first = [math.nan] * n_req
    finish = [math.nan] * n_req
    todo = [0] * n_req  # tokens still to prefill (prompt, or prompt + generated after a preemption)
    done_pf = [0] * n_req  # tokens of the current prefill already computed
    waiting: deque[int] = deque()
    prefilling: list[int] = []  # running, not yet decoding, in admission order
    decoding: dict[int, tuple[int, float, int]] = {}  # id -> (start cycle, context at start, finish cycle)
    heap: list[tuple[int, int]] = []  # (finish cycle, id)
    order: dict[int, int] = {}  # running id -> admission serial (preemption picks the newest)
    serial = 0
    t = 0.0
    cycle = 0  # decode steps so far (every decoding request advances one cycle per step)
    ctx_a, ctx_r = 0.0, 0.0  # Σ context over decoding requests = ctx_a + ctx_r·cycle
    kv_prefill = 0.0  # KV slots held by prefilling requests
    nxt = 0  # next arrival index
    steps = events = preemptions = 0
    batch_steps = 0.0
    out_tokens = 0
    saturated = False
    queue_bound = traffic.max_queue if traffic.max_queue is not None else math.inf

    def kv_decoding(at_cycle: float) -> float:
        b = len(decoding)
        return ctx_a + ctx_r * at_cycle + b * (k + block / 2.0)

    def start_decode(i: int) -> None:
        nonlocal ctx_a, ctx_r
        ctx0 = prompt_l[i] + (output_l[i] - 1 - remaining_tokens[i]) + 1
        decoding[i] = (cycle, ctx0, cycle + remaining_cycles[i])
        ctx_a += ctx0 - rate_l[i] * cycle
        ctx_r += rate_l[i]
        heapq.heappush(heap, (cycle + remaining_cycles[i], i))

    def stop_decode(i: int) -> None:
        nonlocal ctx_a, ctx_r
        start, ctx0, _ = decoding.pop(i)
        ctx_a -= ctx0 - rate_l[i] * start
        ctx_r -= rate_l[i]

    def next_event() -> float:
        """The next arrival at the front end, or the next request the front end hands to the scheduler."""
        raw = arrival_l[nxt] if nxt < n_req and arrival_l[nxt] <= horizon else math.inf
        return min(raw, pending[0][0]) if pending else raw

    def _stale(entry: tuple[int, int]) -> bool:
        state = decoding.get(entry[1])
        return state is None or state[2] != entry[0]

    remaining_cycles = list(cycles_l)
    remaining_tokens = [o - 1 for o in output_l]

    while True:
        # arrivals up to now join the queue
        while nxt < n_req and arrival_l[nxt] <= t and arrival_l[nxt] <= horizon:
            if latency:
                heapq.heappush(pending, (arrival_l[nxt] + latency, nxt))
            else:
                waiting.append(nxt)
            nxt += 1
        while pending and pending[0][0] <= t:
            waiting.append(heapq.heappop(pending)[1])
        running = len(prefilling) + len(decoding)
        if running == 0 and not waiting:
            upcoming = next_event()
            if upcoming == math.inf:
                break
            t = max(t, upcoming)
            continue
        if len(waiting) > queue_bound:  # the queue grows without end: this load is beyond the engine
            saturated = True
            break
        # --- decodes: KV for one more cycle; preempt the newest running request while it does not fit
        b = len(decoding)
        while b and kv_decoding(cycle + 1) + kv_prefill > cap:
            victim = max(order, key=order.__getitem__)
            preemptions += 1
            del order[victim]
            if victim in decoding:
                start = decoding[victim][0]
                done_cycles = cycle - start
                made = min(int(round(rate_l[victim] * done_cycles)), remaining_tokens[victim])
                stop_decode(victim)
                remaining_tokens[victim] -= made
                remaining_cycles[victim] = max(remaining_cycles[victim] - done_cycles, 1)
                todo[victim] = prompt_l[victim] + (output_l[victim] - 1 - remaining_tokens[victim])
            else:
                prefilling.remove(victim)
                kv_prefill -= done_pf[victim]
            done_pf[victim] = 0
            waiting.appendleft(victim)
            b = len(decoding)
        budget = budget_max - b * (1 + k)
        # --- prompt chunks: running prefills first, then new requests (FCFS)
        pf_tokens = pf_attn = pf_ctx = 0.0
        finishing: list[int] = []
        for i in prefilling:
            if budget <= 0:
                break
            chunk = min(todo[i] - done_pf[i], budget)
            pf_tokens += chunk
            pf_attn += chunk * (done_pf[i] + chunk / 2.0)
            pf_ctx += done_pf[i]
            done_pf[i] += chunk
            kv_prefill += chunk
            budget -= chunk
            if done_pf[i] >= todo[i]:
                finishing.append(i)
        while waiting and budget > 0 and len(prefilling) + len(decoding) < limits.max_num_seqs:
            i = waiting[0]
            chunk = min(todo[i] or prompt_l[i], budget)
            if kv_decoding(cycle + 1) + kv_prefill + chunk + block > cap:
                break
            waiting.popleft()
            if not todo[i]:
                todo[i] = prompt_l[i]
            serial += 1
            order[i] = serial
            prefilling.append(i)
            pf_tokens += chunk
            pf_attn += chunk * chunk / 2.0
            done_pf[i] = chunk
            kv_prefill += chunk
            budget -= chunk
            if chunk >= todo[i]:
                finishing.append(i)
        if saturated:
            break
        # --- one mixed step, or a stretch of identical decode steps
        ctx_now = ctx_a + ctx_r * cycle
        if pf_tokens:
            dt = clock(b, ctx_now, pf_tokens, pf_attn, pf_ctx)
            n = 1 if b else 0
        elif b:
            while heap and _stale(heap[0]):  # lazy deletion of preempted requests' entries
                heapq.heappop(heap)
            n = max(heap[0][0] - cycle, 1) if heap else 1
            upcoming = next_event()
            if not waiting and b < limits.max_num_seqs and upcoming < math.inf:
                dt0 = clock(b, ctx_now, 0.0, 0.0, 0.0)  # the next arrival can join: stop the stretch there
                n = max(1, min(n, math.ceil((upcoming - t) / dt0)))
            if ctx_r > 0:  # KV overflow ahead: stop the stretch there (preemption happens at the next step)
                room = cap - kv_prefill - (ctx_a + b * (k + block / 2.0))
                n_kv = int(room / ctx_r) - cycle
                n = max(1, min(n, n_kv))
            dt = n * clock(b, ctx_a + ctx_r * (cycle + n / 2.0), 0.0, 0.0, 0.0)
        else:
            dt, n = 0.0, 0
        if dt == 0.0 and not pf_tokens:  # nothing schedulable (KV full with only waiting requests): next arrival
            if next_event() < math.inf:
                t = max(t, next_event())
                continue
            saturated = True
            break
        t += dt
        steps += max(n, 1)
        events += 1
        batch_steps += b * n
        cycle += n
        # completions of decoding requests
        while heap and heap[0][0] <= cycle:
            entry = heapq.heappop(heap)
            if _stale(entry):
                continue
            i = entry[1]
            stop_decode(i)
            del order[i]
            finish[i] = t
            out_tokens += output_l[i]
        # prefills that completed this step emit their first token and start decoding
        for i in finishing:
            prefilling.remove(i)
            kv_prefill -= done_pf[i]
            done_pf[i] = 0
            todo[i] = 0
            if math.isnan(first[i]):
                first[i] = t
            if remaining_cycles[i] <= 0 or remaining_tokens[i] <= 0:
                del order[i]
                finish[i] = t
                out_tokens += output_l[i]
            else:
                start_decode(i)
        if t > horizon and not decoding and not prefilling:
            break

    first_a = np.array(first)
    finish_a = np.array(finish)
    arr_a = arrival
    skip = int(traffic.warmup_fraction * n_req)
    mask = ~np.isnan(finish_a)
    mask[:skip] = False
    if nxt < n_req and arrival_l[nxt] <= horizon or waiting or pending:
        saturated = True
    ttft = (first_a - arr_a)[mask]
    multi = mask & (output > 1)
    tpot = ((finish_a - first_a) / np.maximum(output - 1, 1))[multi]
    latency = (finish_a - arr_a)[mask]
    duration = float(np.nanmax(finish_a) - arrival[0]) if mask.any() else t
    return SimResult(ttft_s=ttft, tpot_s=tpot, latency_s=latency, finished=int((~np.isnan(finish_a)).sum()),
                     requests=n_req, duration_s=duration, output_tokens=out_tokens, steps=steps,
                     preemptions=preemptions, mean_decode_batch=batch_steps / max(cycle, 1), saturated=saturated,
                     events=events)


def pooled(runs: Sequence[SimResult]) -> SimResult:
    """Simulations of the same traffic with their own draws (accepted drafts, arrivals) as one: their requests'
    times pooled, their counts summed, saturated if any was."""
    if len(runs) == 1:
        return runs[0]
    first = runs[0]
    return replace(
        first, ttft_s=np.concatenate([r.ttft_s for r in runs]), tpot_s=np.concatenate([r.tpot_s for r in runs]),
        latency_s=np.concatenate([r.latency_s for r in runs]),
        **{f: sum(getattr(r, f) for r in runs) for f in ("finished", "requests", "duration_s", "output_tokens",
                                                         "steps", "preemptions", "events")},
        mean_decode_batch=float(np.mean([r.mean_decode_batch for r in runs])),
        saturated=any(r.saturated for r in runs), stats={})


# ----------------------------------------------------------------------------------------------- capacity
def kv_capacity_tokens(kv_space_gb: float, target_kv_bytes_per_token: int, draft_kv_bytes_per_token: int = 0) -> int:
    """KV slots = KV space / (target + drafter KV bytes per token) (design.md §3 "Memory")."""
    per_token = target_kv_bytes_per_token + draft_kv_bytes_per_token
    return int(kv_space_gb * GB // per_token) if per_token > 0 else 0


__all__ = ["EngineLimits", "SimResult", "SpecDecode", "StepModel", "Traffic", "decode_cycles", "kv_capacity_tokens",
           "simulate"]
