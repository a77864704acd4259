"""predict(): a scenario + catalog specs (+ optional calibration) → the full answer (design.md §3)."""
from __future__ import annotations

import dataclasses
import math
import operator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

import numpy as np
import orjson

from .acceptance import (MAX_K, SEARCH_K, at_output, coefficients_from_normals, draft_fraction_at, model_from_input,
                         per_position_rates, sample_draft_fraction, with_transfer_spread)
from .checks import METHOD_KINDS, check_draft, check_tensor_parallel
from .decision import GO_THRESHOLD, DecisionInput, decide
from .memo import cached_by_identity, cached_when_hashable
from .memory import (MAX_MODEL_LEN_RESERVE_GB, MemoryReport, beyond_context_window, kv_cache_bytes_per_element,
                     memory_report, resident_sequences)
from .priors import prior_acceptance
from .speculation import (COPY_DRAFTERS, MODEL_DRAFTERS, CycleSetup, Grid, StepSamples, evaluate_grid, queued,
                          stack_grids)
from .steptime import (ENGINE_PROFILES, EngineProfile, default_drafter_step, default_prefill_params,
                       default_step_time_params, engine_profile, forward_cost, with_engine)
from .tco import best_operating_point, tco_report
from .types import (COST_MODEL_VERSION, INTERNAL_METHODS, METHODS, STRUCTURES, WEIGHTS_DTYPES, AcceptanceInput,
                    AcceptanceModel, Calibration, CostModelError, GpuSpec, MeasuredEngineProfile, ModelSpec,
                    PrefillParams, Scenario, Slo, StepTimeParams, acceptance_key, minor_version)
from .vllm_config import PREQUANTIZED, checkpoint_of, serve_flags, speculative_config

CURVE_CONCURRENCY: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MC_SAMPLES = 96  # Monte Carlo draws for the interval (row 0 = point estimate)
MC_SEED = 20231130  # fixed seed: identical inputs give identical answers
INTERVAL = (5.0, 95.0)  # percentiles of the speedup interval
METHOD_DEFAULT_K = {"draft_model": 4, "eagle": 3, "eagle3": 3, "ngram": 4, "suffix": 4, "mtp": 1, "medusa": 4}
PREFILL_SHARE_FLAG = 0.5  # flag prefill-dominated workloads above this share of request latency
DYNAMIC_TABLE_MAX_BATCH = 512
# TCO without a stated SLO: serve the load at the end-to-end latency the workload gets today without speculation.
IMPLICIT_SLO_SOURCE = "default:baseline latency at the workload's concurrency"


@dataclass
class Prediction:
    """The answer; ``to_dict()`` is the JSON the service stores and returns, ``json_text`` the same encoded."""

    data: dict[str, Any]
    json_text: str  # strict JSON (no NaN or ±Infinity), encoded once: what the service stores and sends

    def to_dict(self) -> dict[str, Any]:
        return self.data  # built fresh by each predict() call

    @property
    def decision(self) -> str:
        return self.data["decision"]

    @property
    def speedup(self) -> dict[str, float]:
        return self.data["speedup"]


# ----------------------------------------------------------------------------------------------- validation
def _validate(s: Scenario, draft: ModelSpec | None) -> None:
    w, sp = s.workload, s.speculator
    if sp.method not in METHODS + INTERNAL_METHODS:
        raise CostModelError("speculator.method", f"unknown method '{sp.method}'; one of {', '.join(METHODS)}")
    if w.structure not in STRUCTURES:
        raise CostModelError("workload.structure", f"unknown structure '{w.structure}'; one of {', '.join(STRUCTURES)}")
    if s.weights_dtype not in WEIGHTS_DTYPES:
        raise CostModelError("weights_dtype", f"unknown dtype '{s.weights_dtype}'; one of {', '.join(WEIGHTS_DTYPES)}")
    kv_cache_bytes_per_element(s.kv_cache_dtype)  # validates the KV-cache dtype
    if not 0.0 <= w.temperature <= 2.0:
        raise CostModelError("workload.temperature", "must be in [0, 2]")
    if w.prompt_tokens < 1:
        raise CostModelError("workload.prompt_tokens", "must be >= 1")
    if w.output_tokens < 1:
        raise CostModelError("workload.output_tokens", "must be >= 1")
    if w.concurrency is not None and w.concurrency < 1:
        raise CostModelError("workload.concurrency", "must be >= 1")
    if w.requests_per_second is not None and w.requests_per_second <= 0:
        raise CostModelError("workload.requests_per_second", "must be > 0")
    if sp.num_speculative_tokens is not None and not 1 <= sp.num_speculative_tokens <= MAX_K:
        raise CostModelError("speculator.num_speculative_tokens", f"must be in 1..{MAX_K}")
    if sp.num_verify_tokens is not None and sp.num_verify_tokens < 2:
        raise CostModelError("speculator.num_verify_tokens", "must be >= 2")
    if s.gpu_count < 1:
        raise CostModelError("gpu_count", "must be >= 1")
    if not 0.0 < s.gpu_memory_utilization <= 1.0:
        raise CostModelError("gpu_memory_utilization", "must be in (0, 1]")
    if s.vram_gb is not None and s.vram_gb <= 0:
        raise CostModelError("vram_gb", "must be > 0")
    if s.gpu_hour_usd is not None and s.gpu_hour_usd < 0:
        raise CostModelError("gpu_hour_usd", "must be >= 0")
    if sp.method == "draft_model" and draft is None:
        raise CostModelError("speculator.draft_model", "method 'draft_model' needs a draft model")


def synthesized_head(target: ModelSpec, kind: str) -> ModelSpec:
    """A generic EAGLE/EAGLE-3/MTP head shaped like one target layer (when no head is in the catalog)."""
    vocab = 32000 if kind == "eagle3_head" and target.vocab_size > 64000 else target.vocab_size
    layer = target.hidden_size * target.head_dim * (target.num_attention_heads + 2 * target.num_kv_heads) \
        + target.num_attention_heads * target.head_dim * target.hidden_size + 3 * target.hidden_size * target.intermediate_size
    params = layer + 3 * target.hidden_size ** 2 + (vocab * target.hidden_size if kind == "eagle3_head" else 0)
    return dataclasses.replace(target, name=f"{kind.replace('_head', '')}-head-for-{target.name}", kind=kind,
                               num_layers=1, vocab_size=vocab, param_count=int(params), num_experts=None,
                               num_experts_per_token=None, hf_repo=None)


# ----------------------------------------------------------------------------------------------- pieces
@dataclass(frozen=True)
class Context:
    scenario: Scenario
    gpu: GpuSpec
    target: ModelSpec
    draft: ModelSpec | None
    draft_source: str
    calibration: Calibration | None
    catalog_sources: dict[str, str]
    target_step: StepTimeParams
    draft_step: StepTimeParams
    target_prefill: PrefillParams
    draft_prefill: PrefillParams
    step_source: str
    acceptance: AcceptanceModel
    acceptance_source: str
    k_ref: int
    calibration_notes: tuple[str, ...] = ()  # why a calibration (or part of it) was not used
    draft_fraction_given: bool = False  # acceptance.draft_fraction stated: not sampled
    profile: MeasuredEngineProfile | None = None  # the measured GPU × vLLM profile the timing came from
    # the speculative engine's timing source where it is not step_source (a drafter carried from another profile)
    spec_step_source: str | None = None
    # the measured profile of the GPU × the scenario's vLLM version, whether or not it timed this answer (the
    # compared methods' engines are timed by the same rule: engine_steps)
    version_profile: MeasuredEngineProfile | None = None
    # requests admitted one by one, apart (speculation.CycleSetup.staggered): an arrival rate, or more clients than
    # either server holds (a full server with a queue); a stated concurrency within the caps is a batch that starts
    # together, as the closed loops measure it
    staggered: bool = False


def step_params(gpu: GpuSpec, model: ModelSpec | None, engine: str, calibration: Calibration | None,
                profile: MeasuredEngineProfile | None = None) -> tuple[StepTimeParams, PrefillParams, str]:
    """``model``'s step-time and prefill fits and their source: the calibration's, else (vLLM) the profile's,
    else the defaults."""
    if calibration is not None and model is not None and model.name in calibration.step_time:
        step = calibration.step_time[model.name]
        pre = calibration.prefill.get(model.name) or default_prefill_params(gpu, engine)
        step = with_engine(step, engine) if engine != "vllm" else step
        return step, pre, calibration.timing_source
    if profile is not None and engine == "vllm" and model is not None:
        return profile.step_time, profile.prefill, f"profile:{profile.name}"
    return default_step_time_params(gpu, engine), default_prefill_params(gpu, engine), "default"


# A profile carried to another GPU: its timing spread at least this (log σ of the baseline step and of the cycle).
# docs/gpu-closed-loop.md "Run 19": the H100 lease's fit on the fifteen H200 leases, and the H200's profile on the
# H100 lease, covered 477/540 and 35/36 at their own spread, 525/540 and 36/36 at 0.2 (the H200's own: 522/540).
PROFILE_TRANSFER_TIMING_REL = 0.2


