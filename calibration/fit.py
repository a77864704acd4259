"""Fit the cost model's parameters to calibration measurements (design.md §3-§4).

Input: stored measurement records ``{"probe": str, "params": {"engine": {...}}, "values": {...}}`` (the
probe dataclasses of :mod:`calibration.probes` minus ``probe``/``engine``/``environment``; a bare
``dataclasses.asdict`` dict or the dataclass itself is accepted too).

- :func:`fit_step_time` -- weighted least squares (``scipy.optimize.least_squares``) of the decode (q = 1) and
  verify (q = k + 1) step times against batch size, through the cost model's own
  :func:`advisor.costmodel.steptime.step_time_from_cost`, so the fit and the prediction share one formula.
  Free: ``bandwidth_efficiency``, ``compute_efficiency``, ``fixed_overhead_s``; ``verify_overhead_s`` when
  there are verify and decode points; ``roofline_sharpness`` when the points span the memory→compute
  crossover; ``per_layer_overhead_s`` when the records cover several layer counts (e.g. a truncated copy: it is
  otherwise indistinguishable from ``fixed_overhead_s``); ``proposer_overhead_s`` when whole draft-model cycles
  were timed; ``rejection_sampling_s_per_seq`` when verify steps were timed at T = 0 and T > 0, and
  ``rejection_sampling_s_per_draft`` when those at T > 0 include steps that drafted nothing (q = 1);
  ``draft_sampling_s_per_token`` when draft-model cycles were timed at T > 0; ``per_sequence_overhead_s`` when an
  EAGLE-path head's cycles were timed at two batch sizes or more (``HEAD_METHODS``).
- :func:`fit_prefill` -- ``PrefillParams`` (compute efficiency, fixed overhead) from time-to-first-token over
  prompt lengths, through :func:`advisor.costmodel.steptime.prefill_time_s`.
- :func:`fit_acceptance` -- ``AcceptanceModel``: logistic conditional acceptance ``c_i(T) = sigmoid(a + b·i +
  c·T)`` by maximum likelihood on vLLM's per-position counters (binomial: a_i accepted of a_{i-1} reaching
  position i, a_{-1} = N drafts), with a weak Gaussian prior (keeps perfectly separated data, e.g. a model
  drafting for itself, finite); covariance = inverse of (Fisher information + prior precision), inflated by
  the Pearson over-dispersion when prompts vary more than binomially. ``draft_fraction`` = drafts / decode
  steps (logistic in T too: ``draft_fraction_logit`` / ``draft_fraction_temperature_slope``).
- :func:`fit_run` -- all of the above for one calibration run -> fit records ``{"kind", "key", "params",
  "residuals"}`` as ``advisor.services.calibrations.to_calibration`` reads them back; :func:`summary` rates them.

Residuals of timing fits are relative ((predicted − measured) / measured); of acceptance fits, relative AL.
Covariances are ``s²(JᵀJ)⁻¹`` with s² the residual variance (data rows) -- see :class:`FitResult`.
"""
from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, Iterable, Sequence

import numpy as np
from scipy.optimize import brentq, least_squares, minimize

from advisor.costmodel.speculation import COPY_DRAFTERS
from advisor.costmodel.acceptance import DRAFT_FRACTION_REF_TOKENS, OUTPUT_EXTRAPOLATION, draft_fraction_at
from advisor.costmodel.memory import engine_kv_cache_dtype, engine_weights_dtype
from advisor.costmodel.steptime import (default_prefill_params, default_step_time_params, forward_cost,
                                        draft_sampling_s, prefill_compute_s, rejection_sampling_s, step_time_from_cost,
                                        tp_allreduce_s, weight_bytes_read)
from advisor.costmodel.types import (AcceptanceModel, GpuSpec, ModelSpec, PrefillParams, StepTimeParams,
                                     acceptance_key)

SOURCE = "calibration"
# Drafters that vLLM 0.24 runs on the EAGLE path (Model Runner V2, async scheduling): their cycles at several batch
# sizes determine the per-sequence host cost of a cycle, which that path does not pay (every head's fit reads 0; the
# default 20 us charged a cycle of 256 sequences 5 ms and bent the fits' compute efficiency up: docs/gpu-closed-loop.md
# "The heads' per-sequence cost, fitted"). The V1 path's draft-model and n-gram cycles keep the default: freed there,
# their thirteen calibrations predicted their leases no better (a mean 15.3 -> 15.7 %).
HEAD_METHODS = ("eagle", "eagle3", "mtp")
STEP_COV_FIELDS = ("bandwidth_efficiency", "compute_efficiency", "fixed_overhead_s")  # StepTimeParams.covariance
PREFILL_COV_FIELDS = ("compute_efficiency", "fixed_overhead_s")  # PrefillParams.covariance
BOUNDS: dict[str, tuple[float, float]] = {
    "bandwidth_efficiency": (0.02, 1.0),
    "compute_efficiency": (0.02, 1.0),
    "fixed_overhead_s": (0.0, 1.0),
    "per_layer_overhead_s": (0.0, 0.05),
    "verify_overhead_s": (0.0, 1.0),
    "per_sequence_overhead_s": (0.0, 0.1),
    "proposer_overhead_s": (0.0, 1.0),
    "rejection_sampling_s_per_seq": (0.0, 0.1),
    "rejection_sampling_s_per_draft": (0.0, 0.1),
    "draft_sampling_s_per_token": (0.0, 0.1),
    "roofline_sharpness": (1.0, 8.0),
}
# Prefill's compute efficiency is measured against the catalog's bf16 peak. A host that computes more than that peak
# fits above 1 rather than pinning at it: the Xeon hosts of serving runs E-M (AMX tiles, under "CPU-2core", whose peak
# counts a Zen 4's vector units) fit 1.6-2.2 with 9-14 % rms, where the bound 1.0 left 40-96 %. The run's page says
# when the catalog row understates the host (advisor.reports.calibration_findings).
PREFILL_COMPUTE_EFFICIENCY_MAX = 4.0
# Weak priors (relative std around the catalog/engine default) on the efficiencies only: they keep η_bw and
# t_fixed apart when one model at one context cannot (decode time = t_fixed + W/(BW·η_bw)). Overheads get no
# prior: CPU and eager engines are 10-100× above the CUDA-graph defaults.
EFFICIENCY_PRIOR_REL_STD = 0.5
MIN_REL_NOISE = 0.005  # floor of the estimated relative noise (a perfect synthetic fit keeps a finite covariance)
ACCEPTANCE_PRIOR_STD = np.array([4.0, 1.0, 2.0])  # weak prior on (a, b, c) around 0
UNFIT_TEMPERATURE_SLOPE_STD = 0.5  # when all drafts ran at one temperature: c = 0 with this (logit) std
LOGIT_BOUND = 12.0
# |slope| of the acceptance logit in ln(output tokens) at most (SmolLM2's n-gram cells: -0.19 to +0.76 on the CPU
# build, +0.10 to +0.76 on an H100): a checkpoint of few drafts cannot swing a long output's answer further
ACCEPTANCE_OUTPUT_SLOPE_BOUND = 2.0
# ... and fitted only from checkpoints that drafted this often in all (fewer: one AL for every output, as before). A
# cell's AL over n drafts moves by about 1.2 / √n tokens between samples: ±0.15 at 60, against the 30 % json gained
# from 60 to 104 output tokens (the plan's cells: 89-306 drafts per structure on the CPU build and an H100).
ACCEPTANCE_OUTPUT_SLOPE_MIN_DRAFTS = 60


