"""The speculative cycle, TPOT, request latency and speedup over a grid of (samples × concurrency × k).

T_cycle(B, k) = t_fixed + t_verify_extra + t_target(B, 1 + f·k·w) + t_draft(B, k) + B·t_seq   (design.md §3)
  (t_draft of a draft model: k forwards, the first over the k·w + 2 tokens just verified: vLLM's catch-up)
  (w = tree width: 1 for vLLM's chains; (verify tokens − 1)/k for SGLang/EAGLE/Medusa trees)
TPOT_spec = T_cycle / τ(k),  τ(k) = 1 + f·Σ_{i<k} r_i tokens per cycle       (design.md §2; f = drafting fraction)
L(B) = TTFT + (B − 1)·t_prefill_compute + (O − 1)·TPOT(B)   the first token comes from prefill; the other B−1
                                                          requests' prefills interleave with this request's decode
Queueing: at most B_max sequences are resident (KV capacity, max_num_seqs); with C > B_max clients the rest wait,
L(C) = L(B_max)·C/B_max (Little's law at the throughput B_max·O/L(B_max)).
Everything is vectorised: shape (S samples, nB concurrency points, nK draft lengths).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np
from scipy.special import ndtr

from .acceptance import cholesky_factor
from .memory import EMBEDDING_BYTES_PER_PARAM, MAX_NUM_BATCHED_TOKENS
from .steptime import (ForwardCost, draft_sampling_s, forward_time_s, prefill_compute_s, prefill_interleave_s,
                       prefill_time_s, rejection_sampling_s)
from .types import PrefillParams, StepTimeParams

MODEL_DRAFTERS = ("draft_model", "eagle", "eagle3", "mtp")
COPY_DRAFTERS = ("ngram", "suffix")
# Host-side proposer cost per sequence per step (vLLM V1 n-gram proposer: numba KMP over the prompt, ~10 µs;
# suffix trees (Arctic Inference) ~30 µs per lookup+update).
COPY_PROPOSER_S_PER_SEQ = {"ngram": 1.0e-5, "suffix": 3.0e-5}
MEDUSA_HEADS = 5  # Medusa-1 vicuna checkpoints ship 5 heads (Cai et al. 2024)
ZERO_COV = ((0.0, 0.0, 0.0),) * 3


@dataclass(frozen=True)
class CycleSetup:
    method: str
    target: ForwardCost
    draft: ForwardCost | None
    target_step: StepTimeParams
    draft_step: StepTimeParams
    target_prefill: PrefillParams
    draft_prefill: PrefillParams
    prompt_tokens: int
    output_tokens: int
    tree_width: float = 1.0  # tokens per sequence per draft level (1 = chain; tree: (verify tokens − 1) / depth)
    temperature: float = 0.0  # sampling temperature: rejection / draft sampling costs at T > 0
    # requests arrive apart (an arrival rate: a server's queue admits them one by one), so the others' prompts ride in
    # this request's decode steps (steptime.prefill_interleave_s); False: a batch of requests that start together
    # (a stated concurrency, as the closed loops measure it), whose prompts are prefilled before the decode
    staggered: bool = False

    @property
    def decode_context_tokens(self) -> float:
        return self.prompt_tokens + self.output_tokens / 2.0  # mean context over the decode


@dataclass(frozen=True)
class StepSamples:
    """Step-time parameter draws, shape (S, 1, 1); row 0 = point estimate."""

    eta_bw: np.ndarray
    eta_f: np.ndarray
    fixed_s: np.ndarray
    # multiplicative draws of the verify, per-drafter-forward and per-sequence overheads (log-normal, median 1)
    verify_scale: np.ndarray | float = 1.0
    proposer_scale: np.ndarray | float = 1.0
    sequence_scale: np.ndarray | float = 1.0
    eager_drafter: np.ndarray | float = 0.0  # 1 where the drafter runs without CUDA graphs
    # multiplicative draws of the whole baseline step and speculative cycle: the calibration's timing residual
    base_scale: np.ndarray | float = 1.0
    cycle_scale: np.ndarray | float = 1.0

    def with_overheads(self, target: StepTimeParams, draft: StepTimeParams, std_normal: np.ndarray) -> StepSamples:
        """Log-normal draws of the overheads (σ from the parameters) and whether the drafter runs eagerly (with the
        draft's eager_probability), from std_normal (S, ≥ 4); row 0 = the point estimate (median, graph-captured).
        The proposer's is two-piece when ``proposer_overhead_log_std_low`` is set: σ_low below the point estimate,
        ``proposer_overhead_log_std`` above it, half the draws on each side."""
        z = np.array(std_normal, dtype=float)
        z[0] = 0.0
        shape = (z.shape[0], 1, 1)
        sigma = np.array([target.verify_overhead_log_std, draft.proposer_overhead_log_std,
                          target.per_sequence_overhead_log_std])
        scale = np.exp(z[:, :3] * sigma)
        # two-piece normal in ln joined at the median (σ₁·z for z ≤ 0, σ₂·z above; half the draws each side), cf. the
        # split normal of John 1982 (Commun. Stat. 11:879) / Wallis 2014 (Stat. Sci. 29:106), joined at the mode
        if draft.proposer_overhead_log_std_low is not None:
            low = z[:, 1] <= 0
            scale[low, 1] = np.exp(z[low, 1] * draft.proposer_overhead_log_std_low)
        eager = (ndtr(z[:, 3]) < draft.eager_probability).astype(float)
        eager[0] = 0.0
        return replace(self, verify_scale=scale[:, 0].reshape(shape), proposer_scale=scale[:, 1].reshape(shape),
                       sequence_scale=scale[:, 2].reshape(shape), eager_drafter=eager.reshape(shape))

    def with_timing_spread(self, params: StepTimeParams, std_normal: np.ndarray) -> StepSamples:
        """Log-normal draws (σ = ``params.timing_rms_rel``) of the baseline step and of the speculative cycle, from
        std_normal (S, 2), independent: each is a fitted time that lands that far from its measurement run to run
        (the fit's rms relative residual); row 0 = the point estimate."""
        if params.timing_rms_rel <= 0:
            return self
        z = np.array(std_normal, dtype=float)
        z[0] = 0.0
        scale = np.exp(params.timing_rms_rel * z).reshape(z.shape[0], 1, 2)
        return replace(self, base_scale=scale[:, :, :1], cycle_scale=scale[:, :, 1:])

    @staticmethod
    def point(params: StepTimeParams) -> StepSamples:
        one = np.ones((1, 1, 1))
        return StepSamples(one * params.bandwidth_efficiency, one * params.compute_efficiency,
                           one * params.fixed_overhead_s)

    @staticmethod
    def sample(params: StepTimeParams, samples: int, rng: np.random.Generator) -> StepSamples:
        return StepSamples.from_normals(params, rng.standard_normal((samples, 3)))

    @staticmethod
    def from_normals(params: StepTimeParams, std_normal: np.ndarray) -> StepSamples:
        """sample() given the standard-normal draws, shape (S, 3)."""
        mean = np.array([params.bandwidth_efficiency, params.compute_efficiency, params.fixed_overhead_s])
        cov = np.asarray(params.covariance or ZERO_COV, dtype=float)
        draws = mean + std_normal @ cholesky_factor(cov, 1e-18).T
        draws[0] = mean
        if cov[2, 2] > 0:  # a negative fixed overhead is projected onto 0 along its regression on the efficiencies
            short = np.minimum(draws[:, 2], 0.0)  # (conditioning on the bound keeps the fitted trade-off, e.g.
            draws[:, :2] -= short[:, None] * (cov[:2, 2] / cov[2, 2])  # η_bw vs fixed overhead at B = 1, which
            draws[:, 2] -= short  # clipping alone breaks: Rao, Linear Statistical Inference, §8a.2)
        np.minimum(np.maximum(draws[:, :2], 0.05, out=draws[:, :2]), 1.0, out=draws[:, :2])  # == np.clip
        np.maximum(draws[:, 2], 0.0, out=draws[:, 2])
        shape = (std_normal.shape[0], 1, 1)
        return StepSamples(draws[:, 0].reshape(shape), draws[:, 1].reshape(shape), draws[:, 2].reshape(shape))


@dataclass(frozen=True)
class Grid:
    """Results over (S, nB[, nK]). Times in seconds."""

    batch: np.ndarray  # (nB,)
    ks: np.ndarray  # (nK,)
    al: np.ndarray  # (S, 1, nK) mean acceptance length over drafted steps, vLLM's 1 + A/N = 1 + Σ_{i<k} r_i
    tokens_per_cycle: np.ndarray  # (S, 1, nK) τ = 1 + f·Σ_{i<k} r_i, over all cycles (f = drafting fraction)
    step_base_s: np.ndarray  # (S, nB, 1) target decode step
    cycle_s: np.ndarray  # (S, nB, nK)
    verify_s: np.ndarray  # (S, nB, nK) target forward over 1+f·k tokens incl. verify overhead
    draft_s: np.ndarray  # (S, nB, nK)
    tpot_base_s: np.ndarray  # (S, nB, 1)
    tpot_spec_s: np.ndarray  # (S, nB, nK)
    ttft_base_s: np.ndarray  # (S, 1, 1)
    ttft_spec_s: np.ndarray  # (S, 1, 1)
    prefill_interleave_base_s: np.ndarray  # (S, nB, 1)
    prefill_interleave_spec_s: np.ndarray  # (S, nB, K)
    latency_base_s: np.ndarray  # (S, nB, 1)
    latency_spec_s: np.ndarray  # (S, nB, nK)
    per_position: np.ndarray | None = None  # (S, K_max) the r_i the grid was evaluated with

    @property
    def speedup(self) -> np.ndarray:
        return self.latency_base_s / self.latency_spec_s


def medusa_heads_time_s(target: ForwardCost, batch, eta_bw) -> np.ndarray:
    """One pass of Medusa heads: each head = ResBlock (h²) + lm_head (V·h), read once per cycle."""
    h, v = target.hidden_size, target.model.vocab_size
    bytes_read = MEDUSA_HEADS * (h * h + v * h) * EMBEDDING_BYTES_PER_PARAM / target.gpu_count
    flops = 2.0 * np.asarray(batch, dtype=float) * MEDUSA_HEADS * (h * h + v * h) / target.gpu_count
    return np.maximum(bytes_read / (target.bandwidth_bytes_per_s * eta_bw), flops / target.peak_flops_per_s)


def drafter_time_s(setup: CycleSetup, batch: np.ndarray, ks: np.ndarray, ctx: float,
                   samples: StepSamples, draft_fraction: np.ndarray) -> np.ndarray:
    """Drafter cost per cycle: k sequential drafter forwards (models/heads), one Medusa pass, or host lookups."""
    ds = setup.draft_step
    if setup.method in MODEL_DRAFTERS and setup.draft is not None:
        one = forward_time_s(setup.draft, ds, batch, setup.tree_width, ctx, eta_bw=samples.eta_bw, eta_f=samples.eta_f)
        eager = samples.eager_drafter * ds.eager_layer_overhead_s * setup.draft.num_layers
        per_forward = ds.proposer_overhead_s * samples.proposer_scale + eager + one
        total = ks * per_forward
        if ds.draft_sampling_s_per_token:  # (0 by default: the term is 0.0 everywhere, and t + 0.0 == t)
            total = total + draft_sampling_s(ds, ks * batch * setup.tree_width, setup.temperature)
        if setup.method == "draft_model":
            # catch-up: the cycle's first draft-model forward runs over every token the target just verified plus
            # the sampled one, k·w + 2 per sequence, not 1 (vLLM DraftModelProposer: llm_base_proposer.propose /
            # set_inputs_first_pass with the padded drafter batch, vLLM ≥ 0.12)
            wide = forward_time_s(setup.draft, ds, batch, ks * setup.tree_width + 2.0, ctx, eta_bw=samples.eta_bw,
                                  eta_f=samples.eta_f)
            total = total + wide - one
        return total
    if setup.method == "medusa":
        heads = medusa_heads_time_s(setup.target, batch, samples.eta_bw)
        return ds.proposer_overhead_s * samples.proposer_scale + heads + 0.0 * ks
    lookups = batch * COPY_PROPOSER_S_PER_SEQ.get(setup.method, 0.0)
    sync = setup.target_step.copy_sync_step_s  # (0 unless the timing is vLLM's uncalibrated default: no term then)
    if sync:
        lookups = lookups + sync * samples.verify_scale
    return lookups + 0.0 * ks * draft_fraction


def _scaled(x, scale):
    """x · scale; a scale of exactly 1.0 (no spread drawn) leaves x as it is, which is what the product gives."""
    return x if isinstance(scale, float) and scale == 1.0 else x * scale


def _rows(x, rows: int) -> np.ndarray:
    x = np.asarray(x)
    if x.shape == (rows, 1, 1):
        return x
    out = np.empty((rows, 1, 1))  # x on every row (a copy: faster than broadcast_to's view)
    out[...] = x
    return out


def _spec_prefill(setup: CycleSetup, ttft_base, inter_target, b: np.ndarray, samples: StepSamples):
    """Own TTFT and the others' interleaved prefills with speculation (``inter_target``: the target's, riding in the
    verify steps): a drafter model prefills the prompt too."""
    if setup.method in MODEL_DRAFTERS and setup.draft is not None and setup.output_tokens > 1:
        # (one output token: the request ends at prefill, the drafter never proposes for it)
        p = setup.prompt_tokens
        ttft_spec = ttft_base + prefill_time_s(setup.draft, setup.draft_prefill, setup.draft_step, p) \
            - setup.draft_prefill.fixed_overhead_s  # same engine step: one fixed overhead
        inter_spec = inter_target + (b - 1.0) * prefill_compute_s(setup.draft, p, samples.eta_f)
        return ttft_spec, inter_spec
    return ttft_base, inter_target


def evaluate_grid(setup: CycleSetup, batch: np.ndarray, ks: np.ndarray, per_position: np.ndarray,
                  draft_fraction: np.ndarray, samples: StepSamples,
                  drafters: tuple[CycleSetup, ...] | None = None) -> Grid:
    """per_position: (S, K_max) r_i samples; draft_fraction: (S,) fraction of steps that draft.

    ``drafters`` (methods compared side by side): one CycleSetup per row of ``per_position``, all on ``setup``'s
    target, prompt and output; row i then uses drafters[i]'s method, drafter and tree width (``samples`` must be a
    point estimate). Each row gives exactly what a separate call with ``setup=drafters[i]`` would give.
    """
    batch = np.asarray(batch, dtype=float)
    nb, nk = batch.shape[0], len(ks)
    b = batch.reshape(1, -1, 1)
    k = np.asarray(ks, dtype=float).reshape(1, 1, -1)
    f = np.asarray(draft_fraction, dtype=float).reshape(-1, 1, 1)
    rows = per_position.shape[0]
    ctx = setup.decode_context_tokens
    ts = setup.target_step
    cum = np.zeros((rows, per_position.shape[1] + 1))  # Σ_{i<j} r_i for j = 0..K_max
    per_position.cumsum(axis=1, out=cum[:, 1:])
    al = 1.0 + cum[:, np.asarray(ks, dtype=int)][:, None, :]  # AL(k) = 1 + Σ_{i<k} r_i over drafted steps
    tokens = 1.0 + f * (al - 1.0)  # τ(k) = 1 + f·Σ_{i<k} r_i per cycle

    if drafters is None:
        width = setup.tree_width
    else:
        if len(drafters) != rows:
            raise ValueError("one drafter setup per row of per_position")
        widths = {d.tree_width for d in drafters}  # one width for every row (chains): a scalar broadcasts the same
        width = widths.pop() if len(widths) == 1 else np.array([d.tree_width for d in drafters]).reshape(-1, 1, 1)
    # One target forward pass over q = 1 (decode) and q = 1 + f·k·w (verify, per k): shape (rows, nB, 1 + nK).
    q = np.empty((rows, 1, 1 + nk))
    q[:, :, 0] = 1.0
    np.add(1.0, f * k * width, out=q[:, :, 1:])
    fwd = forward_time_s(setup.target, ts, b, q, ctx, eta_bw=samples.eta_bw, eta_f=samples.eta_f)
    step_base = _scaled(samples.fixed_s + fwd[:, :, :1], samples.base_scale)
    # Prefill: own TTFT, plus the others' prompts. A batch that starts together prefills them before its decode
    # (compute only). Requests that arrive apart have them ride in this request's decode steps (baseline) or verify
    # steps (speculation: fewer steps, each carrying more), priced under the steps' roofline.
    p = setup.prompt_tokens
    prefill_eta_f = setup.target_prefill.compute_efficiency * samples.eta_f / ts.compute_efficiency
    ttft_base = prefill_time_s(setup.target, setup.target_prefill, ts, p, eta_f=prefill_eta_f)
    decode_tokens = setup.output_tokens - 1  # the first output token comes from prefill
    if setup.staggered and decode_tokens > 0:
        chunk_s = max(setup.target_prefill.fixed_overhead_s - ts.fixed_overhead_s, 0.0)  # a step carrying a chunk
        inter_base = prefill_interleave_s(setup.target, ts, b, 1.0, ctx, decode_tokens, p, samples.eta_bw,
                                          samples.eta_f, prefill_eta_f, chunk_s, MAX_NUM_BATCHED_TOKENS)
        inter_target = prefill_interleave_s(setup.target, ts, b, q[:, :, 1:], ctx, decode_tokens / tokens, p,
                                            samples.eta_bw, samples.eta_f, prefill_eta_f, chunk_s,
                                            MAX_NUM_BATCHED_TOKENS)  # (rows, nB, nK)
    else:
        inter_base = (b - 1.0) * prefill_compute_s(setup.target, p, samples.eta_f)
        inter_target = np.empty((rows, nb, nk))  # inter_base on every row and k (faster than broadcast_to's view)
        inter_target[...] = inter_base
    if drafters is None:
        draft = drafter_time_s(setup, b, k, ctx, samples, f)
        ttft_spec, inter_spec = _spec_prefill(setup, ttft_base, inter_target, b, samples)
    else:  # one row per method: the drafter terms row by row, the target terms vectorised over rows
        draft, ttft_spec, inter_spec = np.empty((rows, nb, nk)), np.empty((rows, 1, 1)), np.empty((rows, nb, nk))
        for i, d in enumerate(drafters):  # row assignment broadcasts each row's (1, ·, ·) result
            draft[i] = drafter_time_s(d, b, k, ctx, samples, f[i:i + 1])[0]
            ttft_spec[i], inter_spec[i] = _spec_prefill(d, ttft_base, inter_target[i:i + 1], b, samples)
    verify = ts.verify_overhead_s * samples.verify_scale + fwd[:, :, 1:]
    if ts.rejection_sampling_s_per_seq or ts.rejection_sampling_s_per_draft:  # + sampling at T > 0: per sequence
        verify = verify + rejection_sampling_s(ts, b, b * f * k * width, setup.temperature)  # and per draft position
    if ts.ragged_step_s:  # (0 unless a graph engine's calibration timed it: the term is then absent)
        # a step is uniform (a full CUDA graph) when every sequence drafted, P = f^B for sequences drafting apart;
        # any other step runs piecewise graphs: max(its uniform price, the host-bound floor) (vLLM's
        # CudagraphDispatcher: FULL only for uniform decode batches of 1 + k query tokens)
        uniform = f ** b
        verify = verify + (1.0 - uniform) * np.maximum(ts.ragged_step_s - (samples.fixed_s + verify), 0.0)
    cycle = _scaled(samples.fixed_s + verify + draft + _scaled(b * ts.per_sequence_overhead_s, samples.sequence_scale),
                    samples.cycle_scale)
    tpot_base = step_base
    tpot_spec = cycle / tokens

    latency_base = ttft_base + inter_base + decode_tokens * tpot_base
    latency_spec = ttft_spec + inter_spec + decode_tokens * tpot_spec
    return Grid(batch=batch, ks=np.asarray(ks), al=al, tokens_per_cycle=tokens, step_base_s=step_base,
                cycle_s=cycle, verify_s=verify, draft_s=draft, tpot_base_s=tpot_base, tpot_spec_s=tpot_spec,
                ttft_base_s=_rows(ttft_base, rows), ttft_spec_s=_rows(ttft_spec, rows),
                prefill_interleave_base_s=inter_base, prefill_interleave_spec_s=inter_spec,
                latency_base_s=latency_base, latency_spec_s=latency_spec, per_position=per_position)


def stack_grids(first: Grid, rest: Grid) -> Grid:
    """Two grids over the same batches and k as one, ``rest``'s rows after ``first``'s (rows evaluated apart)."""
    if not (np.array_equal(first.batch, rest.batch) and np.array_equal(first.ks, rest.ks)):
        raise ValueError("stacked grids must share their batches and k")
    changes = {}
    for f in fields(Grid):
        a, b = getattr(first, f.name), getattr(rest, f.name)
        if f.name not in ("batch", "ks") and a is not None:
            changes[f.name] = np.concatenate((a, b), axis=0)
    return replace(first, **changes)


def queued(grid: Grid, resident_base: float, resident_spec: float) -> Grid:
    """The grid as a function of offered concurrency C when at most ``resident_*`` sequences fit (KV capacity,
    max_num_seqs): each mode runs min(C, B_max) sequences and the rest queue, L(C) = L(B)·C/B with B = min(C, B_max).
    ``grid.batch`` must contain both caps where they are below its largest point."""
    c = grid.batch

    def at(cap: float) -> tuple[np.ndarray, np.ndarray] | None:
        if max(cap, 1.0) >= c[-1]:  # no point beyond the cap: the grid is unchanged (L·1.0 = L exactly)
            return None
        b = np.minimum(c, max(cap, 1.0))
        idx = c.searchsorted(b)
        return idx, (c / b).reshape(1, -1, 1)

    base, spec = at(resident_base), at(resident_spec)
    changes = {}
    if base is not None:
        ib, wait_b = base
        changes.update(step_base_s=grid.step_base_s[:, ib], tpot_base_s=grid.tpot_base_s[:, ib],
                       prefill_interleave_base_s=grid.prefill_interleave_base_s[:, ib],
                       latency_base_s=grid.latency_base_s[:, ib] * wait_b)
    if spec is not None:
        is_, wait_s = spec
        changes.update(cycle_s=grid.cycle_s[:, is_], verify_s=grid.verify_s[:, is_], draft_s=grid.draft_s[:, is_],
                       tpot_spec_s=grid.tpot_spec_s[:, is_],
                       prefill_interleave_spec_s=grid.prefill_interleave_spec_s[:, is_],
                       latency_spec_s=grid.latency_spec_s[:, is_] * wait_s)
    return replace(grid, **changes) if changes else grid