def matching_profile(profiles: Iterable[MeasuredEngineProfile], gpu: GpuSpec, vllm_version: str | None,
                     measured_gpus: dict[str, GpuSpec] | None = None) -> MeasuredEngineProfile | None:
    """The measured profile of this GPU × vLLM version (major.minor of ``vllm_version``). Else, where
    ``measured_gpus`` gives the specs of the GPUs profiles were measured on: that version's profile from the GPU of
    the same vendor nearest in HBM bandwidth, carried to this one (:func:`transferred_profile`); else None. Either
    way, drafters it did not time come from the version's other profiles, carried (:func:`with_carried_drafters`).
    A vLLM version's engine behaviour (a draft model without CUDA graphs, n-gram without async scheduling) is the
    version's, not the GPU's; the CPU build is another engine and gets none."""
    if not vllm_version:
        return None
    minor = minor_version(vllm_version)
    same = [p for p in profiles if p.vllm_version == minor]
    own = next((p for p in same if p.gpu == gpu.name), None)
    if not measured_gpus or gpu.gpu_class == "cpu":
        return own
    vendor = gpu.vendor.casefold()  # a catalog row a user added may spell it "nvidia"
    near = sorted((p for p in same if p is not own and p.gpu in measured_gpus
                   and measured_gpus[p.gpu].vendor.casefold() == vendor),
                  key=lambda p: abs(math.log(measured_gpus[p.gpu].hbm_bandwidth_gb_per_s / gpu.hbm_bandwidth_gb_per_s)))
    carried = [transferred_profile(p, gpu) for p in near]
    base = own if own is not None else carried.pop(0) if carried else None
    return with_carried_drafters(base, carried) if base is not None else None


def with_carried_drafters(own: MeasuredEngineProfile, carried: list[MeasuredEngineProfile]) -> MeasuredEngineProfile:
    """``own`` with the drafters it did not time taken from ``carried`` (the version's other profiles carried to its
    GPU, nearest first): which runner vLLM runs a drafter on, with or without CUDA graphs and async scheduling, is
    the version's, and its fit carries as the target's does (docs/gpu-closed-loop.md "Run 19")."""
    timed = {name for name, _ in own.drafters}
    extra: list[tuple[str, StepTimeParams]] = []
    origins: list[tuple[str, str]] = []
    methods: list[tuple[str, str]] = []
    for profile in carried:
        method_of = dict(profile.drafter_methods)
        for name, step in profile.drafters:
            if name not in timed:
                timed.add(name)
                extra.append((name, step))
                origins.append((name, profile.name))
                methods += [(name, method_of[name])] if name in method_of else []
    if not extra:
        return own
    return dataclasses.replace(own, drafters=(*own.drafters, *extra), drafter_origins=tuple(origins),
                               drafter_methods=(*own.drafter_methods, *methods))


def transferred_profile(profile: MeasuredEngineProfile, gpu: GpuSpec) -> MeasuredEngineProfile:
    """``profile`` applied to ``gpu``: its efficiencies and per-step overheads priced on that GPU's bandwidth and
    FLOP/s (the step-time model does that with any GPU's specs), its timing spread at least
    ``PROFILE_TRANSFER_TIMING_REL``. Between the H100 and the H200 a profile so carried predicted the other GPU's
    closed loops within a median 9.1-12.8 % (docs/gpu-closed-loop.md "Run 19", "Run 20")."""
    return dataclasses.replace(
        profile, name=f"{profile.name} → {gpu.name}",
        step_time=profile.step_time.with_spread_at_least(PROFILE_TRANSFER_TIMING_REL),
        drafters=tuple((name, step.with_spread_at_least(PROFILE_TRANSFER_TIMING_REL))
                       for name, step in profile.drafters),
        applied_to=gpu.name,
        behaviour=(f"measured on {profile.gpu}, applied to {gpu.name}'s bandwidth and FLOP/s (carried between "
                   "the H100 and the H200 such a profile came within a median 9-13 %): calibrate on this GPU",
                   *profile.behaviour))


def calibration_mismatch(calibration: Calibration, s: Scenario, gpu: GpuSpec) -> tuple[str, ...]:
    """Why a calibration run does not apply to a scenario (empty: it applies). A fit measured at another weights
    dtype, tensor-parallel size or engine mode is never substituted (unrecorded conditions are not checked)."""
    return conditions_mismatch(calibration, gpu, s.weights_dtype, s.kv_cache_dtype, s.vllm_version, s.gpu_count)


def conditions_mismatch(calibration: Calibration, gpu: GpuSpec, weights_dtype: str, kv_cache_dtype: str = "auto",
                        vllm_version: str | None = None, gpu_count: int | None = None) -> tuple[str, ...]:
    """:func:`calibration_mismatch` for the conditions alone; ``gpu_count`` None: any tensor-parallel size (a plan
    weighs several)."""
    out = []
    if calibration.weights_dtype and calibration.weights_dtype != weights_dtype:
        out.append(f"measured {calibration.weights_dtype} weights, not {weights_dtype}")
    if gpu_count is not None and calibration.tensor_parallel_size and calibration.tensor_parallel_size != gpu_count:
        out.append(f"measured at tensor-parallel size {calibration.tensor_parallel_size}, not {gpu_count}")
    if calibration.kv_cache_dtype and calibration.kv_cache_dtype != kv_cache_dtype:
        out.append(f"measured with KV-cache dtype {calibration.kv_cache_dtype}, not {kv_cache_dtype}")
    if calibration.engine_mode == "eager" and gpu.gpu_class != "cpu":
        out.append("measured without CUDA graphs (enforce_eager); vLLM serves with them")
    wanted = minor_version(vllm_version)
    if wanted and calibration.vllm_version and calibration.vllm_version != wanted:
        out.append(f"measured with vLLM {calibration.vllm_version}, not {wanted}")
    return tuple(out)


def timing_run(calibrations: Sequence[Calibration], target: str, drafter: str | None = None,
               method: str | None = None) -> Calibration | None:
    """Of ``calibrations`` (newest first), the one whose timing prices ``target`` speculating with ``drafter``: the
    newest that timed that drafter's engine (its fit holds the target's steps on the path vLLM ran them with it),
    else the newest that timed a drafter of its ``method`` (the stand-in, :meth:`Calibration.with_stand_in`), else
    the newest that timed the target; None where none did."""
    timed = [cal for cal in calibrations if target in cal.step_time]
    if drafter is None:
        return timed[0] if timed else None
    return next((cal for cal in timed if drafter in cal.step_time),
                next((cal for cal in timed if method in cal.drafter_methods.values()), timed[0] if timed else None))


def calibrated_acceptance(calibration: Calibration, method: str, drafter: str | None,
                          structure: str) -> AcceptanceModel | None:
    """The fit measured for exactly this method, drafter and structure, or None: never another drafter's fit."""
    fit = calibration.acceptance.get(acceptance_key(method, drafter, structure))
    if fit is None or fit.method != method or (fit.drafter or None) != (drafter or None):
        return None
    return fit


def measured_or_prior(calibration: Calibration | None, method: str, structure: str, target: ModelSpec,
                      draft: ModelSpec | None, output_tokens: float | None = None) -> tuple[AcceptanceModel, str]:
    """The acceptance fit the calibration measured for exactly this method, drafter and structure (over outputs of
    ``output_tokens``: :func:`at_output`), else the method's prior (``draft`` None for copy drafters), and its source:
    the scenario's own and each compared method's."""
    measured = None if calibration is None else calibrated_acceptance(
        calibration, method, draft.name if draft is not None else None, structure)
    if measured is not None:
        return at_output(measured, output_tokens), f"calibration:{calibration.run_id}"
    prior = _prior(method, structure, target, draft)
    return prior, prior.source.split(";")[0]


def _acceptance(s: Scenario, target: ModelSpec, draft: ModelSpec | None, calibration: Calibration | None,
                k_ref: int) -> tuple[AcceptanceModel, str]:
    method, structure = s.speculator.method, s.workload.structure
    drafter = draft.name if draft is not None and method not in COPY_DRAFTERS else None
    base, source = measured_or_prior(calibration, method, structure, target, draft, s.workload.output_tokens)
    given = s.acceptance or AcceptanceInput()
    if given.mean_acceptance_length is not None or given.acceptance_rate is not None or given.per_position:
        model, source = model_from_input(given, k_ref, method, structure, drafter), "input"
        if method in COPY_DRAFTERS:  # a stated AL counts drafted steps only: how often a copy drafter finds a
            model = dataclasses.replace(model, draft_fraction=base.draft_fraction,  # match comes from calibration
                                        draft_fraction_logit=base.draft_fraction_logit,  # or prior
                                        draft_fraction_temperature_slope=base.draft_fraction_temperature_slope,
                                        draft_fraction_output_slope=base.draft_fraction_output_slope,
                                        draft_fraction_output_tokens_up_to=base.draft_fraction_output_tokens_up_to)
    elif source.startswith("calibration"):  # measured on the probe prompts; the workload's prompts accept a little
        model = with_transfer_spread(base)  # differently
    else:
        model = base
    if given.draft_fraction is not None:  # stated: replaces the calibrated / prior fraction at every temperature
        if not 0.0 < given.draft_fraction <= 1.0:
            raise CostModelError("acceptance.draft_fraction", "must be in (0, 1]")
        model = dataclasses.replace(model, draft_fraction=float(given.draft_fraction), draft_fraction_logit=None)
    return model, source


def _context(s: Scenario, gpu: GpuSpec, target: ModelSpec, draft: ModelSpec | None,
             calibration: Calibration | None, catalog_sources: dict[str, str] | None,
             profile: MeasuredEngineProfile | None = None) -> Context:
    engine_profile(s.engine)  # validates the engine name
    method = s.speculator.method
    draft_source = f"catalog:{draft.name}" if draft is not None else "default"
    if method in COPY_DRAFTERS:
        draft, draft_source = None, "none"
    elif method == "mtp" and draft is None:  # vLLM's MTP runs the target's own multi-token-prediction layers
        raise CostModelError("speculator.method", f"'{target.name}' has no MTP layers (no mtp_head for it in the "
                                                  "catalog): vLLM cannot run method 'mtp' for this target")
    elif method in ("eagle", "eagle3") and draft is None:  # vLLM needs a trained head: speculative_config "model"
        raise CostModelError("speculator.method", f"method '{method}' needs an {method.upper()} head trained for "
                                                  f"'{target.name}': name its catalog row in speculator.draft_model")
    notes: tuple[str, ...] = ()
    if calibration is not None:
        mismatch = calibration_mismatch(calibration, s, gpu)
        if mismatch:
            notes = tuple(f"calibration run {calibration.run_id} not used: {m}" for m in mismatch)
            calibration = None
    steps = engine_steps(gpu, s.engine, target, draft, method, calibration, profile)
    k_ref = s.speculator.num_speculative_tokens or METHOD_DEFAULT_K.get(method, 3)
    acc, acc_source = _acceptance(s, target, draft, calibration, k_ref)
    return Context(s, gpu, target, draft, draft_source, calibration, dict(catalog_sources or {}), steps.target_step,
                   steps.draft_step, steps.target_prefill, steps.draft_prefill, steps.source, acc, acc_source, k_ref,
                   notes + steps.notes, s.acceptance is not None and s.acceptance.draft_fraction is not None,
                   steps.profile, steps.spec_source, profile)