# --------------------------------------------------------------------------------------------- records
@dataclass(frozen=True)
class Record:
    probe: str
    engine: dict
    values: dict


def normalize(record: Any) -> Record:
    """Stored record, ``asdict`` dict or probe dataclass -> :class:`Record`."""
    if isinstance(record, Record):
        return record
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        record = dataclasses.asdict(record)
    if "values" in record:
        engine = (record.get("params") or {}).get("engine") or {}
        return Record(str(record["probe"]), dict(engine), dict(record["values"]))
    values = {k: v for k, v in record.items() if k not in ("probe", "engine", "environment")}
    return Record(str(record["probe"]), dict(record.get("engine") or {}), values)


def _records(records: Iterable[Any], probe: str, model_path: str | None = None) -> list[Record]:
    out = [normalize(r) for r in records]
    out = [r for r in out if r.probe == probe]
    if model_path is not None:
        out = [r for r in out if r.engine.get("model") in (None, model_path)]
    return out


def model_paths(records: Iterable[Any]) -> list[str]:
    """Distinct engine model paths among timing records (most records first)."""
    counts: dict[str, int] = defaultdict(int)
    for r in map(normalize, records):
        if r.probe in ("step_time", "prefill") and r.engine.get("model"):
            counts[r.engine["model"]] += 1
    return sorted(counts, key=lambda p: -counts[p])


# --------------------------------------------------------------------------------------------- results
@dataclass
class FitResult:
    """A fit: ``params`` (the cost-model dataclass, ``source="calibration"``), the covariance over ``free``
    (in that order), residuals per point, and the quality of fit."""

    params: Any
    covariance: list[list[float]]
    residuals: list[float]
    n_points: int
    rmse_rel: float
    free: tuple[str, ...] = ()
    points: list[dict] = field(default_factory=list)  # measured vs predicted per point (for reports)

    def std(self) -> dict[str, float]:
        return {name: float(math.sqrt(max(self.covariance[i][i], 0.0))) for i, name in enumerate(self.free)}


def _rel_noise(res: np.ndarray, n_free: int) -> float:
    dof = max(len(res) - n_free, 1)
    return max(float(np.sqrt(np.sum(res ** 2) / dof)), MIN_REL_NOISE)