@dataclass(frozen=True)
class EngineSteps:
    """The step-time and prefill parameters of one GPU's engine speculating with one drafter, and their sources."""

    target_step: StepTimeParams  # the target's steps on the drafter's engine path
    draft_step: StepTimeParams
    target_prefill: PrefillParams
    draft_prefill: PrefillParams
    source: str  # "default", "calibration:<id>" or "profile:<name>"
    # the measured GPU × vLLM profile the timing came from (with the drafter's stand-in), if any
    profile: MeasuredEngineProfile | None = None
    spec_source: str | None = None  # the speculative engine's timing source where it is not ``source``
    notes: tuple[str, ...] = ()


def _depth(timed: StepTimeParams, stand_in: StepTimeParams) -> str:
    """The stand-in's depth in words, where its host cost per forward was scaled from the timed drafter's layers."""
    if stand_in.proposer_layers == timed.proposer_layers:
        return ""
    return (f" and depth (its host cost per forward scaled to its {stand_in.proposer_layers} layers from "
            f"{timed.proposer_layers}: a draft model's layers are launched from the host)")


def engine_steps(gpu: GpuSpec, engine: str, target: ModelSpec, draft: ModelSpec | None, method: str,
                 calibration: Calibration | None, profile: MeasuredEngineProfile | None) -> EngineSteps:
    """How ``predict``, its compared methods and the capacity planner time the engine (one rule): a calibration
    run's fits (that applies) before a profile's, before the defaults. A drafter's fit is its engine's, so it prices
    the target's steps too; a drafter not timed is priced by a timed drafter of its method (its stand-in:
    ``Calibration.with_stand_in``, ``MeasuredEngineProfile.with_stand_in``); where the calibration timed no drafter
    of the method and the profile did, the profile times it all; else the drafter gets its method's prior.

    Computed once per distinct arguments and engine profile (the defaults read ``ENGINE_PROFILES``, which a
    sweep may replace); calls with a calibration run's or a measured profile's fits, which do not hash, each
    time."""
    return _engine_steps(ENGINE_PROFILES.get(engine), gpu, engine, target, draft, method, calibration, profile)


@cached_when_hashable(1024)
def _engine_steps(_engine_defaults: EngineProfile | None, gpu: GpuSpec, engine: str, target: ModelSpec,
                  draft: ModelSpec | None, method: str, calibration: Calibration | None,
                  profile: MeasuredEngineProfile | None) -> EngineSteps:
    """:func:`engine_steps`; ``_engine_defaults`` (the engine's ``ENGINE_PROFILES`` entry) only keys the cache."""
    notes: tuple[str, ...] = ()
    profiled = None  # the profile with this drafter's fit or its stand-in's, taken once and only where it is needed
    if calibration is not None and draft is not None:
        calibration = calibration.with_stand_in(draft.name, method, draft.num_layers)
        if (target.name in calibration.step_time and draft.name not in calibration.step_time
                and profile is not None and engine == "vllm"):
            profiled = profile.with_stand_in(draft.name, method, draft.num_layers)
        if profiled is not None and profiled.drafter_step(draft.name) is not None:
            # the run timed no drafter of this method and the profile did: its fit of the drafter's engine times the
            # answer, baseline included (one fit for both sides of the ratio). On the H200's EAGLE leases a run
            # without the head's fit priced them within 17-25 %, 2-8 signs wrong per lease; the profile within
            # 6-13 %, 1 sign wrong in 84 points (docs/calibration.md, "A drafter the node did not time")
            notes += (f"calibration run {calibration.timing_source.split(':')[-1]} timed no cycles of {draft.name} "
                      f"or of another {method} drafter: the profile {profile.name} times this answer; calibrate "
                      f"with {draft.name} to time it on your node",)
            calibration = None
    t_step, t_pre, step_source = step_params(gpu, target, engine, calibration, profile)
    d_step, d_pre, d_source = step_params(gpu, draft, engine, calibration)
    stand_in = calibration.drafter_stand_ins.get(draft.name) if calibration is not None and draft is not None else None
    if stand_in is not None and d_source != "default":
        notes += (f"calibration run {d_source.split(':')[-1]} timed no cycles of {draft.name}: its engine is priced "
                  f"by the fit of {stand_in}, the same method ({method}) on the same engine path, at "
                  f"{draft.name}'s size{_depth(calibration.step_time[stand_in], d_step)}; calibrate with "
                  f"{draft.name} to time it",)
    timed = None
    if step_source.startswith("profile") and draft is not None:
        profile = profiled if profiled is not None else profile.with_stand_in(draft.name, method, draft.num_layers)
        timed = profile.drafter_step(draft.name)
    spec_step_source = None
    if timed is not None:  # the profile timed this drafter's engine (or carries another GPU's fit of it)
        d_step, d_pre, d_source = timed, t_pre, step_source
        origin = profile.drafter_origin(draft.name)
        stand_in = dict(profile.drafter_stand_ins).get(draft.name)
        if origin is not None:
            spec_step_source = f"profile:{origin}"
        if stand_in is not None:
            notes += (f"no profile timed cycles of {draft.name}: its engine is priced by the fit of {stand_in}, the "
                      f"same method ({method}) on vLLM {profile.vllm_version}'s same engine path, at {draft.name}'s "
                      f"size{_depth(profile.drafter_step(stand_in), timed)}, timed by {origin or profile.name}; "
                      f"calibrate with {draft.name} to time it on your node",)
        elif origin is not None:
            notes += (f"the profile {profile.name} timed no cycles of {draft.name}: its engine is timed by {origin}",)
    if draft is not None and d_source != "default":
        # a drafter's fit is its engine's: the target's steps and the drafter's forwards fitted together on the
        # path vLLM ran them (calibration.fit.engine_path_records); the joint fit of a run when it is the same
        t_step = d_step
    elif d_source == "default":  # the drafter's per-forward overhead is a wide prior until measured
        d_step = default_drafter_step(gpu, engine, method)
        if draft is not None and step_source.startswith("profile"):
            notes += (f"the profile {profile.name} timed no cycles of {draft.name}: the drafter's cost is the "
                      "uncalibrated prior",)
    return EngineSteps(t_step, d_step, t_pre, d_pre, step_source,
                       profile if step_source.startswith("profile") else None, spec_step_source, notes)


def _setup(ctx: Context, method: str | None = None, draft: ModelSpec | None = None,
           steps: EngineSteps | None = None) -> CycleSetup:
    """The scenario's speculative cycle, or (``method``, ``draft`` timed by ``steps``) another method's on the
    scenario's target and workload."""
    s = ctx.scenario
    method = method or s.speculator.method
    draft = ctx.draft if draft is None and method == s.speculator.method else draft
    tc = forward_cost(ctx.gpu, ctx.target, s.weights_dtype, s.gpu_count, s.kv_cache_dtype)
    dc = forward_cost(ctx.gpu, draft, "bf16", s.gpu_count, s.kv_cache_dtype) if draft is not None else None
    width = 1.0
    tree = s.speculator.num_verify_tokens if method == s.speculator.method else None
    if tree is None and method in ("eagle", "eagle3"):
        tree = engine_profile(s.engine).tree_verify_tokens
    if tree:
        width = max((tree - 1) / ctx.k_ref, 1.0)
    if steps is None:
        steps = EngineSteps(ctx.target_step, ctx.draft_step, ctx.target_prefill, ctx.draft_prefill, ctx.step_source)
    return CycleSetup(method, tc, dc, steps.target_step, steps.draft_step, steps.target_prefill, steps.draft_prefill,
                      s.workload.prompt_tokens, s.workload.output_tokens, width, temperature=s.workload.temperature,
                      staggered=ctx.staggered)


def _k_max(ctx: Context) -> int:
    return max(SEARCH_K, ctx.scenario.speculator.num_speculative_tokens or 1)