def _wls(fun, x0: np.ndarray, lower: np.ndarray, upper: np.ndarray, prior_mean: np.ndarray,
         prior_std: np.ndarray, n_data: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weighted least squares: data residuals (relative) / σ plus prior rows (x − μ)/σ_prior (σ_prior = inf: none).

    Two passes: σ = 5 %, then σ = the data's own rms. Returns x, covariance (JᵀJ)⁻¹ of the weighted system,
    and the data residuals at x.
    """
    has_prior = np.isfinite(prior_std)

    def weighted(x: np.ndarray, sigma: float) -> np.ndarray:
        rows = [fun(x) / sigma]
        if has_prior.any():
            rows.append((x[has_prior] - prior_mean[has_prior]) / prior_std[has_prior])
        return np.concatenate(rows)

    x = np.clip(x0, lower, upper)
    sigma = 0.05
    for _ in range(2):
        sol = least_squares(weighted, x, bounds=(lower, upper), args=(sigma,), x_scale="jac", method="trf",
                            xtol=1e-12, ftol=1e-12, gtol=1e-12, max_nfev=2000)
        x = sol.x
        res = fun(x)
        sigma = _rel_noise(res, len(x) - int(has_prior.sum()))
    sol = least_squares(weighted, x, bounds=(lower, upper), args=(sigma,), x_scale="jac", method="trf",
                        xtol=1e-12, ftol=1e-12, gtol=1e-12, max_nfev=2000)
    x = sol.x
    jac = _jacobian(lambda z: weighted(z, sigma), x, lower, upper)
    cov = np.linalg.pinv(jac.T @ jac)
    return x, cov, fun(x)


def _jacobian(f, x: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """Central differences (one-sided at a bound) with steps relative to each parameter's scale."""
    f0 = f(x)
    jac = np.empty((len(f0), len(x)))
    for j in range(len(x)):
        h = 1e-5 * max(abs(x[j]), 1e-6)
        lo, hi = max(x[j] - h, lower[j]), min(x[j] + h, upper[j])
        xa, xb = x.copy(), x.copy()
        xa[j], xb[j] = lo, hi
        jac[:, j] = (f(xb) - f(xa)) / (hi - lo)
    return jac


# --------------------------------------------------------------------------------------------- step time
@dataclass(frozen=True)
class StepPoint:
    """One timed step. ``kind``: "step" (decode q = 1, or verify q = k + 1 of a free proposer) or "cycle" (a whole
    speculative cycle of a draft model: k drafter forwards + one verify over k + 1 tokens)."""

    kind: str
    model: ModelSpec
    draft: ModelSpec | None
    batch: float
    q: float
    k: int
    context: float
    seconds: float
    temperature: float = 0.0
    method: str = "draft_model"  # cycles: the drafter's method (a model drafter, or a copy drafter: ngram, suffix)
    draft_fraction: float = 1.0  # cycles: share of steps that drafted (copy drafters find no match otherwise)
    gpu_count: int = 1  # the engine's tensor-parallel size: weights, KV and FLOPs split over it, plus all-reduces
    samples: tuple[float, ...] = ()  # the probe's repeated timings of this point (``step_s_samples``; older: none)
    kv_cache_dtype: str = "auto"  # the engine's KV-cache dtype (the attention's bytes per context token)

    @property
    def drafter_forwards(self) -> bool:
        """A whole cycle of a model drafter (draft model, EAGLE, MTP): its drafter runs forwards."""
        return self.kind == "cycle" and self.draft is not None


def _tp(r: Record) -> int:
    return max(1, int(r.engine.get("tensor_parallel_size") or 1))


def _kv(r: Record) -> str:
    return engine_kv_cache_dtype(r.engine) or "auto"


def _spec_method(r: Record) -> str | None:
    spec = r.engine.get("speculative_config") or None
    return spec.get("method") if isinstance(spec, dict) else None


def step_points(records: Iterable[Any], model: ModelSpec, model_path: str | None = None,
                models: dict[str, ModelSpec] | None = None,
                kinds: Sequence[str] = ("step", "cycle")) -> list[StepPoint]:
    """Step-time records of these ``kinds`` -> points. Records of ``model_path`` (or of any path not in ``models``)
    are ``model``'s; ``models`` maps other checkpoints' paths to their specs (joint fit). A draft-model engine's
    records are spec cycles; its drafter is the target itself when the draft path is the target's ("self"). The
    uniform fit leaves out steps in which only some sequences draft: "mixed" and "text_cycle"
    (:func:`ragged_points`)."""
    models = models or {}
    out = []
    for r in _records(records, "step_time"):
        v = r.values
        if not v.get("step_s") or v["step_s"] <= 0 or v.get("kind", "step") not in kinds:
            continue
        path = r.engine.get("model")
        if path in models:
            m = models[path]
        elif model_path is None or path in (None, model_path):
            m = model
        else:
            continue
        steps = float(v.get("steps") or 0.0)
        batch, q = float(v["batch_size"]), float(v.get("q", 1))
        temp = float(v.get("temperature") or 0.0)
        ctx = float(v.get("context_len", 0)) + 1.0 + steps / 2.0  # mean context: prompt + half the decode
        method = _spec_method(r)
        samples = tuple(float(x) for x in (v.get("step_s_samples") or ()) if x and x > 0)
        if method not in (None, "custom_class"):
            spec = r.engine.get("speculative_config") or {}
            dpath = spec.get("model")
            copy = method in COPY_DRAFTERS
            draft = None if copy else (m if dpath in (None, "self", path) else models.get(dpath))
            if draft is None and not copy:
                continue
            k = int(spec.get("num_speculative_tokens") or (q - 1))
            runs = max(1, len(v.get("step_s_samples") or [1]))
            per_seq_steps = max(batch * steps * runs, 1.0)
            # tokens per cycle per sequence -> context grows (1 + accepted) per cycle
            per_cycle = max(1.0, 1.0 + float(v.get("accepted_tokens", 0) or 0) / per_seq_steps)
            frac = min(1.0, float(v.get("num_drafts") or 0) / per_seq_steps) if copy else 1.0
            ctx = float(v.get("context_len", 0)) + 1.0 + steps * per_cycle / 2.0
            seconds = float(v["step_s"])
            if v.get("engine_step_s") and v.get("batch_occupancy"):  # a draining batch, timed per engine iteration
                seconds = float(v["engine_step_s"])  # (probes.StepTiming)
                batch = min(batch, max(1.0, float(v["batch_occupancy"])))
                samples = tuple(s * seconds / float(v["step_s"]) for s in samples)
            out.append(StepPoint("cycle", m, draft, batch, float(k + 1), k, ctx, seconds, temp,
                                 method, frac, _tp(r), samples, _kv(r)))
        elif method in (None, "custom_class"):
            kind = "spec_step" if method == "custom_class" and q == 1 else "step"
            out.append(StepPoint(kind, m, None, batch, q, int(q - 1), ctx, float(v["step_s"]), temp,
                                 gpu_count=_tp(r), samples=samples, kv_cache_dtype=_kv(r)))
    return out


def predict_points(points: Sequence[StepPoint], gpu: GpuSpec, params: StepTimeParams,
                   weights_dtype: str = "bf16") -> np.ndarray:
    """Seconds per point from the cost model: ``step_time_from_cost`` for steps, and the speculative cycle of
    ``advisor.costmodel.speculation.evaluate_grid`` (acceptance 1, every step drafts) for cycles, plus the
    sampling costs at T > 0 (``steptime.rejection_sampling_s`` per sequence, ``draft_sampling_s`` per drafted token)
    where ``CycleSetup`` does not carry the temperature itself."""
    from advisor.costmodel.speculation import CycleSetup, StepSamples, evaluate_grid

    setup_has_temperature = "temperature" in {f.name for f in dataclasses.fields(CycleSetup)}
    out = np.empty(len(points))
    for i, p in enumerate(points):
        cost = forward_cost(gpu, p.model, weights_dtype, p.gpu_count, p.kv_cache_dtype)
        if p.kind == "step":
            out[i] = float(step_time_from_cost(cost, params, p.batch, p.q, p.context, temperature=p.temperature))
        elif p.kind == "spec_step":  # a speculative engine's step in which nothing was drafted (q = 1)
            out[i] = float(step_time_from_cost(cost, params, p.batch, 1.0, p.context) + params.verify_overhead_s
                           + rejection_sampling_s(params, p.batch, 0.0, p.temperature))
        else:
            dcost = forward_cost(gpu, p.draft, "bf16", p.gpu_count, p.kv_cache_dtype) if p.draft is not None else None
            pre = default_prefill_params(gpu)
            # decode_context_tokens = prompt + output / 2 = p.context
            extra = {"temperature": p.temperature} if setup_has_temperature else {}
            setup = CycleSetup(method=p.method, target=cost, draft=dcost, target_step=params, draft_step=params,
                               target_prefill=pre, draft_prefill=pre, prompt_tokens=p.context - 0.5, output_tokens=1,
                               **extra)
            grid = evaluate_grid(setup, np.array([p.batch]), np.array([p.k]), np.ones((1, p.k)),
                                 np.array([p.draft_fraction]), StepSamples.point(params))
            out[i] = float(grid.cycle_s[0, 0, 0])
            if not setup_has_temperature:
                out[i] += float(rejection_sampling_s(params, p.batch, p.batch * p.k, p.temperature)
                                + draft_sampling_s(params, p.batch * p.k, p.temperature))
    return out


def step_free_parameters(points: Sequence[StepPoint]) -> list[str]:
    """The parameters these points determine (see the module docstring)."""
    free = list(STEP_COV_FIELDS)
    steps = [p for p in points if p.kind == "step"]
    q = np.array([p.q for p in steps])
    if np.any(q > 1) and np.any(q == 1):
        free.append("verify_overhead_s")
    tokens = np.unique([p.batch * p.q for p in steps])
    if len(tokens) >= 4 and tokens.max() / tokens.min() >= 8 and len(points) >= len(free) + 2:
        free.append("roofline_sharpness")
    if len({p.model.num_layers for p in points}) > 1:
        free.append("per_layer_overhead_s")
    if any(p.kind == "cycle" and p.draft is not None for p in points):
        free.append("proposer_overhead_s")
    if len({p.batch for p in points if p.kind == "cycle" and p.method in HEAD_METHODS}) >= 2:
        free.append("per_sequence_overhead_s")
    verify = [p for p in points if p.q > 1 or p.kind == "spec_step"]
    hot = [p for p in verify if p.temperature > 0]
    if hot and any(p.temperature == 0 for p in verify):
        free.append("rejection_sampling_s_per_seq")
        if len({p.q for p in hot}) > 1:
            free.append("rejection_sampling_s_per_draft")
    if any(p.kind == "cycle" and p.temperature > 0 for p in points):
        free.append("draft_sampling_s_per_token")
    return free


def fit_step_time(records: Iterable[Any], gpu: GpuSpec, model: ModelSpec, weights_dtype: str = "bf16",
                  base: StepTimeParams | None = None, free: Sequence[str] | None = None,
                  model_path: str | None = None, priors: bool = True,
                  models: dict[str, ModelSpec] | None = None) -> FitResult:
    """Fit ``StepTimeParams`` of ``model`` on ``gpu`` to step-time records: decode (q = 1) and verify
    (q = k + 1, free proposer) steps, and whole draft-model cycles (``proposer_overhead_s``).

    ``base`` gives the starting point and every parameter left fixed (default: the catalog/engine defaults);
    ``free`` overrides the automatic choice (:func:`step_free_parameters`); ``model_path`` keeps only records
    whose engine ran that checkpoint, and ``models`` (path -> spec) adds records of other checkpoints on the same
    hardware and engine (a joint fit: one set of parameters; several layer counts determine
    ``per_layer_overhead_s``). ``priors=False`` drops the weak priors on the efficiencies.
    """
    points = step_points(records, model, model_path, models)
    if len(points) < 3:
        raise ValueError(f"need at least 3 step-time points to fit, got {len(points)}")
    t = np.array([p.seconds for p in points])
    # (a measured engine's copy cycles carry vLLM's in-line host step in their fitted overheads: no prior term)
    base = base or dataclasses.replace(default_step_time_params(gpu), copy_sync_step_s=0.0)
    free = list(free) if free is not None else step_free_parameters(points)
    start = _step_start(gpu, base, points, weights_dtype)

    def params_of(x: np.ndarray) -> StepTimeParams:
        return dataclasses.replace(start, **{name: float(v) for name, v in zip(free, x)})

    def rel_res(x: np.ndarray) -> np.ndarray:
        return (predict_points(points, gpu, params_of(x), weights_dtype) - t) / t

    default = default_step_time_params(gpu)
    x0 = np.array([getattr(start, n) for n in free])
    lower = np.array([BOUNDS[n][0] for n in free])
    upper = np.array([BOUNDS[n][1] for n in free])
    mu = np.array([getattr(default, n) for n in free])
    sd = np.array([EFFICIENCY_PRIOR_REL_STD * getattr(default, n) if priors and n.endswith("_efficiency") else np.inf
                   for n in free])
    x, cov, res = _wls(rel_res, x0, lower, upper, mu, sd, len(t))
    fitted = params_of(x)
    idx = [free.index(n) if n in free else None for n in STEP_COV_FIELDS]
    cov3 = [[float(cov[i, j]) if i is not None and j is not None else 0.0 for j in idx] for i in idx]
    fitted = dataclasses.replace(fitted, covariance=cov3, source=SOURCE, **overhead_log_stds(free, x, cov, res))
    pred = predict_points(points, gpu, fitted, weights_dtype)
    fitted = dataclasses.replace(fitted, timing_rms_rel=float(np.sqrt(np.mean(np.square((pred - t) / t)))))
    fitted = dataclasses.replace(fitted, **repeat_spread_floors(points, gpu, fitted, free, weights_dtype))
    ragged = ragged_points(records, model, model_path)
    if ragged:
        fitted = dataclasses.replace(fitted, ragged_step_s=fit_ragged_step_s(ragged, gpu, fitted, weights_dtype))
    rows = [{"kind": p.kind, "model": p.model.name, "batch": int(p.batch), "q": int(p.q), "context": p.context,
             "temperature": p.temperature, "measured_s": float(p.seconds), "predicted_s": float(pr),
             "method": p.method if p.kind == "cycle" else None, "draft_fraction": p.draft_fraction}
            for p, pr in zip(points, pred)]
    return FitResult(fitted, cov.tolist(), [float(r) for r in res], len(t), float(np.sqrt(np.mean(res ** 2))),
                     tuple(free), rows)


def ragged_points(records: Iterable[Any], model: ModelSpec, model_path: str | None = None) -> list[StepPoint]:
    """The steps that time ``ragged_step_s``, timed on graph engines only: a copy drafter's whole cycles on text
    (``kind == "text_cycle"``, ``ProbeConfig.text_cycle_batch_sizes``: the engine that serves such steps) where the
    run has them, else the verify engine's mixed-width steps (``kind == "mixed"``: half the batch verifying k
    drafts, half none; ``ProbeConfig.mixed_width_batch_sizes``) as steps of the mean width."""
    text = step_points(records, model, model_path, kinds=("text_cycle",))
    if text:
        return text
    out = []
    for r in _records(records, "step_time", model_path):
        v = r.values
        if v.get("kind") != "mixed" or not v.get("step_s") or v["step_s"] <= 0:
            continue
        batch, q = float(v["batch_size"]), float(v.get("q", 1))
        ctx = float(v.get("context_len", 0)) + 1.0 + float(v.get("steps") or 0.0) / 2.0
        out.append(StepPoint("step", model, None, batch, 1.0 + (q - 1.0) / 2.0, int(q - 1), ctx, float(v["step_s"]),
                             float(v.get("temperature") or 0.0), gpu_count=_tp(r), kv_cache_dtype=_kv(r)))
    return out


def fit_ragged_step_s(points: Sequence[StepPoint], gpu: GpuSpec, params: StepTimeParams,
                      weights_dtype: str = "bf16") -> float:
    """``ragged_step_s``: the host-bound floor F of a step that is not uniform, in least squares of
    log(measured / predicted) over :func:`ragged_points`: whole cycles on text as the cost model prices them with F
    (``evaluate_grid``: max(uniform, F) on the share 1 − f^B of steps), mixed-width steps as max(the fitted uniform
    step of the mean width, F)."""
    from scipy.optimize import minimize_scalar

    t = np.array([p.seconds for p in points])
    uniform = predict_points(points, gpu, params, weights_dtype)
    if np.all(t <= uniform):
        return 0.0
    cycles = any(p.kind == "cycle" for p in points)

    def predicted(floor: float) -> np.ndarray:
        if not cycles:
            return np.maximum(uniform, floor)
        return predict_points(points, gpu, dataclasses.replace(params, ragged_step_s=floor), weights_dtype)

    def loss(floor: float) -> float:
        return float(np.sum(np.log(t / predicted(floor)) ** 2))

    low = 0.0 if cycles else float(uniform.min())
    best = float(minimize_scalar(loss, bounds=(low, float(t.max())), method="bounded").x)
    return best if loss(best) < loss(low) * (1.0 - 1e-9) else 0.0  # no floor where none explains the steps better


OVERHEAD_LOG_STD_FIELDS = {"verify_overhead_s": "verify_overhead_log_std",
                           "proposer_overhead_s": "proposer_overhead_log_std",
                           "per_sequence_overhead_s": "per_sequence_overhead_log_std"}
MIN_OVERHEAD_LOG_STD = 0.03


def overhead_log_stds(free: Sequence[str], x: np.ndarray, cov: np.ndarray, res: np.ndarray) -> dict[str, float]:
    """The σ of ln(overhead) the speedup interval samples, for each overhead the fit determined: its relative
    standard error, but at least the fit's rms relative residual (what the model misses run to run) -- so a
    calibrated overhead is as uncertain as the measurements say, not as the uncalibrated prior (0.7)."""
    rms = float(np.sqrt(np.mean(np.square(res)))) if len(res) else 0.0
    out = {}
    for name, log_field in OVERHEAD_LOG_STD_FIELDS.items():
        if name in free:
            i = list(free).index(name)
            rel = math.sqrt(max(float(cov[i][i]), 0.0)) / max(abs(float(x[i])), 1e-9)
            out[log_field] = float(np.clip(max(rel, rms), MIN_OVERHEAD_LOG_STD, 0.7))
    return out


# A repeat faster than half its point's median is an artifact of the wall clock's difference of two generations (a
# slow short one), not the engine: H200 run 1 timed a 26 ms draft-model cycle once at 3.8 ms, below one target
# decode step (5 ms); contention only slows a step, and host-bound cycles spread up to 1.8× (34.6 vs 68.8 ms).
ARTIFACT_BELOW_MEDIAN = 0.5


def _repeat_logs(points: Sequence[StepPoint]) -> list[np.ndarray]:
    """ln of each point's repeats, artifacts dropped, for the points timed at least twice."""
    kept = [[s for s in p.samples if s >= ARTIFACT_BELOW_MEDIAN * float(np.median(p.samples))] for p in points]
    return [np.log(k) for k in kept if len(k) >= 2]


def repeat_log_std(points: Sequence[StepPoint]) -> float | None:
    """σ of ln(step time) between a probe's repeats of the same point, pooled over the points timed at least twice
    (None when none was: records of older runs keep no repeats)."""
    groups = _repeat_logs(points)
    dof = sum(len(g) - 1 for g in groups)
    if dof == 0:
        return None
    # pooled variance Σ_i Σ_j (y_ij − ȳ_i)² / Σ_i (n_i − 1): unbiased for a common σ² (one-way ANOVA error mean square)
    return float(np.sqrt(sum(float(np.sum((g - g.mean()) ** 2)) for g in groups) / dof))


def repeat_semi_log_stds(points: Sequence[StepPoint]) -> tuple[float, float] | None:
    """(below, above): the σ of ln(step time) on each side of a point's median repeat, pooled over the points timed
    at least twice (None when none was); a skewed spread, e.g. a host-bound cycle's floor and slow tail, gives two."""
    groups = [g - np.median(g) for g in _repeat_logs(points)]
    dof = sum(len(g) - 1 for g in groups) / 2.0
    if dof == 0:
        return None
    # two-piece normal about the median: each side's Σ d² over half the pooled dof Σ(n_i − 1) (cf. John 1982)
    return (float(np.sqrt(sum(float(np.sum(g[g < 0] ** 2)) for g in groups) / dof)),
            float(np.sqrt(sum(float(np.sum(g[g > 0] ** 2)) for g in groups) / dof)))


def repeat_spreads(points: Sequence[StepPoint]) -> tuple[float | None, float | None]:
    """Pooled repeat σ (:func:`repeat_log_std`) of the steps (decode, verify, speculative steps without drafts) and
    of model drafters' whole cycles; copy-drafter (n-gram) cycles are in neither."""
    return (repeat_log_std([p for p in points if p.kind != "cycle"]),
            repeat_log_std([p for p in points if p.drafter_forwards]))


def repeat_spread_floors(points: Sequence[StepPoint], gpu: GpuSpec, params: StepTimeParams, free: Sequence[str],
                         weights_dtype: str = "bf16", split: bool = False) -> dict[str, float]:
    """Floors from the probes' own repeats (issue 8) on the spread the speedup interval samples: the fit's residual
    says how far the model misses the medians, the repeats how far one run lands from the next. Pooled apart, as
    the H200 shows them apart (docs/gpu-closed-loop.md): a vLLM 0.24 draft-model cycle is host-bound and its repeats
    spread 20-45 %, decode steps repeat within 1 %, verify steps within ~10 %.

    - ``timing_rms_rel`` ≥ the pooled repeat σ of the steps (:func:`repeat_spreads`);
    - ``proposer_overhead_log_std`` ≥ the pooled repeat σ of model drafters' cycles over the proposer overhead's
      share of those cycles (when the fit determined that overhead), within [MIN_OVERHEAD_LOG_STD, 0.7].
    - ``split``: the cycles' semi-deviations below / above each point's median (:func:`repeat_semi_log_stds`) floor
      ``proposer_overhead_log_std_low`` and ``proposer_overhead_log_std`` apart, a two-piece spread. Off: on the
      stored H200 calibrations the repeats are not skewed (pooled below 20.8 %, above 20.0 %), the shipped profile's
      cycles spread more below than above, and run 4's closed loop would cover 81 % (docs/gpu-closed-loop.md).

    Points without repeats (records of older runs) leave the fit's values as they are."""
    out: dict[str, float] = {}
    steps, sigma = repeat_spreads(points)
    if steps is not None:  # a step lands this far from its median run to run, however well the fit meets the medians
        out["timing_rms_rel"] = max(params.timing_rms_rel, steps)
    cycles = [p for p in points if p.drafter_forwards and len(p.samples) >= 2]
    if split:
        sides = repeat_semi_log_stds(cycles)
    else:
        sides = None if sigma is None else (sigma, sigma)
    if sides is None or "proposer_overhead_s" not in free:
        return out
    with_proposer = predict_points(cycles, gpu, params, weights_dtype)
    without = predict_points(cycles, gpu, dataclasses.replace(params, proposer_overhead_s=0.0), weights_dtype)
    measured = np.array([p.seconds for p in cycles])
    share = float(np.clip(np.mean((with_proposer - without) / measured), 0.2, 1.0))  # H200 fits: 0.2-0.8 by batch
    # var ln(C) ≈ share²·var ln(P) for a cycle C = P + R whose spread is the proposer part P's (delta method)
    low, high = (float(np.clip(max(params.proposer_overhead_log_std, s / share), MIN_OVERHEAD_LOG_STD, 0.7))
                 for s in sides)
    out["proposer_overhead_log_std"] = high
    if split:
        out["proposer_overhead_log_std_low"] = low
    return out


def _step_start(gpu: GpuSpec, base: StepTimeParams, points: Sequence[StepPoint], weights_dtype: str) -> StepTimeParams:
    """A starting point near the data: the smallest decode step split evenly into memory time and overhead, the
    largest step's excess over it taken as compute (the fit moves both)."""
    steps = [p for p in points if p.kind == "step"] or list(points)
    first = min(steps, key=lambda p: (p.q, p.batch, p.seconds))
    cost = forward_cost(gpu, first.model, weights_dtype, first.gpu_count, first.kv_cache_dtype)
    mem_at_1 = weight_bytes_read(cost, 1.0) / cost.bandwidth_bytes_per_s
    eta_bw = float(np.clip(mem_at_1 / (0.5 * first.seconds), 0.05, 1.0))
    fixed = max(first.seconds - mem_at_1 / eta_bw, 0.0)
    big = max(steps, key=lambda p: p.batch * p.q)
    extra = max(big.seconds - first.seconds, 1e-6)
    comp = (big.batch * big.q * forward_cost(gpu, big.model, weights_dtype, big.gpu_count).flops_per_token
            / cost.peak_flops_per_s)
    eta_f = float(np.clip(comp / extra, 0.05, 1.0))
    return dataclasses.replace(base, bandwidth_efficiency=eta_bw, compute_efficiency=eta_f, fixed_overhead_s=fixed,
                               roofline_sharpness=base.roofline_sharpness if base.roofline_sharpness else 2.5)


# --------------------------------------------------------------------------------------------- prefill
def prefill_batch_time_s(cost, params: PrefillParams, step: StepTimeParams, prompt_tokens, batch=1.0):
    """Time to first token of ``batch`` prompts of ``prompt_tokens`` prefilled in one step; equals
    :func:`advisor.costmodel.steptime.prefill_time_s` at batch 1 (tested)."""
    b = np.asarray(batch, dtype=float)
    p = np.asarray(prompt_tokens, dtype=float)
    comp = b * prefill_compute_s(cost, p, params.compute_efficiency)
    mem = weight_bytes_read(cost, b * p) / (cost.bandwidth_bytes_per_s * step.bandwidth_efficiency)
    s = step.roofline_sharpness
    return (params.fixed_overhead_s + cost.num_layers * step.per_layer_overhead_s + tp_allreduce_s(cost, b * p)
            + (mem ** s + comp ** s) ** (1.0 / s))


def fit_prefill(records: Iterable[Any], gpu: GpuSpec, model: ModelSpec, step_params: StepTimeParams,
                weights_dtype: str = "bf16", model_path: str | None = None) -> FitResult:
    """Fit ``PrefillParams`` (compute efficiency, fixed overhead) to the prefill records, with the step-time
    fit's bandwidth efficiency, per-layer overhead and roofline sharpness held."""
    recs = _records(records, "prefill", model_path)
    p = np.array([float(r.values["prompt_len"]) for r in recs])
    b = np.array([float(r.values.get("batch_size", 1)) for r in recs])
    t = np.array([float(r.values["prefill_s"]) for r in recs])
    if len(t) < 2:
        raise ValueError(f"need at least 2 prefill points to fit, got {len(t)}")
    cost = forward_cost(gpu, model, weights_dtype, _tp(recs[0]), _kv(recs[0]))
    default = default_prefill_params(gpu)

    def params_of(x: np.ndarray) -> PrefillParams:
        return dataclasses.replace(default, compute_efficiency=float(x[0]), fixed_overhead_s=float(x[1]))

    def rel_res(x: np.ndarray) -> np.ndarray:
        return (np.asarray(prefill_batch_time_s(cost, params_of(x), step_params, p, b)) - t) / t

    # start: slope between the two longest prompts -> compute rate; intercept -> overhead
    order = np.argsort(b * p)
    comp1 = prefill_compute_s(cost, p[order[-1]], 1.0) * b[order[-1]]
    eta_f0 = float(np.clip(comp1 / max(t[order[-1]] - t[order[0]], 1e-6), 0.05, 1.0))
    x0 = np.array([eta_f0, max(float(t[order[0]]) * 0.5, 0.0)])
    lower = np.array([BOUNDS["compute_efficiency"][0], 0.0])
    upper = np.array([PREFILL_COMPUTE_EFFICIENCY_MAX, BOUNDS["fixed_overhead_s"][1]])
    free = ("compute_efficiency", "fixed_overhead_s")
    x, cov, res = _wls(rel_res, x0, lower, upper, np.zeros(2), np.full(2, np.inf), len(t))
    fitted = dataclasses.replace(params_of(x), covariance=cov.tolist(), source=SOURCE)
    pred = np.asarray(prefill_batch_time_s(cost, fitted, step_params, p, b), dtype=float)
    points = [{"prompt_tokens": int(pp), "batch": int(bb), "measured_s": float(m), "predicted_s": float(pr)}
              for pp, bb, m, pr in zip(p, b, t, pred)]
    return FitResult(fitted, cov.tolist(), [float(r) for r in res], len(t), float(np.sqrt(np.mean(res ** 2))),
                     free, points)


# --------------------------------------------------------------------------------------------- acceptance
def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _logistic_map(X: np.ndarray, succ: np.ndarray, trials: np.ndarray, prior_std: np.ndarray,
                  bound: float = LOGIT_BOUND) -> tuple[np.ndarray, np.ndarray, float]:
    """MAP logistic regression (binomial counts, Gaussian prior N(0, prior_std²)); returns θ, covariance, and
    the Pearson dispersion χ²/dof (≥ 1 means the counts vary more than binomially)."""
    prec = 1.0 / prior_std ** 2

    def nll(theta: np.ndarray) -> tuple[float, np.ndarray]:
        z = X @ theta
        # log-likelihood of binomial counts: s·log σ(z) + (n − s)·log σ(−z)
        ll = succ * -np.logaddexp(0.0, -z) + (trials - succ) * -np.logaddexp(0.0, z)
        grad = X.T @ (succ - trials * _sigmoid(z))
        return float(-ll.sum() + 0.5 * np.sum(prec * theta ** 2)), -grad + prec * theta

    sol = minimize(nll, np.zeros(X.shape[1]), jac=True, method="L-BFGS-B",
                   bounds=[(-bound * 4, bound * 4)] * X.shape[1], options={"maxiter": 500, "gtol": 1e-10})
    theta = sol.x
    p = _sigmoid(X @ theta)
    info = (X * (trials * p * (1 - p))[:, None]).T @ X + np.diag(prec)
    cov = np.linalg.inv(info)
    used = trials > 0
    dof = max(int(used.sum()) - X.shape[1], 1)
    var = trials * p * (1 - p)
    pearson = float(np.sum(((succ - trials * p) ** 2 / np.maximum(var, 1e-9))[used]) / dof)
    return theta, cov, pearson


def _acceptance_rows(recs: list[Record]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(position, temperature, successes, trials) of the conditional acceptance at each draft position."""
    pos, temp, succ, trials = [], [], [], []
    for r in recs:
        v = r.values
        n = float(v.get("num_drafts") or 0)
        a = [float(x) for x in (v.get("accepted_per_pos") or [])]
        k = int(v.get("k") or len(a))
        if n <= 0:
            continue
        a = (a + [0.0] * k)[:k]
        reach = n
        for i, acc in enumerate(a):
            if reach <= 0:
                break
            pos.append(float(i))
            temp.append(float(v.get("temperature", 0.0)))
            succ.append(min(acc, reach))
            trials.append(reach)
            reach = acc
    return np.array(pos), np.array(temp), np.array(succ), np.array(trials)


def fit_acceptance(records: Iterable[Any], method: str, drafter: str | None, structure: str,
                   drafter_label: str | None = None) -> FitResult:
    """Fit the ``AcceptanceModel`` of (method, drafter, structure) to acceptance records of that structure
    and method (all k and temperatures pooled; ``drafter_label`` keeps only records of that probe label)."""
    def of_cell(probe: str) -> list[Record]:
        return [r for r in _records(records, probe)
                if r.values.get("structure") == structure and r.values.get("method") == method
                and (drafter_label is None or r.values.get("label") == drafter_label)]

    recs = of_cell("acceptance")
    if not recs:
        raise ValueError(f"no acceptance records for {method}/{structure}")
    pos, temp, succ, trials = _acceptance_rows(recs)
    temps = sorted({float(r.values.get("temperature", 0.0)) for r in recs})
    fit_temp = len(temps) > 1
    if len(trials):
        X = np.column_stack([np.ones_like(pos), pos] + ([temp] if fit_temp else []))
        prior = ACCEPTANCE_PRIOR_STD if fit_temp else ACCEPTANCE_PRIOR_STD[:2]
        theta, cov, dispersion = _logistic_map(X, succ, trials, prior)
        cov = cov * max(dispersion, 1.0)
        if not fit_temp:
            theta = np.append(theta, 0.0)
            full = np.zeros((3, 3))
            full[:2, :2] = cov
            full[2, 2] = UNFIT_TEMPERATURE_SLOPE_STD ** 2
            cov = full
    else:  # nothing ever drafted: acceptance unknown, draft fraction 0 says it never matters
        theta, cov, dispersion = np.array([-LOGIT_BOUND, 0.0, 0.0]), np.diag([1.0, 0.01, 0.01]), 1.0
    theta = np.clip(theta, -LOGIT_BOUND * 4, LOGIT_BOUND * 4)

    # fraction of decode steps that drafted (n-gram finds no match on some steps): logistic in T
    # ... and, with the same cells stopped at output checkpoints, in ln(output tokens per prompt / 64) too
    full = [r for r in recs if float(r.values.get("decode_steps") or 0) > 0]
    marks = [r for r in of_cell("acceptance_checkpoint") if float(r.values.get("decode_steps") or 0) > 0]
    f_output, up_to = 0.0, None
    if full:
        both = full + marks
        f_steps = np.array([float(r.values["decode_steps"]) for r in both])
        drafted = np.minimum(np.array([float(r.values.get("num_drafts") or 0) for r in both]), f_steps)
        output = np.array([_mean_output(r) for r in both])
        Xf = np.column_stack([np.ones(len(both))]
                             + ([[float(r.values.get("temperature", 0.0)) for r in both]] if fit_temp else [])
                             + ([np.log(output / DRAFT_FRACTION_REF_TOKENS)] if marks else []))
        phi, _, _ = _logistic_map(Xf, drafted, f_steps, np.full(Xf.shape[1], 10.0), bound=LOGIT_BOUND)
        f_logit, f_slope = float(phi[0]), float(phi[1]) if fit_temp else 0.0
        fraction = float(drafted[:len(full)].sum() / f_steps[:len(full)].sum())  # the full generations'
        if marks:
            f_output, up_to = float(phi[-1]), OUTPUT_EXTRAPOLATION * float(output.max())
    else:
        f_logit, f_slope, fraction = LOGIT_BOUND, 0.0, 1.0
    fraction = min(max(fraction, 0.0), 1.0)

    model = AcceptanceModel(
        method=method, drafter=drafter, structure=structure, logit_intercept=float(theta[0]),
        logit_position_slope=float(theta[1]), logit_temperature_slope=float(theta[2]),
        covariance=[[float(x) for x in row] for row in cov], temperature_range=(temps[0], temps[-1]),
        draft_fraction=fraction, source=SOURCE)
    model = dataclasses.replace(model, draft_fraction_logit=f_logit, draft_fraction_temperature_slope=f_slope,
                                draft_fraction_output_slope=f_output, draft_fraction_output_tokens_up_to=up_to)
    if marks:
        model = _acceptance_along_output(model, full, marks)

    residuals, points = [], []
    for r in recs:
        v = r.values
        if not v.get("num_drafts"):
            continue
        k = int(v.get("k") or len(v.get("accepted_per_pos") or []))
        pred = al_of(model, float(v.get("temperature", 0.0)), k)
        meas = _measured_al(r)
        residuals.append((pred - meas) / meas)
        points.append({"temperature": float(v.get("temperature", 0.0)), "k": k, "num_drafts": int(v["num_drafts"]),
                       "measured_al": meas, "predicted_al": pred,
                       "measured_draft_fraction": v.get("drafted_fraction"),
                       "predicted_draft_fraction": draft_fraction_at(model, float(v.get("temperature", 0.0)),
                                                                     _mean_output(r))})
    res = np.array(residuals) if residuals else np.zeros(0)
    return FitResult(model, [[float(x) for x in row] for row in cov], [float(x) for x in res], len(recs),
                     float(np.sqrt(np.mean(res ** 2))) if len(res) else 0.0,
                     ("logit_intercept", "logit_position_slope", "logit_temperature_slope"), points)


def _acceptance_along_output(model: AcceptanceModel, full: list[Record], marks: list[Record]) -> AcceptanceModel:
    """``model`` with its acceptance along the output: per cell (temperature, k), the intercept shift that gives the
    AL measured over the checkpoint's output and the one over the whole output, against ln of their outputs (least
    squares through the whole output's shift, weighted by the checkpoint's drafts); the reference is the whole
    outputs' geometric mean, which the intercept was fitted over. ``model`` as it is where no cell pairs up or the
    checkpoints drafted fewer than ``ACCEPTANCE_OUTPUT_SLOPE_MIN_DRAFTS`` times."""
    def key(r: Record) -> tuple[float, int]:
        return float(r.values.get("temperature", 0.0)), int(r.values.get("k") or 0)

    def shift(r: Record) -> float:  # the intercept shift whose AL over the record's drafted steps is the measured one
        t, k = key(r)
        al = _measured_al(r)

        def gap(d: float) -> float:
            return al_of(dataclasses.replace(model, logit_intercept=model.logit_intercept + d), t, k) - al

        lo, hi = gap(-LOGIT_BOUND), gap(LOGIT_BOUND)
        return -LOGIT_BOUND if lo >= 0 else LOGIT_BOUND if hi <= 0 else float(brentq(gap, -LOGIT_BOUND, LOGIT_BOUND))

    whole = {key(r): r for r in full if r.values.get("num_drafts") and _mean_output(r) > 0}
    pairs = [(whole[key(r)], r) for r in marks
             if r.values.get("num_drafts") and _mean_output(r) > 0 and key(r) in whole]
    x = np.array([math.log(_mean_output(c) / _mean_output(w)) for w, c in pairs])
    weight = np.array([float(c.values["num_drafts"]) for _, c in pairs])
    if not pairs or not np.any(x) or weight.sum() < ACCEPTANCE_OUTPUT_SLOPE_MIN_DRAFTS:
        return model
    y = np.array([shift(c) - shift(w) for w, c in pairs])
    bound = ACCEPTANCE_OUTPUT_SLOPE_BOUND
    slope = float(np.clip(np.sum(weight * x * y) / np.sum(weight * x * x), -bound, bound))
    drafts = np.array([float(w.values["num_drafts"]) for w in whole.values()])
    ref = float(np.exp(np.sum(drafts * np.log([_mean_output(w) for w in whole.values()])) / drafts.sum()))
    return dataclasses.replace(model, logit_output_slope=slope, logit_output_ref_tokens=ref)


def _measured_al(record: Record) -> float:
    """AL of an acceptance record that drafted: vLLM's 1 + accepted / drafts (design.md §2)."""
    return 1.0 + float(record.values["num_accepted_tokens"]) / float(record.values["num_drafts"])


def _mean_output(record: Record) -> float:
    """Output tokens per prompt of an acceptance record."""
    v = record.values
    return float(v.get("output_tokens") or 0) / max(int(v.get("num_prompts") or 1), 1)


def al_of(model: AcceptanceModel, temperature: float, k: int) -> float:
    """AL over drafted steps (vLLM's 1 + A/N) predicted by ``model`` at ``temperature`` and ``k``."""
    pos = np.arange(k, dtype=float)
    cond = _sigmoid(model.logit_intercept + model.logit_position_slope * pos
                    + model.logit_temperature_slope * temperature)
    return float(1.0 + np.cumprod(cond).sum())


# --------------------------------------------------------------------------------------------- a run
def run_weights_dtype(records: Iterable[dict], settings: dict | None = None) -> str:
    """The weights dtype a run's engines ran at: the first recorded engine's vLLM arguments over ``settings`` (the
    request's); bf16 where neither names a dtype or quantization (a bf16 shape's config says bfloat16)."""
    engine = next((e for r in records if (e := (r.get("params") or {}).get("engine"))), {})
    return engine_weights_dtype({**(settings or {}), **engine}) or "bf16"


# Pooling runs. A speculative engine's host-bound steps land, at each start, in a state that holds for the engine's
# life: on one H200 two calibrations minutes apart read the k = 5 verify at B = 1 as 11.9 and 9.0 ms and predicted
# one closed loop within 13.4 and 15.1 %; their records fitted together, 11.3 % (run 13's two: 10.0, 11.5 -> 7.6 %;
# docs/gpu-closed-loop.md, run 14). So a run's timing fit takes the timing records of the newest earlier runs of
# the same conditions too (calibration.jobs); the acceptance and memory probes stay the run's own.
POOLED_PROBES = ("step_time", "prefill")
POOL_RUNS = 3  # earlier runs joined at most, newest first
# what must be equal between two runs' environments for their timings to pool (not the host name: nodes of one
# class pool, as the shipped engine profile pools leases)
POOL_ENVIRONMENT = ("platform", "gpu_name", "gpu_count", "cpu_model", "cpu_count", "vllm_version", "torch_version",
                    "cuda_version")


def pool_key(request: dict[str, Any], environment: dict[str, Any] | None, records: Sequence[dict]) -> tuple:
    """What a run's timings depend on besides noise: the request's hardware, target, method and drafter, the
    engines' weights and KV-cache dtypes, tensor-parallel size and mode (the first recorded engine's settings over
    the request's), and the software and hardware the environment names (``POOL_ENVIRONMENT``). Runs pool only
    where this is equal."""
    engine = next((e for r in records if (e := (r.get("params") or {}).get("engine"))), {})
    settings = {**(request.get("engine") or {}), **engine}
    return (request.get("hardware"), request.get("target_model"), request.get("method"), request.get("draft_model"),
            request.get("weights_dtype") or run_weights_dtype(records, request.get("engine")),
            engine_kv_cache_dtype(settings) or "auto", int(settings.get("tensor_parallel_size") or 1),
            bool(settings.get("enforce_eager")), tuple((environment or {}).get(k) for k in POOL_ENVIRONMENT))


def pool_runs(runs: Sequence[Sequence[dict]], probes: Sequence[str] | None = None) -> list[dict]:
    """The records of several runs as one run's: the first run's, then each later run's (only its ``probes``
    records, all where None) with its checkpoint paths rewritten to the first run's of the same file name (a GPU
    run's shapes live in its own work directory, e.g. /tmp/w2/shapes/NAME), so that the fit, which keys records by
    checkpoint path, takes them as the same target and drafter."""
    first = list(runs[0]) if runs else []
    names = {PurePath(m).name: m for r in first for m in _engine_paths(r)}
    out = list(first)
    for run in runs[1:]:
        for r in run:
            if probes is not None and r.get("probe") not in probes:
                continue
            engine = dict(r["params"]["engine"])
            if engine.get("model"):
                engine["model"] = names.get(PurePath(engine["model"]).name, engine["model"])
            spec = engine.get("speculative_config")
            if spec and spec.get("model"):
                engine["speculative_config"] = {**spec, "model": names.get(PurePath(spec["model"]).name,
                                                                               spec["model"])}
            out.append({**r, "params": {**r["params"], "engine": engine}})
    return out


def _engine_paths(record: dict) -> list[str]:
    engine = (record.get("params") or {}).get("engine") or {}
    spec = engine.get("speculative_config") or {}
    return [m for m in (engine.get("model"), spec.get("model")) if m]


def fit_run(records: Iterable[Any], gpu: GpuSpec, target: ModelSpec, draft: ModelSpec | None, method: str,
            drafter_name: str | None, weights_dtype: str = "bf16", target_path: str | None = None,
            results: dict[str, FitResult] | None = None,
            models: dict[str, ModelSpec] | None = None) -> list[dict[str, Any]]:
    """Every fit one calibration run supports, as fit records for ``advisor.services.calibrations``:

    - ``step_time`` / ``prefill`` keyed by the target's catalog name (records of the target's checkpoint:
      ``target_path``, or the checkpoint with most timing records);
    - ``acceptance`` keyed by ``acceptance_key(method, drafter_name, structure)`` for each structure measured.
      For n-gram (and suffix) the drafter is None.

    ``results`` (optional dict) receives the :class:`FitResult` of each fit by ``kind:key``; ``models`` (checkpoint
    path -> spec) joins timing records of other checkpoints (e.g. a truncated copy) into the step-time fit.
    """
    records = [normalize(r) for r in records]
    fits: list[dict[str, Any]] = []
    paths = [p for p in model_paths(records) if p not in (models or {})]
    path = target_path or (paths[0] if paths else None)
    step_fit = None
    if len(_records(records, "step_time", path)) >= 3:
        step_fit = fit_step_time(records, gpu, target, weights_dtype, model_path=path, models=models)
        fits.append(_fit_record("step_time", target.name, step_fit))
        if results is not None:
            results[f"step_time:{target.name}"] = step_fit
        if draft is not None and draft.name != target.name and any(
                p["kind"] == "cycle" and p["method"] not in COPY_DRAFTERS for p in step_fit.points):
            # the drafter's forwards were timed inside whole cycles: the joint fit is the drafter's too, unless its
            # engine ran another path than the other speculative engines (then a fit of its own engine's records)
            own = engine_path_records(records, method)
            drafter_fit = step_fit if own is None else fit_step_time(own, gpu, target, weights_dtype, model_path=path,
                                                                     models=models)
            record = _fit_record("step_time", draft.name, drafter_fit)
            if method == "draft_model":  # the depth its host cost per forward was timed at (a stand-in's scale)
                record["params"]["proposer_layers"] = int(draft.num_layers)
            fits.append(record)
            if results is not None and own is not None:
                results[f"step_time:{draft.name}"] = drafter_fit
    if len(_records(records, "prefill", path)) >= 2:
        step_params = step_fit.params if step_fit else default_step_time_params(gpu)
        pre = fit_prefill(records, gpu, target, step_params, weights_dtype, model_path=path)
        fits.append(_fit_record("prefill", target.name, pre))
        if results is not None:
            results[f"prefill:{target.name}"] = pre
    drafter = None if method in ("ngram", "suffix") else drafter_name
    structures = sorted({r.values.get("structure") for r in _records(records, "acceptance")
                         if r.values.get("method") == method and r.values.get("structure")})
    for s in structures:
        acc = fit_acceptance(records, method, drafter, s)
        key = acceptance_key(method, drafter, s)
        fits.append(_fit_record("acceptance", key, acc))
        if results is not None:
            results[f"acceptance:{key}"] = acc
    return fits


def engine_path_records(records: Sequence[Record], method: str) -> list[Record] | None:
    """The records of the ``method`` drafter's own engine path: plain engines (the target's decode steps and
    prefill) and the speculative engines whose ``async_scheduling`` (the memory probe's) equals the drafter engine's.
    None when every speculative engine ran the same path, or the flags were not recorded: the joint fit applies.
    vLLM 0.24 runs an EAGLE head with async scheduling, the verify probes' custom proposer, n-gram and a separate
    draft model without; fitted with them an EAGLE closed loop came out 16 % low, on its own path 6 %
    (docs/gpu-closed-loop.md)."""
    flags = {r.engine.get("label"): r.values.get("async_scheduling") for r in records if r.probe == "memory"}
    spec = {r.engine.get("label"): (r.engine.get("speculative_config") or {}).get("method") for r in records}
    mine = {flags.get(label) for label, m in spec.items() if m == method}
    if len(mine) != 1 or None in mine:
        return None
    path = mine.pop()
    other = {label for label, m in spec.items() if m is not None and flags.get(label) not in (None, path)}
    if not other:
        return None
    return [r for r in records if r.engine.get("label") not in other]


def _fit_record(kind: str, key: str, fit: FitResult) -> dict[str, Any]:
    params = fit.params.to_dict()
    return {"kind": kind, "key": key, "params": params, "residuals": [round(r, 6) for r in fit.residuals]}


def summary(fits: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Quality of a run's fits: rms / max relative residual and the number of points per fit, and whether it is
    good (timing rms ≤ 10 %, acceptance AL rms ≤ 15 %)."""
    rows = []
    for f in fits:
        res = np.asarray(f.get("residuals") or [], dtype=float)
        rms = float(np.sqrt(np.mean(res ** 2))) if len(res) else None
        limit = 0.15 if f["kind"] == "acceptance" else 0.10
        rows.append({"kind": f["kind"], "key": f["key"], "n_points": int(len(res)), "rmse_rel": rms,
                     "max_abs_rel": float(np.max(np.abs(res))) if len(res) else None,
                     "good": rms is not None and rms <= limit})
    return {"fits": rows, "all_good": all(r["good"] for r in rows) if rows else False}


def format_summary(fits: Sequence[dict[str, Any]]) -> str:
    lines = []
    for r in summary(fits)["fits"]:
        rms = "-" if r["rmse_rel"] is None else f"{100 * r['rmse_rel']:.1f} %"
        lines.append(f"{r['kind']:<10} {r['key']:<40} n={r['n_points']:<3} rms {rms:>7}  "
                     f"{'ok' if r['good'] else 'POOR'}")
    return "\n".join(lines)