@lru_cache(maxsize=8)
def _mc_normals(samples: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The standard-normal draws of the seeded Monte Carlo (acceptance coefficients, step-time parameters, the
    verify / proposer / per-sequence overheads, then the timing residual of the baseline step and the cycle): what
    sample_coefficients(), StepSamples.sample(), StepSamples.with_overheads() and
    StepSamples.with_timing_spread() draw from a fresh default_rng(MC_SEED), drawn once."""
    rng = np.random.default_rng(MC_SEED)
    z_acc, z_step = rng.standard_normal((samples, 3)), rng.standard_normal((samples, 3))
    z_over = rng.standard_normal((samples, 5))
    z_time = rng.standard_normal((samples, 2))  # drawn last: the draws before it do not move
    for z in (z_acc, z_step, z_over, z_time):
        z.flags.writeable = False
    return z_acc, z_step, z_over, z_time


_STEP_FIELDS = operator.attrgetter(*(f.name for f in dataclasses.fields(StepTimeParams)))


@cached_by_identity(1024)
def _params_key(params: StepTimeParams) -> tuple:
    """Every field of ``params``, hashable (the covariance as nested tuples); once per fit object."""
    key = _STEP_FIELDS(params)
    if params.covariance is None:
        return key
    return tuple(tuple(map(tuple, value)) if isinstance(value, list) else value for value in key)


def _params_from_key(key: tuple) -> StepTimeParams:
    """:func:`_params_key` undone (the covariance as nested lists again)."""
    return StepTimeParams(*(list(map(list, value)) if isinstance(value, tuple) else value for value in key))


@cached_by_identity(1024)
def _mc_coefficients(acc: AcceptanceModel, std_normal: np.ndarray) -> np.ndarray:
    """``coefficients_from_normals``, once per acceptance model object: a prior, or the model of stated words
    (read-only: it is shared)."""
    coeffs = coefficients_from_normals(acc, std_normal)
    coeffs.flags.writeable = False
    return coeffs


def _point_samples(params: StepTimeParams) -> StepSamples:
    """``StepSamples.point(params)``, cached per distinct parameters as the Monte Carlo draws are (read-only: it is
    shared)."""
    return _cached_point_samples(_params_key(params))


@lru_cache(maxsize=256)
def _cached_point_samples(key: tuple) -> StepSamples:
    return _read_only(StepSamples.point(_params_from_key(key)))


def _read_only(step: StepSamples) -> StepSamples:
    """``step`` with its arrays made read-only (it is shared through a cache)."""
    for value in vars(step).values():
        if isinstance(value, np.ndarray):
            value.flags.writeable = False
    return step


def _mc_step_samples(target: StepTimeParams, draft: StepTimeParams, samples: int) -> StepSamples:
    """The Monte Carlo step-time draws (efficiencies, fixed, verify / proposer / per-sequence overheads, eager
    drafter, timing spread): a pure function of the two parameter sets and the seed, cached per distinct pair
    (catalog defaults are shared by every scenario on a GPU class, engine and method)."""
    return _cached_mc_step_samples(_params_key(target), _params_key(draft), samples)


@lru_cache(maxsize=256)
def _cached_mc_step_samples(target_key: tuple, draft_key: tuple, samples: int) -> StepSamples:
    target, draft = _params_from_key(target_key), _params_from_key(draft_key)
    _, z_step, z_over, z_time = _mc_normals(samples)
    step = StepSamples.from_normals(target, z_step).with_overheads(target, draft, z_over)
    return _read_only(step.with_timing_spread(target, z_time))


def _grid(ctx: Context, setup: CycleSetup, acc: AcceptanceModel, batch: np.ndarray, samples: int,
          k: int | None = None, compared: tuple[tuple[CycleSetup, AcceptanceModel], ...] = ()) -> Grid:
    """Point estimate over k = 1..k_max (samples == 1), or Monte Carlo draws (row 0 = point) at k alone if given.

    The draws depend only on the seed, not on k: the row-0 values equal the point grid's.
    ``compared``: other methods' (setup, acceptance), evaluated as rows 1.. of the point estimate.
    """
    k_max = _k_max(ctx)
    ks = np.arange(1, k_max + 1) if k is None else np.array([k])
    width = k_max if k is None else k  # r_i for i < k suffice; cumprod is a prefix scan, so values are unchanged
    temperature, output_tokens = ctx.scenario.workload.temperature, ctx.scenario.workload.output_tokens
    if samples == 1 and compared:  # point estimate of the scenario's method (row 0) and the compared methods
        accs = (acc,) + tuple(a for _, a in compared)
        coeffs = np.array([[a.logit_intercept, a.logit_position_slope, a.logit_temperature_slope] for a in accs])
        r = per_position_rates(acc, temperature, width, coeffs)  # row m from coeffs[m]
        fraction = np.array([draft_fraction_at(a, temperature, output_tokens) for a in accs])
        setups = (setup,) + tuple(c for c, _ in compared)
        # each row's target steps on its drafter's engine path, as its own answer prices them: rows that share a
        # target fit are evaluated together (one pass where nothing was timed)
        grid, i = None, 0
        while i < len(setups):
            j = i + 1
            while j < len(setups) and setups[j].target_step == setups[i].target_step:
                j += 1
            part = evaluate_grid(setups[i], batch, ks, r[i:j], fraction[i:j],
                                 _point_samples(setups[i].target_step), drafters=setups[i:j])
            grid, i = part if grid is None else stack_grids(grid, part), j
        return grid
    if samples == 1:  # point estimate only
        r = per_position_rates(acc, temperature, width)[None, :]
        step = _point_samples(ctx.target_step)
    else:
        z_acc, _, z_over, z_time = _mc_normals(samples)
        coeffs = _mc_coefficients(acc, z_acc)
        r = per_position_rates(acc, temperature, width, coeffs)
        step = _mc_step_samples(ctx.target_step, ctx.draft_step, samples)
    fraction = np.full(samples, draft_fraction_at(acc, temperature, output_tokens))
    if samples > 1 and setup.method in COPY_DRAFTERS and not ctx.draft_fraction_given:
        fraction = sample_draft_fraction(float(fraction[0]), z_over[:, 4], z_acc[:, 0])  # row 0 stays the point
    return evaluate_grid(setup, batch, ks, r, fraction, step)


def _littles_law(batch: np.ndarray, latency_s: np.ndarray, rps: float, cap: float) -> tuple[float, bool]:
    """Fixed point B = λ·L(B) (Little's law), L interpolated on the grid; returns (B, saturated)."""
    b = 1.0
    for _ in range(60):
        nxt = rps * float(np.interp(b, batch, latency_s))
        if nxt > cap:
            return cap, True
        if abs(nxt - b) < 1e-4:
            return max(nxt, 1.0), False
        b = max(0.5 * (b + nxt), 1.0)  # damped iteration
    return max(b, 1.0), False


def percentiles(x: np.ndarray, q: tuple[float, ...]) -> np.ndarray:
    """Linear-interpolated percentiles along axis 0 (numpy's default method, without its overhead)."""
    s = np.sort(x, axis=0)
    lo, hi, w_lo, w_hi = _percentile_weights(tuple(q), s.shape[0], s.ndim)
    return s[lo] * w_lo + s[hi] * w_hi


@lru_cache(maxsize=16)
def _percentile_weights(q: tuple[float, ...], n: int, ndim: int) -> tuple[np.ndarray, ...]:
    """The rows either side of each percentile of ``n`` sorted values and their weights (read-only)."""
    pos = np.asarray(q, dtype=float) / 100.0 * (n - 1)
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, n - 1)
    w = (pos - lo).reshape((-1,) + (1,) * (ndim - 1))
    out = (lo, hi, 1 - w, w)
    for a in out:
        a.flags.writeable = False
    return out


def _break_even(batch: Sequence[float], speedup: Sequence[float]) -> float | None:
    """First concurrency where the fixed-k speedup falls below 1 (log-linear interpolation)."""
    if not speedup[0] >= 1.0:
        return None
    for i in range(1, len(batch)):
        if not speedup[i] >= 1.0:
            s0, s1 = speedup[i - 1], speedup[i]
            t = (s0 - 1.0) / (s0 - s1)
            return float(math.exp(math.log(batch[i - 1]) + t * (math.log(batch[i]) - math.log(batch[i - 1]))))
    return None


def dynamic_table(points: list[int], best_k: list[int], gains: list[float]) -> list[list[int]]:
    """The best k per concurrency band, in the form of vLLM's `num_speculative_tokens_per_batch_size`:
    [[lo, hi, k], …]; k = 0 (off) where no k gains. Advice only: the command runs one k (speculative_config)."""
    rows: list[list[int]] = []
    for i, p in enumerate(points):
        hi = points[i + 1] - 1 if i + 1 < len(points) else DYNAMIC_TABLE_MAX_BATCH
        k = best_k[i] if gains[i] > 1.0 else 0
        if rows and rows[-1][2] == k:
            rows[-1][1] = hi
        else:
            rows.append([p, hi, k])
    return rows


# ----------------------------------------------------------------------------------------------- predict
def predict(scenario: Scenario, gpu: GpuSpec, target: ModelSpec, draft: ModelSpec | None,
            calibration: Calibration | None = None, catalog_sources: dict[str, str] | None = None,
            samples: int = MC_SAMPLES, compare_methods: bool = True,
            profile: MeasuredEngineProfile | None = None, heads: Mapping[str, ModelSpec] | None = None) -> Prediction:
    """The answer for one scenario. ``profile``: a measured GPU × vLLM profile (:func:`matching_profile`) used for
    the timing where no calibration run applies. ``heads``: the catalog's EAGLE / EAGLE-3 head for the target by
    method, which the compared methods are priced with (:func:`_compared`)."""
    _validate(scenario, draft)
    s, w = scenario, scenario.workload
    ctx = _context(s, gpu, target, draft, calibration, catalog_sources, profile)
    checks = check_draft(target, draft, s.speculator.method) if s.speculator.method in METHODS else []
    checks += check_tensor_parallel(target, s.gpu_count, draft, s.speculator.method)
    context_tokens = w.prompt_tokens + w.output_tokens
    mem0, res_b, res_s = _capacity(ctx)
    if mem0.max_concurrency_baseline < 1 or mem0.max_concurrency_speculative < 1:
        return _prediction(_infeasible(ctx, mem0, checks))
    ctx = _with_admissions(ctx, res_b, res_s)
    setup = _setup(ctx)

    # Concurrency: given (clients; those beyond the resident cap queue), or Little's law on a dense grid.
    saturated = False
    if w.concurrency is not None:
        conc_base = conc_spec = float(w.concurrency)
        conc_source = "input"
    else:
        dense = np.unique(np.geomspace(1, max(res_b, res_s, 1.0), 40).round(3))
        g1 = _grid(ctx, setup, ctx.acceptance, dense, 1)
        lat_b = g1.latency_base_s[0, :, 0]
        lat_s = g1.latency_spec_s[0].min(axis=-1) if s.speculator.num_speculative_tokens is None \
            else g1.latency_spec_s[0, :, s.speculator.num_speculative_tokens - 1]
        rps = w.requests_per_second if w.requests_per_second is not None else 1.0
        conc_base, sat_b = _littles_law(dense, lat_b, rps, res_b)
        conc_spec, sat_s = _littles_law(dense, np.minimum(lat_s, lat_b * 1e9), rps, res_s)
        if w.output_tokens == 1:
            conc_spec, sat_s = conc_base, sat_b
        saturated = sat_b or sat_s
        conc_source = "input:requests_per_second" if w.requests_per_second is not None else "default"

    top = max(max(CURVE_CONCURRENCY), conc_base, conc_spec)
    caps = {c for c in (res_b, res_s) if c < top}  # queued() reads the grid at the caps
    batch = np.array(sorted(set(CURVE_CONCURRENCY) | {conc_base, conc_spec} | caps), dtype=float)
    ib, isp = int(batch.searchsorted(conc_base)), int(batch.searchsorted(conc_spec))
    at = _workload_point(batch, ib, isp, saturated, res_b, res_s)
    # Point estimate over every k: row 0 the scenario's method, rows 1.. the compared methods.
    compared = _compared(ctx, heads or {}) if compare_methods else ()
    grid = queued(_grid(ctx, setup, ctx.acceptance, batch, 1,
                        compared=tuple((c.setup, c.acceptance) for c in compared)), res_b, res_s)

    # k: given, or the best expected end-to-end speedup at the workload's concurrency.
    sp_point = at.speedup(grid)[0]  # (K,)
    k = s.speculator.num_speculative_tokens or int(sp_point.argmax() + 1)
    # Monte Carlo draws (row 0 = the point estimate) at the chosen k only: the intervals are only asked there.
    # One percentile pass: column 0 = the workload (baseline at its concurrency vs speculation at its own, or the
    # rates sustained where saturated: _workload_point), then the curve's concurrencies.
    mc = queued(_grid(ctx, setup, ctx.acceptance, batch, samples, k), res_b, res_s)
    curve_idx = batch.searchsorted(CURVE_CONCURRENCY).tolist()
    mc_sp = np.column_stack((at.speedup(mc)[:, 0],
                             mc.latency_base_s[:, curve_idx, 0] / mc.latency_spec_s[:, curve_idx, 0]))
    pct = percentiles(mc_sp, INTERVAL)  # (2, 1 + len(curve))
    x0 = float(mc_sp[0, 0])
    expected, low, high = x0, min(float(pct[0, 0]), x0), max(float(pct[1, 0]), x0)  # point, and the interval widened to contain it

    mem = memory_report(gpu, target, ctx.draft, conc_spec, context_tokens, s.weights_dtype, s.gpu_count,
                        s.gpu_memory_utilization, s.vram_gb, k, s.kv_cache_dtype)
    answer = _assemble(ctx, grid, pct[:, 1:], batch, ib, isp, curve_idx, k, (expected, low, high), mem, checks,
                       conc_base, conc_spec, conc_source, saturated, compared, (res_b, res_s), at)
    return _prediction(answer)


class WorkloadPoint(NamedTuple):
    """Where the answer's speedup is read on the grid: the grid indices of the baseline and the speculative
    operating points, and the factor on their latency ratio."""
    base: int
    spec: int
    scale: float

    def speedup(self, grid: Grid) -> np.ndarray:
        """The workload's speedup per grid row and k: (rows, K)."""
        return grid.latency_base_s[:, self.base, 0][:, None] / grid.latency_spec_s[:, self.spec, :] * self.scale


def _workload_point(batch: np.ndarray, ib: int, isp: int, saturated: bool, res_b: float, res_s: float
                    ) -> WorkloadPoint:
    """Below capacity both servers carry the arrival rate, so the speedup is the latency ratio at their operating
    points. Once the rate exceeds what either sustains, its queue grows without end (no steady latency): the speedup
    is then the ratio of the rates one server sustains, B_max / L(B_max) (Little's law at the resident caps), which
    is what a closed loop beyond both caps answers (queued(): L(C) = L(B)·C/B)."""
    if not saturated:
        return WorkloadPoint(ib, isp, 1.0)
    return WorkloadPoint(int(batch.searchsorted(res_b)), int(batch.searchsorted(res_s)), res_s / res_b)


def _with_admissions(ctx: Context, res_b: float, res_s: float) -> Context:
    """``ctx`` with how its requests are admitted (Context.staggered), given the servers' resident caps."""
    w = ctx.scenario.workload
    staggered = w.requests_per_second is not None or (w.concurrency is not None and w.concurrency > max(res_b, res_s))
    return dataclasses.replace(ctx, staggered=staggered) if staggered else ctx


def _capacity(ctx: Context) -> tuple[MemoryReport, float, float]:
    """The memory budget for one sequence and the sequences resident at once without / with speculation (KV
    capacity at the mean in-flight context, max_num_seqs); more clients queue."""
    s, w = ctx.scenario, ctx.scenario.workload
    k_mem = s.speculator.num_speculative_tokens or ctx.k_ref
    mem = memory_report(ctx.gpu, ctx.target, ctx.draft, 1, w.prompt_tokens + w.output_tokens, s.weights_dtype,
                        s.gpu_count, s.gpu_memory_utilization, s.vram_gb, k_mem, s.kv_cache_dtype)
    res_b = float(max(resident_sequences(mem.kv_space_gb_baseline, mem.kv_bytes_per_token_target, w.prompt_tokens,
                                         w.output_tokens), 1))
    res_s = float(max(resident_sequences(mem.kv_space_gb, mem.kv_bytes_per_token_target
                                         + mem.kv_bytes_per_token_draft, w.prompt_tokens, w.output_tokens,
                                         k_mem), 1))
    if w.output_tokens == 1:  # the only token comes from prefill: the speculative engine never drafts, both are one
        res_s = res_b
    return mem, res_b, res_s


def _prediction(answer: dict[str, Any]) -> Prediction:
    return Prediction(answer, finite_json(answer))


def finite_json(answer: Any) -> str:
    """The answer as JSON text: orjson's compact UTF-8, each float in its shortest round-trip form (1e-05 as
    0.00001), the values json.dumps wrote in a tenth of its time (0.01 against 0.10 ms for an answer). No NaN or
    infinity reaches an answer: orjson would write one as null, so the tree is checked first, and a non-finite
    number is a CostModelError naming where it appeared (the walk that builds the path only runs to name it)."""
    if not _all_finite(answer):
        _find_non_finite(answer)
    return orjson.dumps(answer, default=_float_subclass).decode()


def _float_subclass(value: Any) -> float:
    """A float's subclass (numpy's float64) as the float it is, as json.dumps took it; anything else is refused."""
    if isinstance(value, float):
        return float(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _all_finite(tree: Any) -> bool:
    """Whether every float in ``tree`` (dicts, lists and tuples of JSON values) is finite: one pass, no paths."""
    stack = [tree]
    pop, push, isfinite = stack.pop, stack.extend, math.isfinite
    while stack:
        value = pop()
        kind = type(value)
        if kind is float:
            if not isfinite(value):
                return False
        elif kind is dict:
            push(value.values())
        elif kind is list or kind is tuple:
            push(value)
        elif kind is str or kind is int or kind is bool or value is None:
            continue
        elif isinstance(value, float):  # subclasses, as _find_non_finite walks them
            if not isfinite(value):
                return False
        elif isinstance(value, dict):
            push(value.values())
        elif isinstance(value, (list, tuple)):
            push(value)
    return True


def _find_non_finite(answer: Any, path: str = "") -> Any:
    if isinstance(answer, float) and not math.isfinite(answer):
        raise CostModelError("scenario", f"the inputs give a non-finite {path or 'value'}; check them")
    if isinstance(answer, dict):
        for key, value in answer.items():
            _find_non_finite(value, f"{path}.{key}" if path else str(key))
    elif isinstance(answer, (list, tuple)):
        for i, value in enumerate(answer):
            _find_non_finite(value, f"{path}[{i}]")
    return answer


def _infeasible(ctx: Context, mem: MemoryReport, checks: list) -> dict[str, Any]:
    """The answer for a deployment that cannot exist: why, first; no speedup, latency or cost for it."""
    s = ctx.scenario
    where = f"{s.gpu_count}× {ctx.gpu.name}" if s.gpu_count > 1 else ctx.gpu.name
    usable = mem.usable_gb * s.gpu_count
    why = beyond_context_window(ctx.target, mem.context_tokens)
    if why is None and mem.max_concurrency_baseline < 1:
        why = (f"the target alone does not fit: {ctx.target.name} {s.weights_dtype} weights "
               f"{mem.target_weights_gb:.1f} GB + runtime {mem.activation_reserve_gb:.1f} GB + one sequence's KV "
               f"exceed the {usable:.1f} GB usable on {where}; use more GPUs (gpu_count) or smaller weights")
    elif why is None:
        why = (f"the drafter does not fit: draft weights {mem.draft_weights_gb:.1f} GB "
               f"(+ {mem.draft_reserve_gb:.1f} GB reserved beside them) + both KV caches for one "
               f"sequence of {mem.context_tokens} tokens exceed what the target leaves of {usable:.1f} GB on {where}")
    none3 = {"baseline": None, "speculative": None}
    answer: dict[str, Any] = {
        "decision": "no-go", "reasons": [why] + [f"{i.severity}: {i.message}" for i in checks],
        "speedup": {"expected": None, "low": None, "high": None, "threshold": GO_THRESHOLD, "decode": None,
                    "interval": f"{INTERVAL[0]:g}-{INTERVAL[1]:g} percentile"},
        "num_speculative_tokens": None,
        "concurrency": {**none3, "source": "input" if s.workload.concurrency is not None else "default",
                        "saturated": False, "resident_baseline": mem.max_concurrency_baseline,
                        "resident_speculative": mem.max_concurrency_speculative, "queued": False},
        "tpot_ms": dict(none3), "ttft_ms": dict(none3),
        "latency_ms": {"baseline": None, "speculative": None, "prefill_share": None},
        "throughput_tok_s": dict(none3), "step_ms": None, "acceptance": None,
        "memory": {**mem.to_dict(), "kv_space_gb": mem.kv_space_gb, "fits": False, "deployable": False},
        "curve": [], "break_even_concurrency": None, "dynamic_sd": [], "methods": [], "tco": None,
        "vllm": {"speculative_config": None, "serve_flags": None},
        "checks": [i.to_dict() for i in checks], "sources": dict(ctx.catalog_sources),
        "cost_model_version": COST_MODEL_VERSION,
        "calibration_run_id": ctx.calibration.run_id if ctx.calibration is not None else None,
        "engine_profile": profile_summary(ctx.profile),
    }
    answer["provenance"] = {"decision": f"catalog:{ctx.target.name}", "reasons": f"catalog:{ctx.target.name}",
                            "memory.usable_gb": "input" if s.vram_gb is not None else f"catalog:{ctx.gpu.name}",
                            "memory.target_weights_gb": f"catalog:{ctx.target.name}",
                            "memory.draft_weights_gb": ctx.draft_source}
    return answer


def _assemble(ctx: Context, grid: Grid, curve_pct: np.ndarray, batch: np.ndarray, ib: int, isp: int,
              curve_idx: list[int], k: int, speedup: tuple[float, float, float], mem: MemoryReport, checks: list,
              conc_base: float, conc_spec: float, conc_source: str, saturated: bool,
              compared: tuple[Compared, ...], resident: tuple[float, float], at: WorkloadPoint) -> dict[str, Any]:
    """grid: point estimate over (1 + compared methods, nB, k_max); curve_pct: (2, len(CURVE_CONCURRENCY))
    Monte Carlo percentiles of the speedup at the chosen k."""
    s, w = ctx.scenario, ctx.scenario.workload
    ki = k - 1
    expected, low, high = speedup
    res_b, res_s = resident
    o = w.output_tokens
    ms = 1e3
    # Point-estimate arrays as Python lists (one conversion each; indexing numpy scalars is slow).
    lat_base = grid.latency_base_s[0, :, 0]  # (nB,)
    lat_spec = grid.latency_spec_s[0]  # (nB, K)
    sp = lat_base[:, None] / lat_spec  # (nB, K) == grid.speedup[0]
    tpot_base_l = grid.tpot_base_s[0, :, 0].tolist()
    tpot_spec_k = grid.tpot_spec_s[0, :, ki].tolist()
    lat_base_l, lat_spec_k = lat_base.tolist(), lat_spec[:, ki].tolist()
    step_base_l = grid.step_base_s[0, :, 0].tolist()
    tpot_b, tpot_s = tpot_base_l[ib] * ms, tpot_spec_k[isp] * ms
    ttft_b, ttft_s = float(grid.ttft_base_s[0, 0, 0]) * ms, float(grid.ttft_spec_s[0, 0, 0]) * ms
    pre_b = ttft_b + float(grid.prefill_interleave_base_s[0, ib, 0]) * ms
    pre_s = ttft_s + float(grid.prefill_interleave_spec_s[0, isp, ki]) * ms
    lat_b, lat_s = lat_base_l[ib] * ms, lat_spec_k[isp] * ms
    # queueing (queued()): L(C) = L(B)·C/B, so the wait is L(C)·(1 − B/C)
    wait_b = lat_b * (1.0 - min(conc_base, res_b) / conc_base)
    wait_s = lat_s * (1.0 - min(conc_spec, res_s) / conc_spec)
    thr_b = conc_base * o / (lat_b / ms)
    thr_s = conc_spec * o / (lat_s / ms)
    prefill_share = pre_b / (lat_b - wait_b)
    al = float(grid.al[0, 0, ki])
    tokens_per_cycle = float(grid.tokens_per_cycle[0, 0, ki])
    r = grid.per_position[0, :k]  # == per_position_rates(ctx.acceptance, w.temperature, k) (prefix of the scan)
    verify_isp, draft_isp = float(grid.verify_s[0, isp, ki]), float(grid.draft_s[0, isp, ki])
    verify_ratio = verify_isp / (step_base_l[isp] - s_fixed(ctx))
    draft_ratio = draft_isp / max(k, 1) / step_base_l[isp]

    # Curve over concurrency at the chosen k, plus the best k per point.
    # vLLM caps the dynamic table's entries at num_speculative_tokens: the best k per point is searched up to k.
    sp_k = sp[:, ki].tolist()
    best_k_all = (sp[:, :k].argmax(axis=1) + 1).tolist()
    sp_best_all = sp[:, :k].max(axis=1).tolist()  # == sp[i, argmax]
    lows, highs = curve_pct.tolist()
    curve, best_ks, best_gain, fixed_curve = [], [], [], []
    for j, (c, i) in enumerate(zip(CURVE_CONCURRENCY, curve_idx)):
        e = sp_k[i]
        bk = best_k_all[i]
        best_ks.append(bk)
        best_gain.append(sp_best_all[i])
        fixed_curve.append(e)
        curve.append({"concurrency": c, "speedup": e, "low": min(lows[j], e), "high": max(highs[j], e),
                      "best_k": bk, "speedup_best_k": sp_best_all[i],
                      "tpot_ms_baseline": tpot_base_l[i] * ms,
                      "tpot_ms_speculative": tpot_spec_k[i] * ms,
                      "fits": c <= mem.max_concurrency_speculative, "queued": c > res_s})
    # The band holding the workload's concurrency runs the answer's k (off if it loses there).
    c_w = max(int(min(conc_spec, res_s)), 1)  # the batch vLLM runs there (the rest queue)
    bands = dict(zip(CURVE_CONCURRENCY, zip(best_ks, best_gain)))
    bands[c_w] = (k, sp_k[isp])
    points = sorted(bands)
    table = dynamic_table(points, [bands[p][0] for p in points], [bands[p][1] for p in points])
    break_even = _break_even(CURVE_CONCURRENCY, fixed_curve)

    # TCO: baseline vs speculation at the command's k (one k at every concurrency, as the command runs:
    # vllm_config.speculative_config), each at its own best operating point: under the stated SLO on the curve's
    # concurrencies, or — no SLO stated — at the baseline's end-to-end latency at the workload's concurrency
    # (iso-latency; the workload's concurrency is a candidate).
    gpu_hour = s.gpu_hour_usd if s.gpu_hour_usd is not None else ctx.gpu.gpu_hour_usd
    if s.slo is not None:
        slo, slo_source, idx = s.slo, "input", curve_idx
    else:
        slo, slo_source, idx = Slo(latency_ms=lat_b), IMPLICIT_SLO_SOURCE, list(range(len(batch)))
    conc = batch[idx]
    lat_curve_b = lat_base[idx]
    tpot_curve_b = grid.tpot_base_s[0, idx, 0] * ms
    lat_curve_s = lat_spec[idx, ki]
    tpot_curve_s = grid.tpot_spec_s[0, idx, ki] * ms
    points = {
        "baseline": best_operating_point(conc, conc * o / lat_curve_b, tpot_curve_b, lat_curve_b * ms,
                                         np.full(len(conc), ttft_b), mem.max_concurrency_baseline, slo),
        "speculative": best_operating_point(conc, conc * o / lat_curve_s, tpot_curve_s, lat_curve_s * ms,
                                            np.full(len(conc), ttft_s), mem.max_concurrency_speculative, slo),
    }
    load_tok_s = None
    if s.load is not None:
        load_tok_s = s.load.output_tokens_per_second or (
            s.load.requests_per_second * o if s.load.requests_per_second else None)
    elif w.requests_per_second is not None:
        load_tok_s = w.requests_per_second * o
    tco = tco_report(gpu_hour, s.gpu_count, s.hours_per_month, {"baseline": thr_b, "speculative": thr_s},
                     points, load_tok_s, {"tpot_ms": slo.tpot_ms, "ttft_ms": slo.ttft_ms, "latency_ms": slo.latency_ms,
                                         "source": slo_source}).to_dict()
    tco["gpu_hour_usd_date"] = ctx.gpu.gpu_hour_usd_date if s.gpu_hour_usd is None else None

    # Decision.
    blocking = tuple(i.message for i in checks if i.severity == "error")
    outside = _outside_calibration(ctx, max(min(conc_base, res_b), min(conc_spec, res_s)))  # the engine's batch
    decision, why = decide(DecisionInput(low, high, True, blocking, outside))  # (infeasible: _infeasible)
    reasons = list(why)
    if o == 1:
        reasons.append("one output token: it comes from prefill, so there is no decode to speculate on")
    queued_b, queued_s = conc_base > res_b, conc_spec > res_s
    if queued_b or queued_s:
        reasons.append(f"concurrency {conc_spec:g} exceeds the {res_s:g} sequences whose KV fits with the drafter "
                       f"({res_b:g} without): the others queue, and latency includes the wait")
    sustained = (res_b / lat_base_l[at.base], res_s / lat_spec_k[at.spec]) if saturated else None
    reasons += _reasons(ctx, k, al, expected, low, high, prefill_share, verify_ratio, draft_ratio,
                        (conc_base, conc_spec), mem, break_even, sustained, checks, table)

    methods = _compare_methods(ctx, grid, at, compared) if compared else []
    vcfg = speculative_config(s.speculator.method, k, ctx.draft if ctx.draft_source.startswith("catalog") else None,
                              w.temperature)
    acc_source = ctx.acceptance_source
    answer: dict[str, Any] = {
        "decision": decision,
        "reasons": reasons,
        "speedup": {"expected": expected, "low": low, "high": high, "threshold": GO_THRESHOLD,
                    "decode": float(grid.tpot_base_s[0, ib, 0] / grid.tpot_spec_s[0, isp, ki]),
                    "interval": f"{INTERVAL[0]:g}-{INTERVAL[1]:g} percentile"},
        "num_speculative_tokens": k,
        "concurrency": {"baseline": conc_base, "speculative": conc_spec, "source": conc_source,
                        "saturated": saturated, "resident_baseline": min(conc_base, res_b),
                        "resident_speculative": min(conc_spec, res_s), "queued": queued_b or queued_s},
        "tpot_ms": {"baseline": tpot_b, "speculative": tpot_s},
        "ttft_ms": {"baseline": ttft_b, "speculative": ttft_s},
        "latency_ms": {"baseline": {"prefill": pre_b, "decode": lat_b - pre_b - wait_b, "queue": wait_b,
                                    "total": lat_b},
                       "speculative": {"prefill": pre_s, "decode": lat_s - pre_s - wait_s, "queue": wait_s,
                                       "total": lat_s},
                       "prefill_share": prefill_share},
        "throughput_tok_s": {"baseline": thr_b, "speculative": thr_s},
        "step_ms": {"decode": float(grid.step_base_s[0, isp, 0]) * ms, "cycle": float(grid.cycle_s[0, isp, ki]) * ms,
                    "verify": float(grid.verify_s[0, isp, ki]) * ms, "draft": float(grid.draft_s[0, isp, ki]) * ms,
                    "verify_to_decode_ratio": verify_ratio},
        "acceptance": {"mean_acceptance_length": al, "per_position": [float(x) for x in r],
                       "acceptance_rate": float((al - 1.0) / k), "tokens_per_cycle": tokens_per_cycle,
                       "draft_fraction": draft_fraction_at(ctx.acceptance, w.temperature, w.output_tokens),
                       "temperature": w.temperature, "source": acc_source},
        "memory": {**mem.to_dict(), "kv_space_gb": mem.kv_space_gb, "deployable": True},
        "curve": curve,
        "break_even_concurrency": break_even,
        "dynamic_sd": table,
        "methods": methods,
        "tco": tco,
        "vllm": {"speculative_config": vcfg,
                 "serve_flags": serve_flags(ctx.target, vcfg, s.gpu_count, s.gpu_memory_utilization, s.weights_dtype,
                                            s.kv_cache_dtype, mem.max_model_len)},
        "checks": [i.to_dict() for i in checks],
        "sources": dict(ctx.catalog_sources),  # catalog row → its datasheet / config.json source
        "cost_model_version": COST_MODEL_VERSION,
        "calibration_run_id": ctx.calibration.run_id if ctx.calibration is not None else None,
        "engine_profile": profile_summary(ctx.profile),
    }
    answer["provenance"] = _provenance(ctx, answer, acc_source, conc_source)
    return answer


def s_fixed(ctx: Context) -> float:
    """Engine fixed overhead excluded from the verify/decode ratio (ratio of forward passes, as in design.md §1)."""
    return ctx.target_step.fixed_overhead_s


def _outside_calibration(ctx: Context, concurrency: float) -> tuple[str, ...]:
    """Why the timing that prices this answer did not measure it: ``concurrency``, the batch the engine runs (the
    client's concurrency up to the sequences whose KV fits: the others wait), above the calibration's or the
    profile's largest batch, or a temperature outside the calibration's."""
    cal, profile = ctx.calibration, ctx.profile
    if profile is not None and ctx.step_source.startswith("profile") and concurrency > profile.max_batch_measured:
        # beyond its largest batch a profile extrapolates too: on an H100 (vLLM 0.24) steps of 512 and 1,024
        # sequences were host-bound, 40.6 us a sequence, and priced 5-35 % fast (docs/gpu-closed-loop.md)
        return (f"concurrency {concurrency:g} > the largest batch the profile {profile.name} timed "
                f"({profile.max_batch_measured})",)
    if cal is None or not ctx.step_source.startswith("calibration"):
        return ()
    out = []
    if concurrency > cal.max_batch_calibrated:
        out.append(f"concurrency {concurrency:g} > calibrated max batch {cal.max_batch_calibrated}")
    lo, hi = cal.temperature_range
    t = ctx.scenario.workload.temperature
    if ctx.acceptance_source.startswith("calibration") and not lo <= t <= hi:
        out.append(f"temperature {t:g} outside calibrated {lo:g}–{hi:g}")
    return tuple(out)


def _reasons(ctx: Context, k: int, al: float, expected: float, low: float, high: float, prefill_share: float,
             verify_ratio: float, draft_ratio: float, concurrency: tuple[float, float], mem: MemoryReport,
             break_even: float | None, sustained: tuple[float, float] | None, checks: list,
             table: list[list[int]]) -> list[str]:
    """``concurrency``: the requests in flight without / with speculation (they differ at an arrival rate: a
    faster server holds fewer). ``sustained``: the requests per second one server sustains without / with
    speculation, where the arrival rate exceeds either (None below capacity). ``table``: the best k per
    concurrency band (``dynamic_sd``)."""
    w = ctx.scenario.workload
    conc = concurrency[1]
    if sustained is not None:
        where = "in the rate one server sustains,"
    elif concurrency[0] != conc:
        where = f"at concurrency {concurrency[0]:.3g} without speculation and {conc:.3g} with it,"
    else:
        where = f"at concurrency {conc:g}"
    out = [f"expected speedup {expected:.2f}× (interval {low:.2f}–{high:.2f}×) {where} with k={k}",
           f"AL {al:.2f} at temperature {w.temperature:g} ({w.structure}, {ctx.acceptance_source})"]
    share = f"prefill is {prefill_share * 100:.0f} % of latency"
    out.append(share + (" (prefill-dominated: speculation only speeds up decode)"
                        if prefill_share > PREFILL_SHARE_FLAG else ""))
    out.append(f"verify cost {verify_ratio:.2f}× decode at concurrency {conc:.3g}")
    if ctx.scenario.speculator.method in MODEL_DRAFTERS:
        out.append(f"one draft step costs {draft_ratio * 100:.0f} % of a target step")
    if break_even is not None:
        out.append(f"speculation stops paying off above concurrency {break_even:.0f}")
    if len({row[2] for row in table}) > 1:
        bands = ", ".join(f"{lo}-{hi}: {'off' if kb == 0 else kb}" for lo, hi, kb in table)
        out.append(f"the best k varies with concurrency ({bands}; dynamic_sd); the command keeps k={k} throughout: "
                   f"vLLM 0.24 runs a per-batch-size k table on a slower engine path (EAGLE-3 decoded 1.3-2.9× as "
                   f"slowly at the same k on an H100)")
    dtype = ctx.scenario.weights_dtype
    if dtype in PREQUANTIZED:
        out.append(f"{dtype} weights: serve an {checkpoint_of(ctx.target, dtype)[1:-1]} (vLLM reads its "
                   f"quantization from its config.json), not the bf16 repository")
    if mem.max_model_len is not None:
        window_gb = mem.context_window_tokens * (mem.kv_bytes_per_token_target + mem.kv_bytes_per_token_draft) / 1e9
        out.append(f"--max-model-len {mem.max_model_len}: vLLM starts only if its KV cache holds one request of that "
                   f"length, and {ctx.target.name}'s {mem.context_window_tokens:,}-token window needs {window_gb:.1f} "
                   f"GB of KV: more than the {mem.kv_space_gb:.1f} GB priced here, less a "
                   f"{MAX_MODEL_LEN_RESERVE_GB:g} GB margin")
    if mem.concurrency_lost > 0:
        out.append(f"drafter costs {mem.concurrency_lost} concurrent sequences of KV space "
                   f"({mem.max_concurrency_speculative} vs {mem.max_concurrency_baseline})")
    if sustained is not None:
        out.append(f"saturated: one server sustains {sustained[0]:.3g} req/s without speculation and "
                   f"{sustained[1]:.3g} with; at {w.requests_per_second:g} req/s requests queue without end, so the "
                   f"speedup is the ratio of these rates, and tco.gpus_needed says how many GPUs carry the load")
    if ctx.acceptance_source.startswith("prior"):
        out.append("acceptance from published priors, not measured on your prompts: calibrate to narrow")
    out += _past_the_probes(ctx.acceptance, w.output_tokens)
    out += [f"{i.severity}: {i.message}" for i in checks]
    out += list(ctx.calibration_notes)
    if ctx.profile is not None:
        out.append(f"timing from the measured profile {ctx.profile.name}"
                   + (f" ({'; '.join(ctx.profile.behaviour)})" if ctx.profile.behaviour else ""))
    return out


def _past_the_probes(acc: AcceptanceModel, output_tokens: int) -> list[str]:
    """A copy drafter's outputs longer than its drafting share is read (``draft_fraction_at``: twice the probes'
    longest output): the share is held there, and longer outputs draft and accept more. On an H100 (SmolLM2, vLLM
    0.24, n-gram) outputs of 252-467 tokens read at 182-247 were answered a median 41 % low (16.5 % at the probes'
    length), every interval covering (docs/gpu-closed-loop.md, "Drafting along the output, end to end")."""
    up_to = acc.draft_fraction_output_tokens_up_to
    if acc.draft_fraction_logit is None or not acc.draft_fraction_output_slope or not up_to or output_tokens <= up_to:
        return []
    return [f"outputs of {output_tokens} tokens are longer than the calibration's drafting share is read ({up_to:.0f} "
            f"tokens, twice its probes' longest): {acc.method} drafts and accepts more along longer outputs, so this "
            f"answer is likely low; calibrate with `advisor calibrate --max-tokens {output_tokens}` to measure them"]


def profile_summary(profile: MeasuredEngineProfile | None) -> dict[str, Any] | None:
    """What an answer says of the profile that timed it (``engine_profile``), and ``GET /v1/engine-profiles``."""
    if profile is None:
        return None
    return {"name": profile.name, "gpu": profile.gpu, "applied_to": profile.applied_to or profile.gpu,
            "vllm_version": profile.vllm_version,
            "behaviour": list(profile.behaviour), "drafters": [name for name, _ in profile.drafters],
            "drafters_carried": dict(profile.drafter_origins), "drafters_stand_in": dict(profile.drafter_stand_ins),
            "drafter_methods": dict(profile.drafter_methods),
            "source": profile.source}


@dataclass(frozen=True)
class Compared:
    method: str
    drafter: ModelSpec | None
    setup: CycleSetup
    acceptance: AcceptanceModel
    drafter_source: str  # "none" (copy drafters), "catalog:<name>" or "default:synthesized head …"
    acceptance_source: str
    timing_source: str


_SYNTHESIZED = "default:synthesized head (vLLM needs a head trained for this target)"


@lru_cache(maxsize=256)
def _synthesized_head(target: ModelSpec, method: str) -> ModelSpec:
    """A compared method's head where the catalog has none for ``target`` (pure: cached per target)."""
    return synthesized_head(target, f"{method}_head")


@lru_cache(maxsize=256)
def _prior(method: str, structure: str, target: ModelSpec, head: ModelSpec | None) -> AcceptanceModel:
    """A compared method's prior acceptance (pure: cached per target and head)."""
    return prior_acceptance(method, structure, target, head)


COMPARED_HEAD_METHODS = ("eagle3", "eagle")  # the compared methods that need a head trained for the target


def compared_heads(target: ModelSpec, models: Iterable[ModelSpec]) -> dict[str, ModelSpec]:
    """Of ``models`` (a catalog), the EAGLE and EAGLE-3 head for ``target`` (method -> spec; the first by name of
    the method's kind that fits it, :func:`check_draft`): what :func:`predict`'s compared methods are priced with."""
    specs = sorted(models, key=lambda m: m.name)
    heads = {m: next((spec for spec in specs if spec.kind in METHOD_KINDS[m] and not any(
        i.severity == "error" for i in check_draft(target, spec, m))), None) for m in COMPARED_HEAD_METHODS}
    return {m: spec for m, spec in heads.items() if spec is not None}


def _compared(ctx: Context, heads: Mapping[str, ModelSpec]) -> tuple[Compared, ...]:
    """The methods compared with the scenario's: n-gram, suffix, EAGLE-3, EAGLE, each priced as its own answer
    would price it: the catalog's head for the target (``heads``; else a synthesized one), timed by the rule of the
    scenario's own drafter (:func:`engine_steps`: a calibration's or a profile's fit of that head's engine, a
    timed head of its method standing in, else the method's prior), with the calibration's acceptance fit of that
    method and head where it measured one (else the prior). Point estimates only; the scenario's resident caps."""
    out = []
    s, structure = ctx.scenario, ctx.scenario.workload.structure
    for m in ("ngram", "suffix", "eagle3", "eagle"):
        if m == s.speculator.method:
            continue
        head, source = None, "none"
        if m in heads:
            head, source = heads[m], f"catalog:{heads[m].name}"
        elif m not in COPY_DRAFTERS:
            head, source = _synthesized_head(ctx.target, m), _SYNTHESIZED
        steps = engine_steps(ctx.gpu, s.engine, ctx.target, head, m, ctx.calibration, ctx.version_profile)
        acc, acc_source = measured_or_prior(ctx.calibration, m, structure, ctx.target, head,
                                            s.workload.output_tokens)
        setup = _setup(ctx, m, head, steps)
        out.append(Compared(m, head, setup, acc, source, acc_source, steps.spec_source or steps.source))
    return tuple(out)


def _compare_methods(ctx: Context, grid: Grid, at: WorkloadPoint,
                     compared: tuple[Compared, ...]) -> list[dict[str, Any]]:
    """The scenario's method (grid row 0) against the compared methods (rows 1..), at the workload's concurrency."""
    sp = at.speedup(grid)  # (1 + M, K)
    sp_all, best_all = sp.tolist(), (sp.argmax(axis=1) + 1).tolist()
    al_all = grid.al[:, 0, :].tolist()
    candidates = [(ctx.scenario.speculator.method, ctx.draft, ctx.draft_source, ctx.acceptance_source,
                   ctx.spec_step_source or ctx.step_source)]
    candidates += [(c.method, c.drafter, c.drafter_source, c.acceptance_source, c.timing_source) for c in compared]
    rows = []
    for (m, d, src, acc_source, timing), row, best, al in zip(candidates, sp_all, best_all, al_all):
        rows.append({"method": m, "drafter": d.name if d is not None else None, "drafter_source": src,
                     "num_speculative_tokens": best, "expected_speedup": row[best - 1],
                     "mean_acceptance_length": al[best - 1], "acceptance_source": acc_source,
                     "timing_source": timing})
    rows.sort(key=lambda r: -r["expected_speedup"])
    return rows


def _provenance(ctx: Context, answer: dict[str, Any], acc_source: str, conc_source: str) -> dict[str, str]:
    """Every leaf number's path → input | catalog:<name> | calibration:<run_id> | prior:<source> | default."""
    s = ctx.scenario
    gpu_src, tgt_src = f"catalog:{ctx.gpu.name}", f"catalog:{ctx.target.name}"
    draft_src = ctx.draft_source if ctx.draft_source.startswith("catalog") else "default"
    timing = ctx.step_source  # "default", "calibration:<id>" or "profile:<name>"
    # weakest link of timing × acceptance; the speculative engine's timing may come from a drafter's carried fit
    mixed = acc_source if acc_source.startswith("prior") else ctx.spec_step_source or timing
    prov: dict[str, str] = {}

    def put(path: str, value: Any, source: str) -> None:
        if isinstance(value, dict):
            for key, v in value.items():
                if isinstance(v, dict):
                    put(f"{path}.{key}", v, source)
                elif isinstance(v, list) and v and isinstance(v[0], dict):
                    put(f"{path}.{key}[*]", v[0], source)
                else:  # a leaf (inlined: most values are)
                    prov[f"{path}.{key}"] = source
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            put(f"{path}[*]", value[0], source)  # one entry per column of a table
        else:
            prov[path] = source

    for key in ("decision", "reasons", "speedup", "num_speculative_tokens", "curve", "break_even_concurrency",
                "dynamic_sd", "methods", "vllm", "tco", "tpot_ms", "latency_ms", "throughput_tok_s", "step_ms"):
        put(key, answer[key], mixed)
    for path in ("tpot_ms.baseline", "throughput_tok_s.baseline", "step_ms.decode", "step_ms.verify",
                 "step_ms.verify_to_decode_ratio", "latency_ms.prefill_share"):
        prov[path] = timing
    put("latency_ms.baseline", answer["latency_ms"]["baseline"], timing)
    put("ttft_ms", answer["ttft_ms"], timing)
    prov["curve[*].tpot_ms_baseline"] = timing
    prov["curve[*].concurrency"] = "default"
    put("acceptance", answer["acceptance"], acc_source)
    prov["acceptance.temperature"] = "input"
    put("memory", answer["memory"], gpu_src)
    for path in ("memory.target_weights_gb", "memory.kv_bytes_per_token_target", "memory.context_window_tokens"):
        prov[path] = tgt_src
    for path in ("memory.draft_weights_gb", "memory.kv_bytes_per_token_draft"):
        prov[path] = draft_src
    if s.vram_gb is not None:
        prov["memory.usable_gb"] = "input"
    prov["tco.gpu_hour_usd"] = "input" if s.gpu_hour_usd is not None else gpu_src
    prov["tco.gpu_hour_usd_date"] = gpu_src
    prov["tco.hours_per_month"] = "input" if s.hours_per_month != 730.0 else "default"
    put("concurrency", answer["concurrency"], conc_source)
    if s.speculator.num_speculative_tokens:
        prov["num_speculative_tokens"] = "input"
    put("checks", answer["checks"], tgt_src)
    prov["cost_model_version"] = "default"
    prov["calibration_run_id"] = timing
    return prov


def speedup_point(scenario: Scenario, gpu: GpuSpec, target: ModelSpec, draft: ModelSpec | None,
                  calibration: Calibration | None = None) -> float:
    """Point estimate of the end-to-end speedup at the scenario's concurrency and k (no interval, no curve).

    The fast path for sweeps; needs ``workload.concurrency``.
    """
    _validate(scenario, draft)
    if scenario.workload.concurrency is None:
        raise CostModelError("workload.concurrency", "speedup_point needs a concurrency")
    ctx = _context(scenario, gpu, target, draft, calibration, None)
    mem, res_b, res_s = _capacity(ctx)
    if mem.max_concurrency_baseline < 1 or mem.max_concurrency_speculative < 1:
        raise CostModelError("gpu_count", "the target (or target + drafter) does not fit: no deployment to compare")
    ctx = _with_admissions(ctx, res_b, res_s)
    c = float(scenario.workload.concurrency)
    batch = np.array(sorted({c} | {x for x in (res_b, res_s) if x < c}))
    grid = queued(_grid(ctx, _setup(ctx), ctx.acceptance, batch, 1), res_b, res_s)  # as predict(): queueing
    sp = grid.speedup[0, -1]
    k = scenario.speculator.num_speculative_tokens
    return float(sp[k - 1] if k else sp.max())
