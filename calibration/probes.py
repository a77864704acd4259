"""Calibration probes that drive vLLM's offline ``LLM`` and measure what the cost model needs.

Three probes (design.md §4):

1. **timing** -- decode step time of the target over batch sizes, verify step time at width k + 1
   (a free proposer whose drafts are always rejected, see :mod:`calibration.proposers`), and
   prefill time over prompt lengths;
2. **acceptance** -- the real drafter (n-gram, draft model, ...) on our prompt sets per
   (structure, temperature): vLLM's cumulative spec-decode counters read as differences around each
   probe (N drafts, D draft tokens, A accepted, per-position a_i), plus the fraction of decode steps
   that drafted;
3. **memory** -- start-up time and KV capacity (``cache_config``) of every engine started, with and
   without a drafter.

vLLM is imported lazily (inside functions): this module imports without it. Every measurement is a
dataclass (``dataclasses.asdict``-friendly) carrying the environment and the engine settings; each
is passed to ``on_measurement`` as soon as it is taken, and a run that dies raises
:class:`ProbeRunError` whose ``result`` holds everything measured so far.

Engines must be started from a ``if __name__ == "__main__":`` block (vLLM spawns workers). On the
CPU build, run with :func:`calibration.vllm_cpu.env.cpu_engine_env` applied (``python -m
calibration.probes`` does it by re-executing itself).
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from .contention import HostSpeed

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
STRUCTURES = ("code", "json", "sql", "prose", "creative", "rag")
LARGE_BATCH = 64  # large_batch_decode_tokens applies from this batch size on, cycle_decode_tokens up to it

ProgressCallback = Callable[[int, int, str], None]
MeasurementCallback = Callable[[Any], None]


# --------------------------------------------------------------------------- results


@dataclass
class SpecCounters:
    """vLLM's cumulative spec-decode counters (summed over engines / labels)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    engine_steps: int = 0  # vllm:iteration_tokens_total's count: engine iterations
    iteration_tokens: float = 0.0  # ... and its sum: tokens scheduled over those iterations

    def _combine(self, other: "SpecCounters", sign: int) -> "SpecCounters":
        n = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        a = self.accepted_per_pos + [0] * (n - len(self.accepted_per_pos))
        b = other.accepted_per_pos + [0] * (n - len(other.accepted_per_pos))
        return SpecCounters(
            self.num_drafts + sign * other.num_drafts,
            self.num_draft_tokens + sign * other.num_draft_tokens,
            self.num_accepted_tokens + sign * other.num_accepted_tokens,
            [x + sign * y for x, y in zip(a, b)],
            self.engine_steps + sign * other.engine_steps,
            self.iteration_tokens + sign * other.iteration_tokens,
        )

    def __sub__(self, other: "SpecCounters") -> "SpecCounters":
        return self._combine(other, -1)

    def __add__(self, other: "SpecCounters") -> "SpecCounters":
        return self._combine(other, 1)


@dataclass
class MemoryMeasurement:
    probe: str  # "memory"
    label: str  # engine label, e.g. "target", "ngram-k4", "verify-k4"
    startup_s: float
    num_blocks: int | None
    block_size: int | None
    kv_cache_tokens: int | None
    kv_cache_bytes: int | None
    max_concurrency: float | None
    max_model_len: int | None
    has_drafter: bool
    engine: dict = field(default_factory=dict)
    environment: dict = field(default_factory=dict)
    # vLLM's resolved scheduler setting: with it off the host's work between steps is not hidden, so engines on
    # different paths cost a step differently (vLLM 0.24: an EAGLE head on, a draft model, n-gram and the verify
    # probes' custom proposer off); calibration.fit.engine_path_records splits the drafter's fit by it
    async_scheduling: bool | None = None


@dataclass
class StepTiming:
    """Seconds per engine step of a batch of ``batch_size`` sequences: a decode (q = 1), a verify of a free
    proposer (q = k + 1, ``calibration.proposers``), or a whole speculative cycle of a real drafter
    (``kind="cycle"``: k drafter forwards + one verify; ``accepted_tokens`` says how many drafts were kept)."""

    probe: str  # "step_time"
    label: str
    batch_size: int
    q: int  # tokens per sequence per step: 1 plain decode, k + 1 verify
    context_len: int  # prompt length (mean context grows by ~steps/2 during the probe)
    steps: float  # decode steps (cycles) timed per sequence
    step_s: float  # median seconds per step
    step_s_samples: list[float] = field(default_factory=list)
    accepted_tokens: int = 0  # summed over the timed repeats; ~0 for verify probes (drafts rejected)
    temperature: float = 0.0
    kind: str = "step"  # "step" | "cycle" | "mixed" (half the batch at q, half at 1: ProbeConfig.mixed_width_...)
    relative_spread: float | None = None  # (max - min) / median over the repeats
    num_drafts: int = 0  # spec-decode counters over the timed repeats
    num_draft_tokens: int = 0
    engine_steps: float | None = None  # vLLM's own iteration count per timed generate (co-scheduling check)
    # Speculative cycles on the wall clock: the sequences of a batch finish at different steps (a copy drafter
    # drafts for some only; sampled drafts are accepted unevenly), and ``generate`` lasts until the slowest one, so
    # its wall time covers more engine iterations than the mean sequence's cycles, over a draining batch.
    # ``engine_step_s`` = Δwall / Δiterations (vLLM's iteration counter, long minus short generation), at
    # ``batch_occupancy`` = B · Δcycles per sequence / Δiterations sequences per iteration (exact when a step's cost
    # is linear in its batch: Δwall = Δiterations · c(occupancy)). None elsewhere: every sequence runs every step.
    engine_step_s: float | None = None
    batch_occupancy: float | None = None
    tokens_per_engine_step: float | None = None  # vLLM's iteration_tokens mean: ~ B·q when the batch ran together
    others_cpu: float | None = None  # CPU share other processes took while timing (CPU hosts)
    clock: str = "wall"  # "engine" | "wall": ProbeConfig.step_clock
    engine: dict = field(default_factory=dict)
    environment: dict = field(default_factory=dict)


@dataclass
class PrefillTiming:
    probe: str  # "prefill"
    label: str
    prompt_len: int
    batch_size: int
    prefill_s: float  # median wall time of generate(max_tokens=1)
    samples: list[float] = field(default_factory=list)
    relative_spread: float | None = None
    others_cpu: float | None = None
    engine: dict = field(default_factory=dict)
    environment: dict = field(default_factory=dict)


@dataclass
class AcceptanceMeasurement:
    probe: str  # "acceptance"
    label: str
    method: str
    drafter: str | None
    k: int
    structure: str
    temperature: float
    num_prompts: int
    output_tokens: int
    wall_s: float
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_pos: list[int]
    decode_steps: int  # per-sequence decode steps (tokens after the first - accepted)
    acceptance_length: float | None  # AL = 1 + A / N
    acceptance_rate: float | None  # A / D
    per_position_rate: list[float]  # r_i = a_i / N
    drafted_fraction: float | None  # N / decode steps
    engine: dict = field(default_factory=dict)
    max_tokens: int | None = None  # the generation's budget per prompt (a checkpoint's, for "acceptance_checkpoint")
    # per prompt, where vLLM reports it (--per-request-spec-decode-metrics): [decode steps, steps that drafted,
    # draft tokens, accepted-count histogram j = 0..k over the steps that drafted]
    per_request: list = field(default_factory=list)
    environment: dict = field(default_factory=dict)


@dataclass
class HostSpeedMeasurement:
    """The host's core speed over the whole run (:class:`calibration.contention.HostSpeed`): a busy loop's
    iterations per ``window_s``, once per ``interval_s``."""

    probe: str  # "host_speed"
    label: str
    interval_s: float
    window_s: float
    wall_s: float
    iterations: list[int]  # the readings that ran their whole window (HOST_SPEED_ON_CPU), in order
    iterations_p5: float
    iterations_p50: float
    iterations_p95: float
    swing: float  # p95 / p5
    readings_off_cpu: int = 0  # readings left out: the guest's own processes kept the loop off its core
    engine: dict = field(default_factory=dict)
    environment: dict = field(default_factory=dict)


@dataclass
class ProbeError:
    stage: str
    error: str


@dataclass
class CalibrationResult:
    environment: dict
    config: dict
    started_at: float
    finished_at: float | None = None
    status: str = "running"  # running | succeeded | failed
    memory: list[MemoryMeasurement] = field(default_factory=list)
    step_timings: list[StepTiming] = field(default_factory=list)
    prefill_timings: list[PrefillTiming] = field(default_factory=list)
    acceptance: list[AcceptanceMeasurement] = field(default_factory=list)
    host_speed: list[HostSpeedMeasurement] = field(default_factory=list)
    errors: list[ProbeError] = field(default_factory=list)
    acceptance_checkpoints: list[AcceptanceMeasurement] = field(default_factory=list)

    def add(self, m: Any) -> None:
        {
            "memory": self.memory,
            "step_time": self.step_timings,
            "prefill": self.prefill_timings,
            "acceptance": self.acceptance,
            "acceptance_checkpoint": self.acceptance_checkpoints,
            "host_speed": self.host_speed,
        }[m.probe].append(m)

    def measurements(self) -> list[Any]:
        return [*self.memory, *self.step_timings, *self.prefill_timings, *self.acceptance,
                *self.acceptance_checkpoints, *self.host_speed]

    def to_dict(self) -> dict:
        return asdict(self)


class ProbeRunError(RuntimeError):
    """A probe run that failed; ``result`` keeps every measurement taken before the failure."""

    def __init__(self, message: str, result: CalibrationResult):
        super().__init__(message)
        self.result = result


# --------------------------------------------------------------------------- configuration


@dataclass
class DrafterSpec:
    """One drafter to measure; ``speculative_config()`` gives vLLM's dict."""

    method: str = "ngram"  # ngram | draft_model | eagle | eagle3 | mtp | suffix ...
    k: int = 4
    model: str | None = None  # draft checkpoint ("self" = the target itself)
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 5
    draft_sample_method: str | None = "probabilistic"  # draft models only
    label: str | None = None

    def name(self) -> str:
        if self.label:
            return self.label
        if self.method in ("ngram", "suffix"):
            return f"{self.method}-k{self.k}"
        return f"{self.method}-{Path(self.model or 'self').name}-k{self.k}"

    def speculative_config(self, target: str, synthetic_rates: list[float] | None = None) -> dict:
        cfg: dict[str, Any] = {"method": self.method, "num_speculative_tokens": self.k}
        if self.method == "ngram":
            cfg["prompt_lookup_min"] = self.prompt_lookup_min
            cfg["prompt_lookup_max"] = self.prompt_lookup_max
        elif self.method != "suffix":
            cfg["model"] = target if self.model in (None, "self") else self.model
            if self.draft_sample_method and self.method == "draft_model":
                cfg["draft_sample_method"] = self.draft_sample_method
        if synthetic_rates is not None:
            cfg["rejection_sample_method"] = "synthetic"
            cfg["synthetic_acceptance_rates"] = list(synthetic_rates)
        return cfg


def synthetic_rates(conditional: float, k: int) -> list[float]:
    """vLLM's ``synthetic_acceptance_rates`` are unconditional, r_i = P(first i+1 drafts accepted): a conditional
    per-position rate c gives [c, c², …, c^k] (shared/gpu/README.md)."""
    return [round(conditional ** (i + 1), 6) for i in range(k)]


@dataclass
class ProbeConfig:
    """The probe plan's settings. ``None`` fields take the platform's default (:meth:`resolved`): GPUs run the
    engine as users serve it (CUDA graphs / torch.compile), each engine in its own process; the CPU build runs
    eager, in-process."""

    model: str | None = None  # None: the cached SmolLM2-135M-Instruct (prepared if needed)
    probes: tuple[str, ...] = ("memory", "timing", "acceptance")
    # engine settings (what the run is keyed by: dtype, quantization, KV-cache dtype, TP, engine mode)
    enforce_eager: bool | None = None  # None: eager on the CPU, CUDA graphs + compile on GPUs
    dtype: str = "auto"
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    tensor_parallel_size: int = 1
    max_model_len: int | None = None  # None: the longest prompt probed + decode room
    max_num_seqs: int | None = None  # None: the largest batch probed (so batches are really co-scheduled)
    kv_cache_space_gib: int | None = 2  # CPU: VLLM_CPU_KVCACHE_SPACE; None leaves it alone
    gpu_memory_utilization: float | None = None
    load_format: str = "auto"  # "dummy": random weights of the config's shape (timing without checkpoints)
    skip_tokenizer_init: bool = False  # dummy shapes without a tokenizer: token-id prompts only
    seed: int = 0
    # timing
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    decode_tokens: int = 32
    # engine clock: tokens per timed generation of plain and verify steps at B >= LARGE_BATCH (None: decode_tokens).
    # On an H200 such a step takes 5-60 ms and two repeats of 32 tokens agree within 2 % (runs 5 and 6), so half the
    # tokens halve the largest points' probe time; whole cycles: cycle_decode_tokens (a draft model's vary 2x)
    large_batch_decode_tokens: int | None = None
    # one more target decode step at this context (B = long_context_batch): at a short context the KV read is
    # negligible and the fit cannot tell the bandwidth efficiency from the per-step overhead; at 8k tokens it can
    # (H200 run 12: the profile's fit without such steps priced B = 32 at 8k context 28 % slow). None: not probed
    # (the default: a model's context window may be shorter). The step tells the fit more the more KV it reads: at
    # B = 4 and 8k (4 GB against 16 GB of weights) run 13's fit still priced B = 32 at 8k +20 % slow; with run 12's
    # B = 8 step in its place, +15 %. B = 8 at 8k fills the cache the plan's 256 short sequences are given (the long
    # step runs on the plain target, with no drafter sharing its pool: :func:`default_kv_cache_gib`), so four
    # engines still start together on an H200.
    long_context_len: int | None = None
    long_context_batch: int = 8
    # tokens per timed generation of whole speculative cycles at B <= LARGE_BATCH (above it: decode_tokens, so the
    # KV cache planned for the steps still holds the batch and four engines start together on one H200). None: 128
    # on GPUs, decode_tokens on the CPU. On the H200 (vLLM 0.24, run 9) a draft model's cycles slowed along a
    # generation: timed over 32 tokens they read 22.5-23.7 ms at B = 1, over 128 tokens 30.7-32.1 ms, in
    # calibrations interleaved on one lease; the closed loop's draft-model error went from 34-38 % to 11-15 %.
    cycle_decode_tokens: int | None = None
    context_len: int = 64
    verify_ks: tuple[int, ...] = (4,)  # verify widths, all timed in one engine (calibration.proposers)
    # One verify engine per k instead. With CUDA graphs vLLM replays a full graph only for batches of exactly
    # 1 + num_speculative_tokens query tokens per sequence; a narrower verify in a wider engine runs on piecewise
    # graphs with attention launched from the host, not what an engine of that k serves (H200, runs 6-9: q = 4 in a
    # k = 5 engine 0.7-11 ms slower than q = 6 at B = 1, by lease; in its own k = 3 engine 6.4-7.1 ms). Off by
    # default: on run 9 it did not move the closed loop, and a fifth engine costs the H200 a second start (+90 s)
    verify_engine_per_k: bool = False
    # Verify steps of mixed batches at these B (the widest verify engine): half the sequences draft k, half nothing,
    # as when n-gram finds a match for some sequences only. vLLM replays a full CUDA graph only for uniform batches,
    # so such a step may cost more than a uniform one of the same mean width (H200 run 15: 1.07-1.38x at B = 8, by
    # engine start). Recorded as kind "mixed", left out of the step fit, stated on the run's page. None: B = 2 and 8
    # (up to the largest batch probed) where the engine runs CUDA graphs (GPUs), none in eager mode (the CPU build)
    mixed_width_batch_sizes: tuple[int, ...] | None = None
    # Whole cycles of a copy drafter (n-gram, suffix) on the probe prompts' text, at these B (its acceptance engine,
    # temperature 0): real text drafts on some steps only, and vLLM replays a full CUDA graph only when every
    # sequence of the batch drafted, so these time the steps the cost model prices with ``ragged_step_s`` in the
    # engine that serves them, with its own proposer (H200, SmolLM2, two leases: at the drafted fraction measured,
    # their floor priced the n-gram engines' cycles within a median 3.8 % and 20.8 %, the verify engine's mixed
    # steps within 20.6 % and 23.2 %). Recorded as kind "text_cycle"; needs text prompts (the acceptance probe) and
    # real weights; B above the probe prompts there are is left out. None: B = 1, 4 and 8 (up to the largest batch
    # probed) where the engine runs CUDA graphs (GPUs), none in eager mode (the CPU build)
    text_cycle_batch_sizes: tuple[int, ...] | None = None
    prompt_lengths: tuple[int, ...] = (64, 256, 1024)
    prefill_batch_sizes: tuple[int, ...] = (1, 4)
    max_prefill_tokens: int = 8192  # prefill probes skip B·P above this
    sampled_temperature: float | None = 0.8  # verify, no-draft and cycle steps also at this T (sampling costs)
    cycle_batch_sizes: tuple[int, ...] | None = None  # whole cycles of each drafter; None: batch_sizes
    synthetic_acceptance: float | None = None  # conditional rate pinned by vLLM's synthetic sampler (GPUs)
    truncated_layers: int | None = None  # also time a copy with this many layers (per-layer overhead)
    repeats: int = 3  # timed repeats per point (at least)
    max_repeats: int = 6  # ... more while the spread exceeds max_relative_spread
    max_relative_spread: float = 0.08
    # how a step is timed (:func:`measure_step_time`): "engine" -- vLLM's own per-request timestamps (engine core
    # clock, first to last token) over one generation, on prompts whose prefill the warm-up cached; "wall" -- the
    # difference of two generations' wall times (short and long), which noise in either generation's start or end
    # can turn negative when few steps separate them (a drafter that accepts most drafts). None: "engine" on GPUs
    # (half the probe time: no short generation, no prefill); "wall" on the CPU, the clock its closed loop validated
    # (docs/closed-loop.md: there the engine clock read plain decode steps 16 % and self-drafting cycles 50 % longer,
    # and the closed loop's median error against the same measurements went from 6.8 % to 15 %)
    step_clock: str | None = None
    guard_contention: bool | None = None  # None: redo timings while other processes load the cores (CPU and GPU)
    # seconds between readings of the host's core speed through the run (calibration.contention.HostSpeed: 50 ms
    # of a busy loop each, a record "host_speed"); None: 1 s on GPU nodes, off (0) on the CPU build, whose timings
    # would share its cores with the loop
    host_speed_interval_s: float | None = None
    isolate_engines: bool | None = None  # None: on GPUs, each engine in its own process
    # None: on GPUs, isolated engines start together (as many as fit, by :func:`engine_memory_estimate_bytes`),
    # then probe one at a time while the others wait idle; an engine start (torch.compile, CUDA-graph capture) is
    # mostly host work, so starting them together takes about one start instead of one per engine
    parallel_starts: bool | None = None
    # isolated engines in several start groups (an H100's 80 GB holds two of the plan's four 8B engines): spawn each
    # next group's processes as the current group starts, so that their Python and vLLM imports are done when its
    # turn comes; they then wait, idle, holding no GPU memory, until the current group's engines are gone. None: on
    # GPUs (H100 run 23: 150.6 s against 164.6 s without; the timings of three calibrations with and without it
    # within a median 0.8-1.5 %; docs/gpu-closed-loop.md), off on the CPU build, whose two cores the imports would share
    prespawn_groups: bool | None = None
    # None: on the CPU (in-process engines), all engines of the plan start together and their timing tasks
    # alternate between them in round pairs (:func:`interleaved_tasks`), so slow drift of the host's speed hits
    # baseline, verify and speculative timings alike instead of whichever engine ran last
    engines_together: bool | None = None
    second_cycle_k: int | None = None  # model drafters: whole cycles also at this k (per-forward scaling of a cycle)
    kv_cache_memory_gib: float | None = None  # GPU KV cache per engine (vLLM's kv_cache_memory_bytes); None: vLLM
    # sizes it from gpu_memory_utilization, except with parallel starts (profiling sees the other engines' memory)
    # acceptance
    drafters: tuple[DrafterSpec, ...] = (DrafterSpec("ngram", 4),)
    structures: tuple[str, ...] = STRUCTURES
    temperatures: tuple[float, ...] = (0.0, 0.7, 1.0)
    prompts_per_probe: int = 12
    max_tokens: int = 128
    # copy drafters (n-gram, suffix): each acceptance cell generated again, on the same prompts and seed, stopped after
    # this many output tokens ("acceptance_checkpoint" records): the share of steps that drafted grows with how much
    # output there is to copy from (SmolLM2, code, n-gram k = 4: 7 % of the steps over 32 tokens, 18 % over 114),
    # and the fit reads it against the output's length. None: half of max_tokens; (): none
    output_checkpoints: tuple[int, ...] | None = None
    chat: bool = True  # apply the tokenizer's chat template (instruct models)
    prompts_file: str | None = None  # user's JSONL {"structure", "prompt"}; replaces ours

    def resolved(self, on_gpu: bool | None = None) -> "ProbeConfig":
        """Platform defaults filled in (``on_gpu`` None: ask vLLM's platform)."""
        if on_gpu is None:
            on_gpu = platform_is_gpu()
        long_step = "timing" in self.probes and bool(self.long_context_len)
        largest = max([*self.batch_sizes, *(self.cycle_batch_sizes or ()), *self.prefill_batch_sizes,
                       *(self.text_cycle_batch_sizes or ()),
                       self.prompts_per_probe if "acceptance" in self.probes else 1,
                       self.long_context_batch if long_step else 1])
        longest = max([self.context_len, *self.prompt_lengths, self.long_context_len if long_step else 0]) \
            if "timing" in self.probes else self.context_len
        need_len = longest + max(self.decode_tokens, self.max_tokens) * (1 + max(self.verify_ks or (1,))) + 64
        eager = (not on_gpu) if self.enforce_eager is None else self.enforce_eager
        return dataclasses.replace(
            self,
            enforce_eager=eager,
            max_num_seqs=self.max_num_seqs or max(largest, 1),
            max_model_len=self.max_model_len or int(2 ** np.ceil(np.log2(need_len))),
            guard_contention=True if self.guard_contention is None else self.guard_contention,
            host_speed_interval_s=(1.0 if on_gpu else 0.0) if self.host_speed_interval_s is None
            else self.host_speed_interval_s,
            isolate_engines=on_gpu if self.isolate_engines is None else self.isolate_engines,
            engines_together=(not on_gpu and not self.isolate_engines) if self.engines_together is None
            else self.engines_together,
            parallel_starts=(on_gpu and (self.isolate_engines is not False)) if self.parallel_starts is None
            else self.parallel_starts,
            prespawn_groups=on_gpu if self.prespawn_groups is None else self.prespawn_groups,
            kv_cache_space_gib=None if on_gpu else self.kv_cache_space_gib,
            step_clock=self.step_clock or ("engine" if on_gpu else "wall"),
            large_batch_decode_tokens=self.large_batch_decode_tokens or (16 if on_gpu else None),
            cycle_batch_sizes=self.cycle_batch_sizes or self.batch_sizes,
            cycle_decode_tokens=self.cycle_decode_tokens or (128 if on_gpu else None),
            mixed_width_batch_sizes=self.mixed_width_batch_sizes if self.mixed_width_batch_sizes is not None
            else () if eager else tuple(b for b in (2, 8) if b <= max(self.batch_sizes)),
            text_cycle_batch_sizes=self.text_cycle_batch_sizes if self.text_cycle_batch_sizes is not None
            else () if eager else tuple(b for b in (1, 4, 8) if b <= max(self.batch_sizes)),
        )

    def engine_settings(self, model: str) -> dict:
        """vLLM engine arguments for ``model`` (platform defaults filled in where still None)."""
        if self.enforce_eager is None or self.max_num_seqs is None or self.max_model_len is None:
            return self.resolved().engine_settings(model)
        return {
            "model": model,
            "enforce_eager": self.enforce_eager,
            "dtype": self.dtype,
            "quantization": self.quantization,
            "kv_cache_dtype": self.kv_cache_dtype,
            "tensor_parallel_size": self.tensor_parallel_size,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "kv_cache_space_gib": self.kv_cache_space_gib,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "kv_cache_memory_bytes": None if self.kv_cache_memory_gib is None else int(self.kv_cache_memory_gib * 2**30),
            "load_format": self.load_format,
            "skip_tokenizer_init": self.skip_tokenizer_init,
            "seed": self.seed,
        }


def _dist_version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _torch_cuda_version() -> str | None:
    """The CUDA version torch was built for (``torch.version.cuda``), read from torch/version.py without importing
    torch."""
    import importlib.util
    import re

    try:
        spec = importlib.util.find_spec("torch")
        path = Path(next(iter(spec.submodule_search_locations))) / "version.py"
        found = re.search(r"^cuda\b[^=\n]*=\s*['\"]([^'\"]+)['\"]", path.read_text(), re.M)
    except (AttributeError, ImportError, OSError, StopIteration, TypeError, ValueError):
        return None
    return found.group(1) if found else None


@functools.lru_cache(maxsize=1)
def nvidia_gpus() -> tuple[tuple[str, int], ...]:
    """(name, memory bytes) of each NVIDIA GPU that ``nvidia-smi`` lists, when a CUDA build of vLLM is installed;
    () otherwise (asked once per process). Neither vLLM nor torch is imported: on a node's first run importing them
    takes tens of seconds, which the engine processes pay anyway and a parent that only needs to know the GPU should
    not add before it starts them (docs/gpu-closed-loop.md, run 7)."""
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if exe is None or _dist_version("vllm-cpu") is not None:
        return ()
    try:
        out = subprocess.run([exe, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    gpus = []
    for line in out.strip().splitlines():
        name, _, mib = line.rpartition(",")
        try:
            gpus.append((name.strip(), int(float(mib)) * 2**20))
        except ValueError:
            continue
    return tuple(gpus)


def platform_is_gpu() -> bool:
    if nvidia_gpus():
        return True
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cuda_alike())
    except Exception:
        return False


# --------------------------------------------------------------------------- environment


def cpu_model_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment_info() -> dict:
    """Hardware and software the measurements depend on (no vLLM engine needed)."""
    info: dict[str, Any] = {
        "hostname": platform.node(),
        "machine": platform.machine(),
        "cpu_model": cpu_model_name(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "ld_preload": os.environ.get("LD_PRELOAD", ""),
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE"),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU"),
    }
    try:
        mem_kb = next(
            int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
        info["memory_bytes"] = mem_kb * 1024
    except (OSError, StopIteration, ValueError):
        pass
    for dist in ("vllm", "vllm-cpu", "torch", "transformers"):
        if (v := _dist_version(dist)) is not None:
            info[f"{dist}_version"] = v
    gpus = nvidia_gpus()
    if gpus and "vllm_version" in info:  # a CUDA build of vLLM on an NVIDIA node: no vLLM or torch import
        info.update(platform="cuda", gpu_name=gpus[0][0], gpu_count=len(gpus), hardware=gpus[0][0])
        if (cuda := _torch_cuda_version()) is not None:
            info["cuda_version"] = cuda
        return info
    try:
        import vllm  # noqa: F401
        from vllm.platforms import current_platform

        info["vllm_version"] = getattr(vllm, "__version__", info.get("vllm_version"))
        info["platform"] = current_platform.device_type
        if current_platform.device_type == "cuda":
            import torch

            info["gpu_name"] = torch.cuda.get_device_name(0)
            info["cuda_version"] = torch.version.cuda
        info["hardware"] = info.get("gpu_name") or info["cpu_model"]
    except Exception:  # vLLM missing: keep what we have
        info["hardware"] = info["cpu_model"]
    try:
        from .vllm_cpu import plugin

        info["cpu_fix_plugin_installed"] = plugin.is_installed()
    except Exception:
        pass
    return info


# --------------------------------------------------------------------------- prompts


def load_prompts(path: str | Path | None = None, structures: Iterable[str] | None = None) -> dict[str, list[str]]:
    """Prompts by structure from a JSONL file (``{"structure": ..., "prompt": ...}`` per line) or,
    with ``path=None``, from our prompt sets in ``calibration/prompts/*.jsonl``."""
    files = [Path(path)] if path else sorted(PROMPTS_DIR.glob("*.jsonl"))
    out: dict[str, list[str]] = {}
    for f in files:
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                structure, prompt = str(obj["structure"]), str(obj["prompt"])
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{f}:{n}: expected {{\"structure\": ..., \"prompt\": ...}}: {exc}") from exc
            out.setdefault(structure, []).append(prompt)
    if structures is not None:
        wanted = list(structures)
        out = {s: out[s] for s in wanted if s in out}
    return out


# --------------------------------------------------------------------------- vLLM helpers


_LIVE_ENGINES = [0]  # engines started by :func:`start_engine` in this process and not stopped yet


def _vllm_collectors() -> list:
    """The vLLM collectors registered in prometheus' global registry now. Each engine's stat logger unregisters
    the ones before it (``vllm.v1.metrics.prometheus.unregister_vllm_metrics``) and keeps counting into its own, so
    an engine started after another must read its own collectors, not ``LLM.get_metrics()``."""
    from prometheus_client import REGISTRY

    return [c for c in list(REGISTRY._collector_to_names) if str(getattr(c, "_name", "")).startswith("vllm:")]


def _own_metrics(llm) -> list:
    """``llm.get_metrics()`` read from the collectors this engine registered at start (:func:`start_engine`), in
    vLLM's ``Metric`` form (``vllm.v1.metrics.reader``); the global registry when they are unknown."""
    collectors = getattr(llm, "_specadvisor_collectors", None)
    if not collectors or _LIVE_ENGINES[0] < 2:  # one engine: the registry holds exactly its collectors
        return llm.get_metrics()
    from prometheus_client import CollectorRegistry
    from vllm.v1.metrics import reader

    registry = CollectorRegistry(auto_describe=True)
    for c in collectors:
        try:
            registry.register(c)
        except ValueError:  # a name registered twice: keep the first
            pass
    saved = reader.REGISTRY
    reader.REGISTRY = registry
    try:
        return reader.get_metrics_snapshot()
    finally:
        reader.REGISTRY = saved


def read_spec_counters(llm) -> SpecCounters:
    """Current values of this engine's spec-decode counters and its iteration histogram (``LLM.get_metrics()``,
    needs ``disable_log_stats=False``; :func:`_own_metrics` when several engines live in this process); the same
    names in vLLM 0.24 and 0.32."""
    c = SpecCounters()
    for m in _own_metrics(llm):
        name = m.name
        if name == "vllm:spec_decode_num_drafts":
            c.num_drafts += int(m.value)
        elif name == "vllm:spec_decode_num_draft_tokens":
            c.num_draft_tokens += int(m.value)
        elif name == "vllm:spec_decode_num_accepted_tokens":
            c.num_accepted_tokens += int(m.value)
        elif name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            vals = list(m.values)
            if len(vals) > len(c.accepted_per_pos):
                c.accepted_per_pos += [0] * (len(vals) - len(c.accepted_per_pos))
            for i, v in enumerate(vals):
                c.accepted_per_pos[i] += int(v)
        elif name == "vllm:iteration_tokens_total":
            c.engine_steps += int(getattr(m, "count", 0) or 0)
            c.iteration_tokens += float(getattr(m, "sum", 0.0) or 0.0)
    return c


def kv_capacity(llm) -> dict:
    """KV cache capacity vLLM settled on at start-up (``vllm_config.cache_config``)."""
    cc = llm.llm_engine.vllm_config.cache_config
    blocks = getattr(cc, "num_gpu_blocks", None)
    block_size = getattr(cc, "block_size", None)
    tokens = getattr(cc, "kv_cache_size_tokens", None)
    if tokens is None and blocks is not None and block_size is not None:
        tokens = blocks * block_size
    return {
        "num_blocks": blocks,
        "block_size": block_size,
        "kv_cache_tokens": tokens,
        "kv_cache_bytes": getattr(cc, "kv_cache_memory_bytes", None),
        "max_concurrency": getattr(cc, "kv_cache_max_concurrency", None),
    }


OPTIONAL_ENGINE_ARGS = {"quantization": None, "kv_cache_dtype": "auto", "tensor_parallel_size": 1,
                        "skip_tokenizer_init": False, "kv_cache_memory_bytes": None}


def _engine_has_arg(name: str) -> bool:
    """Whether the installed vLLM's ``EngineArgs`` takes ``name`` (older versions lack newer options)."""
    from vllm.engine.arg_utils import EngineArgs

    return name in {f.name for f in dataclasses.fields(EngineArgs)}


def start_engine(settings: dict, speculative_config: dict | None = None):
    """Start ``vllm.LLM`` with our settings; returns (llm, start-up seconds). Settings left at vLLM's default are
    not passed (the same call works on vLLM 0.24 and newer)."""
    if settings.get("kv_cache_space_gib") is not None:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(int(settings["kv_cache_space_gib"]))
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    from vllm import LLM

    kwargs: dict[str, Any] = {
        "model": settings["model"],
        "enforce_eager": settings["enforce_eager"],
        "dtype": settings["dtype"],
        "max_model_len": settings["max_model_len"],
        "max_num_seqs": settings["max_num_seqs"],
        "load_format": settings["load_format"],
        "seed": settings["seed"],
        "disable_log_stats": False,
        "speculative_config": speculative_config,
    }
    for key, default in OPTIONAL_ENGINE_ARGS.items():
        if settings.get(key, default) != default:
            kwargs[key] = settings[key]
    if settings.get("gpu_memory_utilization") is not None:
        kwargs["gpu_memory_utilization"] = settings["gpu_memory_utilization"]
    if speculative_config and _engine_has_arg("per_request_spec_decode_metrics"):
        # each finished request's acceptance histogram (vllm/v1/metrics/stats.py RequestSpecDecodeMetrics; a counter
        # increment per request per step): acceptance differs between prompts (measure_acceptance's per_request)
        kwargs["per_request_spec_decode_metrics"] = "summary"
    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    startup = time.perf_counter() - t0
    _LIVE_ENGINES[0] += 1
    try:
        llm._specadvisor_collectors = _vllm_collectors()  # this engine's counters (:func:`_own_metrics`)
    except Exception:
        pass
    return llm, startup


def inspect_models_in_process() -> bool:
    """Let vLLM's model registry read a model class's interfaces in this process instead of a fresh Python one.

    vLLM inspects each architecture in a subprocess (``_run_in_subprocess``, "to avoid initializing CUDA") unless
    ``VLLM_CACHE_ROOT/modelinfos`` already holds the answer, so the first engine start on a fresh node imports vLLM
    twice: on the H200 each engine's "Resolved architecture" came 17 s after its arguments (run 16), all engines
    of a plan at once. A probe engine's process (:func:`_engine_plan_main`) exists to start that one engine and has
    vLLM imported; there the inspection costs the model module's import. Should that import initialize CUDA, vLLM
    starts its engine core with spawn instead of fork (``_maybe_force_spawn`` in vllm/utils/system_utils.py):
    slower, still correct. Returns whether the hook was there to replace (vLLM 0.24 to 0.32 have it)."""
    try:
        from vllm.model_executor.models import registry
    except ImportError:
        return False
    if not callable(getattr(registry, "_run_in_subprocess", None)):
        return False
    registry._run_in_subprocess = lambda fn: fn()
    return True


def stop_engine(llm) -> None:
    """Shut an engine down and free its memory before the next one starts."""
    _LIVE_ENGINES[0] = max(0, _LIVE_ENGINES[0] - 1)
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:
        pass
    del llm
    gc.collect()


def _random_prompts(n: int, length: int, rng: random.Random, vocab: int = 20000,
                    first: int | tuple[int, ...] | None = None, repetitive: bool = False) -> list[dict]:
    """Distinct random token prompts (no prefix-cache hits between calls). ``first`` replaces the first token (a
    draft-width marker, ``calibration.proposers``; a tuple: the prompts take its markers in turn); ``repetitive``
    repeats a random 16-token phrase, so that copy drafters (n-gram) find matches to propose from."""
    out = []
    for i in range(n):
        if repetitive:
            phrase = [rng.randrange(100, vocab) for _ in range(16)]
            ids = (phrase * (length // 16 + 1))[:length]
        else:
            ids = [rng.randrange(100, vocab) for _ in range(length)]
        if first is not None:
            ids[0] = first[i % len(first)] if isinstance(first, tuple) else first
        out.append({"prompt_token_ids": ids})
    return out


def _timed_generate(llm, prompts, params) -> tuple[float, list]:
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - t0, outs


def _sampling(temperature: float, max_tokens: int, seed: int, detokenize: bool = True):
    from vllm import SamplingParams

    kw: dict[str, Any] = {"temperature": temperature, "max_tokens": max_tokens, "ignore_eos": True}
    if max_tokens > 1:
        kw["min_tokens"] = max_tokens
    if temperature > 0:
        kw["seed"] = seed
    if not detokenize:
        kw["detokenize"] = False
    return SamplingParams(**kw)


def _spread(samples: list[float]) -> float:
    med = statistics.median(samples)
    return (max(samples) - min(samples)) / med if med > 0 else 0.0


def _repeat(measure, cfg: ProbeConfig, label: str) -> tuple[list[Any], float | None]:
    """Call ``measure()`` ``cfg.repeats`` times, and more (up to ``cfg.max_repeats``) while the spread of its first
    return value exceeds ``cfg.max_relative_spread``. Each call is guarded against contention
    (:func:`calibration.contention.guarded`). Returns (results, the largest CPU share others took)."""
    from .contention import guarded

    results, worst = [], None
    while len(results) < cfg.max_repeats:
        if cfg.guard_contention:
            r, others = guarded(measure, label)
            worst = others if worst is None else max(worst, others)
        else:
            r = measure()
        results.append(r)
        if len(results) >= cfg.repeats and _spread([x[0] for x in results]) <= cfg.max_relative_spread:
            break
    return results, worst


# --------------------------------------------------------------------------- probes


def measure_memory(llm, label: str, startup_s: float, has_drafter: bool, engine: dict, env: dict) -> MemoryMeasurement:
    cap = kv_capacity(llm)
    config = llm.llm_engine.vllm_config
    flag = getattr(getattr(config, "scheduler_config", None), "async_scheduling", None)
    return MemoryMeasurement(
        probe="memory", label=label, startup_s=round(startup_s, 3), has_drafter=has_drafter,
        max_model_len=config.model_config.max_model_len, engine=engine, environment=env,
        async_scheduling=None if flag is None else bool(flag), **cap,
    )


def engine_decode_spans_s(outs) -> list[float] | None:
    """Seconds from the first to the last token of each request, on the engine core's clock (vLLM's
    ``RequestOutput.metrics``: ``first_token_ts`` is stamped when the prefill step's output leaves the engine core,
    ``last_token_ts`` at the last step's): decode steps only, without the prefill, request set-up or the
    front end's output handling. None when the engine does not keep these stats."""
    spans = []
    for o in outs:
        m = getattr(o, "metrics", None)
        first, last = getattr(m, "first_token_ts", None), getattr(m, "last_token_ts", None)
        if not first or not last or last < first:
            return None
        spans.append(last - first)
    return spans


def _engine_decode_s(outs) -> float | None:
    """The mean of :func:`engine_decode_spans_s` (None without the stats)."""
    spans = engine_decode_spans_s(outs)
    return statistics.fmean(spans) if spans else None


def measure_step_time(llm, label: str, batch_size: int, q: int, cfg: ProbeConfig, engine: dict, env: dict,
                      rng: random.Random, temperature: float = 0.0, kind: str = "step",
                      width_marker: int | None = None, repetitive: bool = False,
                      texts: list[str] | None = None) -> StepTiming:
    """Seconds per decode step (verify step, whole speculative cycle) of a co-scheduled batch, repeated until the
    spread is known. Two clocks (``cfg.step_clock``):

    - ``engine``: one generation of N + 1 tokens per repeat; the engine core's first-to-last-token span of each
      request (:func:`_engine_decode_s`) over its decode steps. The prompts stay the same across the warm-up and
      the repeats, so vLLM's prefix cache serves their prefill after the warm-up (the span excludes it anyway).
    - ``wall``: (wall(generate N+1 tokens) - wall(generate N/4+1 tokens)) / (decode steps between them), on fresh
      prompts each time. Both generations pay the same prefill, first-step and drafter start-up costs (a draft
      model's prefill of the prompt runs in the first speculative step), so the difference is steady-state steps.

    Steps per sequence = tokens after the first - accepted drafts per sequence (a cycle yields 1 + accepted), so
    the same formula times decode steps, verify steps and whole speculative cycles. vLLM's iteration histogram
    says how many engine steps the batch took: about N + 1 when the batch was really co-scheduled.

    ``texts`` (B prompts) replaces the random token prompts with text, the same in every repeat (a copy drafter's
    cycles on real text: :func:`text_batch`); ``context_len`` is then their mean token count."""
    clock = cfg.step_clock or "wall"
    n = cfg.decode_tokens
    if clock == "engine" and kind == "step" and batch_size >= LARGE_BATCH and cfg.large_batch_decode_tokens:
        n = cfg.large_batch_decode_tokens
    if kind == "cycle" and cfg.cycle_decode_tokens and batch_size <= LARGE_BATCH:
        n = cfg.cycle_decode_tokens
    n_short = max(1, n // 4)
    detok = not cfg.skip_tokenizer_init
    short, many = _sampling(temperature, n_short + 1, cfg.seed, detok), _sampling(temperature, n + 1, cfg.seed, detok)

    def prompts():  # fresh each call: the wall clock's generations must not hit the prefix cache (text: the same)
        if texts is not None:
            return list(texts)
        return _random_prompts(batch_size, cfg.context_len, rng, first=width_marker, repetitive=repetitive)

    fixed = prompts() if clock == "engine" else None  # the engine clock's, for every repeat

    def steps_of(outs, d: SpecCounters) -> float:
        tokens = sum(len(o.outputs[0].token_ids) for o in outs) / batch_size
        return tokens - 1 - d.num_accepted_tokens / batch_size

    # warm-up at this batch size (allocations, first-call effects; with the engine clock, also the prefix cache)
    warm = llm.generate(fixed, short, use_tqdm=False) if clock == "engine" else \
        llm.generate(prompts(), many, use_tqdm=False)
    if clock == "engine" and _engine_decode_s(warm) is None:
        clock = "wall"  # this engine keeps no per-request timestamps

    def once_wall():
        before = read_spec_counters(llm)
        ts, outs_s = _timed_generate(llm, prompts(), short)
        mid = read_spec_counters(llm)
        tn, outs = _timed_generate(llm, prompts(), many)
        d = read_spec_counters(llm) - mid
        steps = max(0.5, steps_of(outs, d) - steps_of(outs_s, mid - before))
        iterations = d.engine_steps - (mid - before).engine_steps
        return (tn - ts) / steps, max(1.0, steps_of(outs, d)), d, (tn - ts, iterations, steps)

    def once_engine():
        before = read_spec_counters(llm)
        _, outs = _timed_generate(llm, fixed, many)
        d = read_spec_counters(llm) - before
        steps = max(1.0, steps_of(outs, d))
        return _engine_decode_s(outs) / steps, steps, d

    results, others = _repeat(once_engine if clock == "engine" else once_wall, cfg, label)
    samples = [r[0] for r in results]
    tot = SpecCounters()
    for r in results:
        tot = tot + r[2]
    runs = len(results)
    context = cfg.context_len
    if texts is not None:
        context = round(statistics.fmean(len(o.prompt_token_ids or ()) for o in warm))
    engine_step_s = occupancy = None
    if kind in ("cycle", "text_cycle") and all(len(r) > 3 and r[3][1] > 0 for r in results):
        engine_step_s = statistics.median(wall / iters for wall, iters, _ in (r[3] for r in results))
        # (clamped to [1, B]: drafts accepted past max_tokens count as accepted, so the cycles per sequence read low)
        occupancy = min(float(batch_size), max(1.0, statistics.median(
            batch_size * steps / iters for _, iters, steps in (r[3] for r in results))))
    return StepTiming(
        probe="step_time", label=label, batch_size=batch_size, q=q, context_len=context,
        steps=statistics.median(r[1] for r in results), step_s=statistics.median(samples),
        step_s_samples=[round(s, 7) for s in samples], accepted_tokens=tot.num_accepted_tokens,
        temperature=float(temperature), kind=kind, relative_spread=round(_spread(samples), 4),
        num_drafts=tot.num_drafts, num_draft_tokens=tot.num_draft_tokens,
        engine_steps=(tot.engine_steps / runs) if tot.engine_steps else None,
        tokens_per_engine_step=(tot.iteration_tokens / tot.engine_steps) if tot.engine_steps else None,
        others_cpu=others, clock=clock, engine=engine, environment=env,
        engine_step_s=None if engine_step_s is None else round(engine_step_s, 7),
        batch_occupancy=None if occupancy is None else round(occupancy, 4),
    )


def measure_prefill(llm, label: str, prompt_len: int, cfg: ProbeConfig, engine: dict, env: dict,
                    rng: random.Random, batch_size: int = 1) -> PrefillTiming:
    one = _sampling(0.0, 1, cfg.seed, not cfg.skip_tokenizer_init)
    llm.generate(_random_prompts(batch_size, prompt_len, rng), one, use_tqdm=False)  # warm-up
    results, others = _repeat(lambda: (_timed_generate(llm, _random_prompts(batch_size, prompt_len, rng), one)[0],),
                              cfg, label)
    samples = [r[0] for r in results]
    return PrefillTiming(
        probe="prefill", label=label, prompt_len=prompt_len, batch_size=batch_size,
        prefill_s=statistics.median(samples), samples=[round(s, 6) for s in samples],
        relative_spread=round(_spread(samples), 4), others_cpu=others, engine=engine, environment=env,
    )


def format_prompts(llm, prompts: list[str], chat: bool) -> list[str]:
    if not chat:
        return prompts
    tok = llm.get_tokenizer()
    if not getattr(tok, "chat_template", None):
        return prompts
    return [
        tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]


def text_pool(prompts: dict[str, list[str]], cfg: ProbeConfig) -> list[str]:
    """The probe prompts the acceptance cells use, taken from the structures in turn (the first of each, then the
    second, ...): what text cycles draw their batches from."""
    sets = [prompts[s][: cfg.prompts_per_probe] for s in sorted(prompts) if prompts[s]]
    return [p for i in range(max(map(len, sets), default=0)) for p in (s[i] for s in sets if i < len(s))]


def text_batch(llm, prompts: dict[str, list[str]], batch_size: int, cfg: ProbeConfig) -> list[str]:
    """The first ``batch_size`` prompts of :func:`text_pool`, formatted as the acceptance probe formats them."""
    pool = text_pool(prompts, cfg)
    if len(pool) < batch_size:
        raise ValueError(f"text cycles at B={batch_size} need {batch_size} prompts, the probe set has {len(pool)}")
    return format_prompts(llm, pool[:batch_size], cfg.chat)


def output_checkpoints(cfg: ProbeConfig, drafter: DrafterSpec) -> tuple[int, ...]:
    """The output lengths at which a copy drafter's acceptance cells are also read (``ProbeConfig.output_checkpoints``);
    none for model drafters, whose drafts do not depend on how much output there is to copy."""
    if drafter.method not in ("ngram", "suffix"):
        return ()
    marks = (cfg.max_tokens // 2,) if cfg.output_checkpoints is None else cfg.output_checkpoints
    return tuple(sorted({c for c in marks if 1 < c < cfg.max_tokens}))


def measure_acceptance(llm, drafter: DrafterSpec, structure: str, temperature: float, prompts: list[str],
                       cfg: ProbeConfig, engine: dict, env: dict, max_tokens: int | None = None,
                       probe: str = "acceptance") -> AcceptanceMeasurement:
    """Generate ``prompts`` with the drafter on, and read the counters' differences; ``max_tokens`` (default
    ``cfg.max_tokens``) and ``probe`` for a checkpoint's generation (:func:`output_checkpoints`)."""
    from vllm import SamplingParams

    max_tokens = max_tokens or cfg.max_tokens
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=cfg.seed)
    texts = format_prompts(llm, prompts, cfg.chat)
    before = read_spec_counters(llm)
    wall, outs = _timed_generate(llm, texts, params)
    d = read_spec_counters(llm) - before
    out_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    # every output token after a request's first comes from a decode step; a step yields 1 + accepted
    steps = max(0, out_tokens - len(outs) - d.num_accepted_tokens)
    n = d.num_drafts
    per_request = []
    for o in outs:
        sdm = getattr(o.outputs[0], "spec_decode_metrics", None)
        if sdm is not None:
            accepted = sum(j * c for j, c in enumerate(sdm.histogram))
            per_request.append([max(len(o.outputs[0].token_ids) - 1 - accepted, 0), sum(sdm.histogram),
                                sdm.num_draft_tokens, list(sdm.histogram)])
    return AcceptanceMeasurement(
        probe=probe, label=drafter.name(), method=drafter.method,
        drafter=None if drafter.method in ("ngram", "suffix") else (drafter.model or "self"), k=drafter.k,
        structure=structure, temperature=float(temperature), num_prompts=len(prompts),
        output_tokens=out_tokens, wall_s=round(wall, 4),
        num_drafts=n, num_draft_tokens=d.num_draft_tokens, num_accepted_tokens=d.num_accepted_tokens,
        accepted_per_pos=d.accepted_per_pos, decode_steps=steps,
        acceptance_length=(1 + d.num_accepted_tokens / n) if n else None,
        acceptance_rate=(d.num_accepted_tokens / d.num_draft_tokens) if d.num_draft_tokens else None,
        per_position_rate=[a / n for a in d.accepted_per_pos] if n else [],
        drafted_fraction=min(1.0, n / steps) if steps else None,
        engine=engine, environment=env, per_request=per_request, max_tokens=max_tokens,
    )


# --------------------------------------------------------------------------- the plan


@dataclass
class EnginePlan:
    """One engine of the probe plan and what it measures. Tasks: ``("step", B, width, T)`` (q = width + 1; a
    width > 0 in a ``verify`` engine drafts that many always-rejected tokens), ``("cycle", B, T)`` (whole cycles
    of the engine's drafter), ``("long_step", B, context)`` (a decode step at a long context), ``("prefill", P, B)``,
    ``("accept", structure, T)``, ``("mixed_step", B, width)`` (half the batch drafts ``width``, half nothing),
    ``("text_cycle", B, T)`` (a copy drafter's whole cycles on the probe prompts' text)."""

    label: str
    model: str
    speculative_config: dict | None
    tasks: list[tuple] = field(default_factory=list)
    drafter: str | None = None  # DrafterSpec.name() for cycle / acceptance engines


def _subset(values: tuple[int, ...]) -> tuple[int, ...]:
    """First, middle and last: the few batch sizes at which second-order effects (T > 0) are timed."""
    v = sorted(set(values))
    return tuple(sorted({v[0], v[len(v) // 2], v[-1]}))


def plan_engines(cfg: ProbeConfig, prompts: dict[str, list[str]] | None = None) -> list[EnginePlan]:
    """The one probe plan (design.md §4), for ``advisor calibrate``, the calibration job and both closed loops.

    1. ``target``: decode steps over the batch sizes; prefill over prompt lengths at B = 1 and B > 1.
    2. ``verify-kK``: the target with a free proposer (``calibration.proposers``) -- verify steps at every k of
       ``verify_ks`` and speculative steps without drafts, at T = 0 and at ``sampled_temperature``.
    3. ``truncated-Nl`` (optional): decode steps of a copy with N layers (per-step vs per-layer overhead).
    4. per drafter: whole speculative cycles over ``cycle_batch_sizes`` (the drafter's own cost: draft model,
       EAGLE head, n-gram lookup), at the synthetic acceptance when one is set; then its acceptance per
       (structure, temperature) on the probe prompts, in its own engine when the cycles ran synthetic; model
       drafters also cycles at ``second_cycle_k`` (optional; how a cycle scales with k); copy drafters also
       whole cycles on the probe prompts' text (``text_cycle_batch_sizes``: steps in which only some sequences
       draft), in the acceptance engine.
    ``cfg`` must be :meth:`ProbeConfig.resolved`.
    """
    prompts = prompts or {}
    model = cfg.model or ""
    want = set(cfg.probes)
    plan: list[EnginePlan] = []
    timing = "timing" in want
    if want & {"timing", "memory"}:
        tasks: list[tuple] = []
        if timing:
            tasks += [("step", b, 0, 0.0) for b in cfg.batch_sizes]
            if cfg.long_context_len:
                tasks.append(("long_step", cfg.long_context_batch, cfg.long_context_len))
            tasks += [("prefill", length, b) for b in cfg.prefill_batch_sizes for length in cfg.prompt_lengths
                      if b == 1 or length * b <= cfg.max_prefill_tokens]
        plan.append(EnginePlan("target", model, None, tasks))
    if timing and cfg.verify_ks:
        from .proposers import QUALNAME

        kmax = max(cfg.verify_ks)
        engine_ks = sorted(set(cfg.verify_ks)) if cfg.verify_engine_per_k else [kmax]
        for ek in engine_ks:
            # each engine its own k (or, in one engine, every k); the widest also times steps without drafts
            widths = ({ek} if cfg.verify_engine_per_k else set(cfg.verify_ks)) | ({0} if ek == kmax else set())
            tasks = [("step", b, w, 0.0) for w in sorted(widths) for b in cfg.batch_sizes]
            if cfg.sampled_temperature and ek == kmax:
                tasks += [("step", b, w, cfg.sampled_temperature) for w in (0, kmax)
                          for b in _subset(cfg.batch_sizes)]
            if ek == kmax:
                tasks += [("mixed_step", b, kmax) for b in cfg.mixed_width_batch_sizes or () if b > 1]
            plan.append(EnginePlan(f"verify-k{ek}", model,
                                   {"method": "custom_class", "model": QUALNAME, "num_speculative_tokens": ek}, tasks))
    if timing and cfg.truncated_layers:
        plan.append(EnginePlan(f"truncated-{cfg.truncated_layers}l", f"{model}@layers={cfg.truncated_layers}",
                               None, [("step", b, 0, 0.0) for b in _subset(cfg.batch_sizes)[:2]]))
    for d in cfg.drafters:
        accept = [("accept", s, t) for s in cfg.structures if prompts.get(s) for t in cfg.temperatures] \
            if "acceptance" in want else []
        cycles: list[tuple] = []
        if timing:
            cycles = [("cycle", b, 0.0) for b in (cfg.cycle_batch_sizes or cfg.batch_sizes)]
            if cfg.sampled_temperature and d.method not in ("ngram", "suffix"):
                mid = _subset(cfg.cycle_batch_sizes or cfg.batch_sizes)
                cycles.append(("cycle", mid[len(mid) // 2], cfg.sampled_temperature))
        if cfg.synthetic_acceptance is not None and cycles:
            rates = synthetic_rates(cfg.synthetic_acceptance, d.k)
            plan.append(EnginePlan(f"{d.name()}-synthetic{cfg.synthetic_acceptance:g}", model,
                                   d.speculative_config(model, rates), cycles, d.name()))
            cycles = []
        if timing and accept and d.method in ("ngram", "suffix"):  # with the acceptance: real text, real weights
            texts = len(text_pool(prompts, cfg))
            accept = [("text_cycle", b, 0.0) for b in cfg.text_cycle_batch_sizes or () if b <= texts] + accept
        if cycles or accept or (not timing and "memory" in want):
            plan.append(EnginePlan(d.name(), model, d.speculative_config(model), cycles + accept, d.name()))
        if timing and cfg.second_cycle_k and cfg.second_cycle_k != d.k and d.method not in ("ngram", "suffix"):
            d2 = dataclasses.replace(d, k=cfg.second_cycle_k, label=None)
            rates = None if cfg.synthetic_acceptance is None else synthetic_rates(cfg.synthetic_acceptance, d2.k)
            plan.append(EnginePlan(d2.name(), model, d2.speculative_config(model, rates),
                                   [("cycle", b, 0.0) for b in _subset(cfg.cycle_batch_sizes or cfg.batch_sizes)],
                                   d2.name()))
    return plan


def resolve_model_path(path: str, load_format: str) -> str:
    """``PATH@layers=N``: a copy of ``PATH`` with its first N layers (real weights copied; dummy: config only)."""
    if "@layers=" not in path:
        return path
    src, n = path.split("@layers=")
    dst = Path(src).parent / f"{Path(src).name}-{n}l"
    if load_format == "dummy":
        from .models import make_dummy_shape

        return str(make_dummy_shape({"num_hidden_layers": int(n)}, dst, base=src))
    from .models import make_truncated_copy

    return str(make_truncated_copy(src, int(n), dst))


# --------------------------------------------------------------------------- the run


def _engine_dict(item: EnginePlan, cfg: ProbeConfig) -> tuple[dict, dict]:
    """(vLLM settings, the ``engine`` dict every measurement of ``item`` carries)."""
    settings = cfg.engine_settings(resolve_model_path(item.model, cfg.load_format))
    return settings, dict(settings, label=item.label, speculative_config=item.speculative_config)


def run_task(llm, item: EnginePlan, task: tuple, cfg: ProbeConfig, engine: dict, env: dict,
             prompts: dict[str, list[str]], emit: MeasurementCallback, tick: Callable[[str], None],
             rng: random.Random) -> None:
    """One task of ``item`` (see :class:`EnginePlan`) on its running engine ``llm``."""
    spec = item.speculative_config
    if task[0] == "step":
        _, b, w, t = task
        marker = None
        if spec is not None:
            from .proposers import width_marker

            marker = width_marker(w)
        m = measure_step_time(llm, item.label, b, w + 1, cfg, engine, env, rng, temperature=t, width_marker=marker)
        emit(m)
        tick(f"{item.label}: B={b} q={w + 1} T={t:g} step {m.step_s * 1e3:.2f} ms")
    elif task[0] == "mixed_step":  # half the batch drafts w (always rejected), half nothing
        from .proposers import width_marker

        _, b, w = task
        m = measure_step_time(llm, item.label, b, w + 1, cfg, engine, env, rng, kind="mixed",
                              width_marker=(width_marker(w), width_marker(0)))
        emit(m)
        tick(f"{item.label}: B={b} half q={w + 1}, half q=1: step {m.step_s * 1e3:.2f} ms")
    elif task[0] == "text_cycle":  # a copy drafter's whole cycles on the probe prompts' text
        _, b, t = task
        k = int(spec["num_speculative_tokens"])
        m = measure_step_time(llm, item.label, b, k + 1, cfg, engine, env, rng, temperature=t, kind="text_cycle",
                              texts=text_batch(llm, prompts, b, cfg))
        emit(m)
        drafted = m.num_drafts / max(m.steps * b * len(m.step_s_samples), 1.0)
        tick(f"{item.label}: B={b} on text: cycle {m.step_s * 1e3:.2f} ms, {drafted:.0%} of steps drafted")
    elif task[0] == "long_step":
        _, b, context = task
        m = measure_step_time(llm, item.label, b, 1, dataclasses.replace(cfg, context_len=context), engine, env, rng)
        emit(m)
        tick(f"{item.label}: B={b} q=1 at {context} tokens of context: step {m.step_s * 1e3:.2f} ms")
    elif task[0] == "cycle":
        _, b, t = task
        k = int(spec["num_speculative_tokens"])
        m = measure_step_time(llm, item.label, b, k + 1, cfg, engine, env, rng, temperature=t, kind="cycle",
                              repetitive=(spec or {}).get("method") in ("ngram", "suffix"))
        emit(m)
        tick(f"{item.label}: B={b} T={t:g} cycle {m.step_s * 1e3:.2f} ms")
    elif task[0] == "prefill":
        _, length, b = task
        m = measure_prefill(llm, item.label, length, cfg, engine, env, rng, batch_size=b)
        emit(m)
        tick(f"{item.label}: prefill {b}x{length} tokens {m.prefill_s * 1e3:.1f} ms")
    elif task[0] == "accept":
        _, s, t = task
        drafter = {d.name(): d for d in cfg.drafters}[item.drafter]
        cell = prompts[s][: cfg.prompts_per_probe]
        m = measure_acceptance(llm, drafter, s, t, cell, cfg, engine, env)
        emit(m)
        al = f"{m.acceptance_length:.2f}" if m.acceptance_length else "-"
        shares = []
        for c in output_checkpoints(cfg, drafter):
            mark = measure_acceptance(llm, drafter, s, t, cell, cfg, engine, env, c, "acceptance_checkpoint")
            emit(mark)
            shares.append(f"{mark.drafted_fraction or 0:.2f} by {c}")
        drafted = f"; drafted {', '.join(shares)}, {m.drafted_fraction or 0:.2f} by {cfg.max_tokens}" if shares else ""
        tick(f"{item.label}: {s} T={t} AL {al}{drafted}")


def run_engine(item: EnginePlan, cfg: ProbeConfig, env: dict, prompts: dict[str, list[str]],
               emit: MeasurementCallback, tick: Callable[[str], None], rng: random.Random,
               on_ready: Callable[[], None] | None = None, on_done: Callable[[], None] | None = None) -> None:
    """Start ``item``'s engine here, run its tasks, stop it; each measurement to ``emit`` as it is taken.
    ``on_ready`` (an engine held until its turn) is called once the engine is up and warmed up
    (:func:`warm_up`), before any timing; ``on_done`` after the last task, before the engine stops."""
    settings, engine = _engine_dict(item, cfg)
    spec = item.speculative_config
    llm, startup = start_engine(settings, spec)
    try:
        if "memory" in cfg.probes:
            emit(measure_memory(llm, item.label, startup, spec is not None, engine, env))
        tick(f"{item.label}: started in {startup:.1f}s")
        if on_ready is not None:
            warm_up(llm, item, cfg, rng)
            on_ready()
        for task in item.tasks:
            run_task(llm, item, task, cfg, engine, env, prompts, emit, tick, rng)
        if on_done is not None:
            on_done()
    finally:
        stop_engine(llm)


def warm_up(llm, item: EnginePlan, cfg: ProbeConfig, rng: random.Random) -> None:
    """A few tokens at each temperature and at the largest batch of ``item``'s timing tasks: the first
    speculative step, the first sampled step and the first large batch compile kernels (Triton JIT of the
    rejection and top-k/top-p samplers: seconds on an H200), which an engine held until its turn does while the
    others still start, instead of inside its first probe."""
    timing = [t for t in item.tasks if t[0] in ("step", "cycle", "text_cycle")]
    if not timing:
        return
    temps = sorted({float(t[-1]) for t in timing})
    largest = max(int(t[1]) for t in timing)
    detok = not cfg.skip_tokenizer_init
    copy = (item.speculative_config or {}).get("method") in ("ngram", "suffix")
    for t in temps:
        llm.generate(_random_prompts(1, cfg.context_len, rng, repetitive=copy), _sampling(t, 5, cfg.seed, detok),
                     use_tqdm=False)
    llm.generate(_random_prompts(largest, cfg.context_len, rng, repetitive=copy), _sampling(0.0, 5, cfg.seed, detok),
                 use_tqdm=False)


def interleaved_tasks(plan: list[EnginePlan]) -> list[tuple[int, tuple]]:
    """(engine index, task) in the order engines alive together run them: the timing tasks (steps, cycles,
    prefill) in rounds of one task per engine, every second round in reverse engine order (round pairs A B C,
    C B A: a linear drift of the host's speed weighs on every engine alike), then the acceptance tasks, engine by
    engine (counters, not timings)."""
    timing = [[t for t in item.tasks if t[0] != "accept"] for item in plan]
    order: list[tuple[int, tuple]] = []
    for r in range(max((len(t) for t in timing), default=0)):
        engines = range(len(plan)) if r % 2 == 0 else reversed(range(len(plan)))
        order += [(i, timing[i][r]) for i in engines if r < len(timing[i])]
    order += [(i, t) for i, item in enumerate(plan) for t in item.tasks if t[0] == "accept"]
    return order


def run_engines_together(plan: list[EnginePlan], cfg: ProbeConfig, env: dict, prompts: dict[str, list[str]],
                         emit: MeasurementCallback, tick: Callable[[str], None], rng: random.Random) -> None:
    """Start every engine of ``plan`` in this process, run their tasks in :func:`interleaved_tasks` order (one
    engine working at a time, the others idle), stop them all. An engine that fails to start ends the starts; the
    engines already up still run their tasks (a run that dies keeps what it could measure), then the error is
    raised."""
    running: list[tuple[Any, dict]] = []
    failed: BaseException | None = None
    try:
        for item in plan:
            settings, engine = _engine_dict(item, cfg)
            try:
                llm, startup = start_engine(settings, item.speculative_config)
            except Exception as exc:
                failed = exc
                break
            running.append((llm, engine))
            if "memory" in cfg.probes:
                emit(measure_memory(llm, item.label, startup, item.speculative_config is not None, engine, env))
            tick(f"{item.label}: started in {startup:.1f}s")
        for i, task in interleaved_tasks(plan[:len(running)]):
            llm, engine = running[i]
            run_task(llm, plan[i], task, cfg, engine, env, prompts, emit, tick, rng)
    finally:
        for llm, _ in running:
            stop_engine(llm)
    if failed is not None:
        name = plan[len(running)].label
        raise RuntimeError(f"engine {name} failed to start: {type(failed).__name__}: {failed}") from failed


MEASUREMENT_TYPES = {"memory": MemoryMeasurement, "step_time": StepTiming, "prefill": PrefillTiming,
                     "acceptance": AcceptanceMeasurement, "acceptance_checkpoint": AcceptanceMeasurement,
                     "host_speed": HostSpeedMeasurement}


def measurement_from_dict(data: dict) -> Any:
    cls = MEASUREMENT_TYPES[data["probe"]]
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


class HeldProcess:
    """A child process in its own process group, whose JSON-line events on stdout go to ``on_event`` (other lines
    to stderr). With ``hold`` it may report ``{"ready": ...}`` (:func:`wait_for_go`) and then wait for :meth:`run`
    to say go: engines can start together and still be timed one at a time. :meth:`kill` ends the whole group
    (a GPU engine's memory is only free again once its processes are gone)."""

    def __init__(self, argv: list[str], label: str, hold: bool = True, gated: bool = False):
        import subprocess

        self.label, self.hold, self.gated = label, hold, gated
        self.plan_file: str | None = None  # the engine plan the child reads (removed when the process is ended)
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE if hold or gated else subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, text=True, start_new_session=True)

    def release(self) -> None:
        """Let a gated child (:func:`wait_for_start`) go on from its imports to its engine start."""
        if self.gated:
            self.gated = False
            self.proc.stdin.write("start\n")
            self.proc.stdin.flush()

    def _pump(self, on_event: Callable[[dict], None] | None, until_ready: bool) -> bool:
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                event = None
            if not isinstance(event, dict):
                sys.stderr.write(line)
            elif "ready" in event and until_ready:
                return True
            elif "done" in event and not until_ready:
                return True
            elif on_event is not None:
                on_event(event)
        self.proc.wait()
        return False

    def wait_ready(self, on_event: Callable[[dict], None] | None = None) -> bool:
        """Pass events on until the child is ready (True) or has ended (False)."""
        return self._pump(on_event, until_ready=True)

    def run(self, on_event: Callable[[dict], None] | None = None) -> int:
        """Say go (when held), pass events on until the child reports ``{"done": ...}`` (0: it then waits, idle,
        for :meth:`kill`, so that no engine's shutdown overlaps the next one's timings) or ends (its exit status)."""
        if self.hold:
            self.proc.stdin.write("go\n")
            self.proc.stdin.flush()
        if self._pump(on_event, until_ready=False):
            return 0
        return self.proc.wait()

    def kill(self) -> None:
        import signal

        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        if self.plan_file:
            Path(self.plan_file).unlink(missing_ok=True)


def wait_for_start(stream=None) -> None:
    """Child side of a gated :class:`HeldProcess`: with vLLM imported, block until the parent releases it."""
    from vllm import LLM  # noqa: F401  (what start_engine imports: the time a gate saves)

    if not (stream or sys.stdin).readline():
        raise RuntimeError("the parent ended before this engine's start group")


def wait_for_go(label: str, stream=None) -> None:
    """Child side of :class:`HeldProcess`: report ready, then block until the parent says go."""
    stream = stream or sys.stdout
    stream.write(json.dumps({"ready": label}) + "\n")
    stream.flush()
    if not sys.stdin.readline():
        raise RuntimeError("the parent ended before this engine's turn")


def report_done(label: str, stream) -> None:
    """Child side of :class:`HeldProcess`: report the tasks done, then wait idle until the parent ends this
    process group (or closes stdin); the engine's shutdown would otherwise run during the next engine's timings."""
    stream.write(json.dumps({"done": label}) + "\n")
    stream.flush()
    sys.stdin.read()


def engine_memory_estimate_bytes(item: EnginePlan, cfg: ProbeConfig) -> int:
    """GPU memory an engine of the plan will hold: weights of the target (and draft model) per TP rank, from the
    checkpoint's safetensors or, for config-only shapes, a parameter count of config.json (Llama-like layers), at
    2 bytes per parameter; plus the KV cache and 5 GiB for activations, CUDA graphs and the CUDA context (an H200
    run: 8B-shaped engines with an 8.5 GiB cache held 27.3-29.5 GiB, the weights 15 GiB, the drafter's head up to
    1.6 GiB; 3 GiB let five such engines start together and run out of memory)."""
    def weights(path: str | None) -> int:
        if not path:
            return 0
        p = Path(path.split("@layers=")[0])
        files = list(p.glob("*.safetensors")) if p.is_dir() else []
        if files and cfg.load_format != "dummy":
            return sum(f.stat().st_size for f in files)
        try:
            c = json.loads((p / "config.json").read_text())
        except (OSError, ValueError):
            return 0
        h, layers = int(c.get("hidden_size", 0)), int(c.get("num_hidden_layers", 0))
        if "@layers=" in path:
            layers = int(path.split("@layers=")[1])
        heads = int(c.get("num_attention_heads", 1))
        hd = int(c.get("head_dim") or h // max(heads, 1))
        kvh = int(c.get("num_key_value_heads", heads))
        experts = int(c.get("num_local_experts") or c.get("num_experts") or 1)
        params = layers * (2 * h * heads * hd + 2 * h * kvh * hd + 3 * h * int(c.get("intermediate_size", 0)) * experts)
        params += int(c.get("vocab_size", 0)) * h * (1 if c.get("tie_word_embeddings") else 2)
        return 2 * params

    from advisor.costmodel.speculation import MODEL_DRAFTERS  # (not at import: the parent stays light)

    spec = item.speculative_config or {}
    draft = spec.get("model") if spec.get("method") in MODEL_DRAFTERS else None
    tp = max(1, cfg.tensor_parallel_size)
    kv = int((cfg.kv_cache_memory_gib or 0) * 2**30)
    return (weights(item.model) + weights(draft)) // tp + kv + 5 * 2**30


LONG_STEP_SPARE = 1.05  # the long-context step's sequences: vLLM's block rounding (no drafter shares that engine)


def default_kv_cache_gib(cfg: ProbeConfig, spare: float = 1.5) -> float:
    """KV cache for engines that start together: every probe's batch with its drafts, and one longest sequence,
    with ``spare`` - 1 to spare (50 %: the drafter's layers share the pool), or the long-context step's batch with
    5 %; at 2 bytes per element of the target's K and V."""
    try:
        c = json.loads((Path((cfg.model or "").split("@layers=")[0]) / "config.json").read_text())
    except (OSError, ValueError):
        return 8.0
    heads = int(c.get("num_attention_heads", 1))
    hd = int(c.get("head_dim") or int(c.get("hidden_size", 0)) // max(heads, 1))
    per_token = 2 * int(c.get("num_hidden_layers", 0)) * int(c.get("num_key_value_heads", heads)) * hd * 2
    kmax = max([*cfg.verify_ks, *(d.k for d in cfg.drafters), 0])
    generated = max(cfg.decode_tokens, cfg.max_tokens if "acceptance" in cfg.probes else 0)
    tokens = max(spare * max(cfg.max_model_len or 0,
                             (cfg.max_num_seqs or 1) * (cfg.context_len + generated + 1 + kmax + 16)),
                 LONG_STEP_SPARE * cfg.long_context_batch * ((cfg.long_context_len or 0) + cfg.decode_tokens + 1 + 16))
    return max(1.0, round(tokens * per_token / max(1, cfg.tensor_parallel_size) / 2**30, 1))


def held_engine_config(cfg: ProbeConfig, engines: int) -> ProbeConfig:
    """``cfg`` for one of ``engines`` GPU engines alive together: a 0.9/n share of the memory and a fixed KV cache
    (:func:`default_kv_cache_gib`), since vLLM's memory profiling would count the other engines' memory as its own."""
    share = round(0.9 / engines, 3)
    return dataclasses.replace(cfg, gpu_memory_utilization=min(cfg.gpu_memory_utilization or share, share),
                               kv_cache_memory_gib=cfg.kv_cache_memory_gib or default_kv_cache_gib(cfg))


def event_stream():
    """Child side of :class:`HeldProcess`: a line-buffered stream on the original stdout for JSON events; stdout
    itself (vLLM's own prints) goes to stderr, so no pipe fills while the child waits for its turn."""
    events = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    return events


def start_groups(plan: list[EnginePlan], cfg: ProbeConfig, gpu_memory_bytes: int | None) -> list[list[EnginePlan]]:
    """Engines that start together, in plan order: with ``cfg.parallel_starts``, as many as fit in 90 % of the
    GPU's memory (:func:`engine_memory_estimate_bytes`; all of them without a GPU); otherwise one at a time."""
    if not cfg.parallel_starts:
        return [[item] for item in plan]
    if not gpu_memory_bytes:
        return [list(plan)] if plan else []
    cfg = held_engine_config(cfg, 1)  # the KV cache each engine of a group is given (when cfg leaves it to vLLM)
    groups: list[list[EnginePlan]] = []
    used = 0
    for item in plan:
        need = engine_memory_estimate_bytes(item, cfg)
        if groups and used + need <= 0.9 * gpu_memory_bytes:
            groups[-1].append(item)
            used += need
        else:
            groups.append([item])
            used = need
    return groups


def gpu_memory_bytes() -> int | None:
    """Total memory of the first GPU (no CUDA context is created), or None without one."""
    gpus = nvidia_gpus()
    if gpus:
        return gpus[0][1]
    try:
        import torch

        return int(torch.cuda.get_device_properties(0).total_memory) if torch.cuda.is_available() else None
    except Exception:
        return None


def _spawn_group(group: list[EnginePlan], cfg: ProbeConfig, env: dict, prompts: dict[str, list[str]], gpu: bool,
                 gated: bool = False) -> list[HeldProcess]:
    """One process per engine of ``group`` (``python -m calibration.probes --engine-plan FILE``); ``gated``: each
    stops after its imports until :meth:`HeldProcess.release`. On a GPU each engine of a group of several gets a
    share of the memory and a fixed KV cache: vLLM's memory profiling would count the other engines' allocations
    as its own."""
    import tempfile

    hold = len(group) > 1
    if hold and gpu:
        cfg = held_engine_config(cfg, len(group))
    procs: list[HeldProcess] = []
    try:
        for item in group:
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                json.dump({"config": _config_dict(cfg), "engine": asdict(item), "environment": env,
                           "prompts": prompts, "hold": hold, "gated": gated}, f, default=str)
            proc = HeldProcess([sys.executable, "-m", "calibration.probes", "--engine-plan", f.name], item.label,
                               hold, gated)
            proc.plan_file = f.name
            procs.append(proc)
    except BaseException:
        for proc in procs:
            proc.kill()
        raise
    return procs


def _run_group_isolated(procs: list[HeldProcess], emit: MeasurementCallback, tick: Callable[[str], None]) -> None:
    """Run a start group's engines (:func:`_spawn_group`): once all are up, let them probe one at a time (the
    others wait idle: no step of theirs overlaps a timing); then end them all."""
    errors: dict[str, str] = {}

    def on_event(label: str) -> Callable[[dict], None]:
        def handle(event: dict) -> None:
            if "measurement" in event:
                emit(measurement_from_dict(event["measurement"]))
            elif "tick" in event:
                tick(event["tick"])
            elif "error" in event:
                errors[label] = event["error"]
        return handle

    try:
        for p in procs:
            p.release()
        for p in [p for p in procs if p.hold]:
            if not p.wait_ready(on_event(p.label)):
                raise RuntimeError(errors.get(p.label) or f"engine process {p.label} ended before it was ready"
                                   f" (exit {p.proc.returncode})")
        for p in procs:
            if p.run(on_event(p.label)) != 0:
                raise RuntimeError(errors.get(p.label) or f"engine process {p.label} exited with {p.proc.returncode}")
    finally:
        for p in procs:
            p.kill()


def _run_groups_isolated(groups: list[list[EnginePlan]], cfg: ProbeConfig, env: dict, prompts: dict[str, list[str]],
                         emit: MeasurementCallback, tick: Callable[[str], None], gpu: bool,
                         on_stage: Callable[[str], None]) -> None:
    """Each start group in turn (:func:`_run_group_isolated`); with ``cfg.prespawn_groups`` the next group's
    processes are spawned, gated, as the current one starts."""
    current: list[HeldProcess] = []
    following: list[HeldProcess] = []
    try:
        for i, group in enumerate(groups):
            on_stage("engine " + ", ".join(item.label for item in group))
            current, following = following or _spawn_group(group, cfg, env, prompts, gpu), []
            if cfg.prespawn_groups and i + 1 < len(groups):
                following = _spawn_group(groups[i + 1], cfg, env, prompts, gpu, gated=True)
            _run_group_isolated(current, emit, tick)
    finally:  # ended twice at the most: kill() is idempotent
        for p in current + following:
            p.kill()


def _engine_plan_main(plan_file: str) -> int:
    """Child side of :func:`_run_group_isolated`: events as JSON lines on the original stdout."""
    events = event_stream()
    data = json.loads(Path(plan_file).read_text())
    cfg = config_from_dict(data["config"])
    item = EnginePlan(**{**data["engine"], "tasks": [tuple(t) for t in data["engine"]["tasks"]]})
    rng = random.Random(hash((cfg.seed, item.label)) & 0xFFFFFFFF)

    try:
        inspect_models_in_process()
        if data.get("gated"):
            wait_for_start()
        run_engine(item, cfg, data["environment"], data["prompts"],
                   lambda m: events.write(json.dumps({"measurement": asdict(m)}, default=str) + "\n"),
                   lambda msg: events.write(json.dumps({"tick": msg}) + "\n"), rng,
                   on_ready=(lambda: wait_for_go(item.label, events)) if data.get("hold") else None,
                   on_done=(lambda: report_done(item.label, events)) if data.get("hold") else None)
    except BaseException as exc:
        events.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")
        return 1
    return 0


def run_probes(
    config: ProbeConfig | None = None,
    progress: ProgressCallback | None = None,
    on_measurement: MeasurementCallback | None = None,
    engines: Iterable[str] | None = None,
) -> CalibrationResult:
    """Run the probe plan (:func:`plan_engines`); one engine probing at a time (isolated engines may start
    together: ``ProbeConfig.parallel_starts``; in-process engines may all live together, their timings
    interleaved: ``ProbeConfig.engines_together``).

    ``progress(done, total, message)`` is called after every step (an engine start counts as one);
    ``on_measurement(m)`` with each measurement as soon as it is taken. Raises :class:`ProbeRunError`
    (with ``.result`` holding all measurements taken) if an engine fails to start or dies. ``engines`` keeps only
    the plan's engines whose label starts with one of these (to redo part of a run).
    """
    cfg = config or ProbeConfig()
    if cfg.model is None:
        from .models import prepare_smollm2

        cfg = dataclasses.replace(cfg, model=str(prepare_smollm2()))
    cfg = cfg.resolved()
    env = environment_info()
    result = CalibrationResult(environment=env, config=_config_dict(cfg), started_at=time.time())
    prompts = load_prompts(cfg.prompts_file, cfg.structures) if "acceptance" in cfg.probes else {}
    plan = plan_engines(cfg, prompts)
    if engines is not None:
        keep = tuple(engines)
        plan = [item for item in plan if item.label.startswith(keep)]
    total = sum(1 + len(item.tasks) for item in plan)
    done = 0
    rng = random.Random(cfg.seed)

    def emit(m: Any) -> None:
        result.add(m)
        if on_measurement is not None:
            on_measurement(m)

    def tick(msg: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total, msg)

    host_speed = HostSpeed(cfg.host_speed_interval_s).start() if cfg.host_speed_interval_s else None
    stage = "setup"
    try:
        if cfg.isolate_engines:
            memory = gpu_memory_bytes() if cfg.parallel_starts else None

            def on_stage(text: str) -> None:
                nonlocal stage
                stage = text

            _run_groups_isolated(start_groups(plan, cfg, memory), cfg, env, prompts, emit, tick, memory is not None,
                                 on_stage)
        elif cfg.engines_together:
            stage = "engines " + ", ".join(item.label for item in plan)
            run_engines_together(plan, cfg, env, prompts, emit, tick, rng)
        else:
            for item in plan:
                stage = f"engine {item.label}"
                run_engine(item, cfg, env, prompts, emit, tick, rng)
    except BaseException as exc:  # keep what was measured
        result.status = "failed"
        result.finished_at = time.time()
        result.errors.append(ProbeError(stage=stage, error=f"{type(exc).__name__}: {exc}"))
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise ProbeRunError(f"probe run failed at {stage}: {exc}", result) from exc
    finally:  # the host's speed through the run, failed or not
        summary = host_speed.stop() if host_speed is not None else None
        if summary is not None:
            emit(HostSpeedMeasurement(probe="host_speed", label="host", **summary, environment=env))
    result.status = "succeeded"
    result.finished_at = time.time()
    return result


def _config_dict(cfg: ProbeConfig) -> dict:
    d = asdict(cfg)
    d["drafters"] = [dict(asdict(x), name=x.name()) for x in cfg.drafters]
    return d


def config_from_dict(data: dict) -> ProbeConfig:
    """Inverse of ``_config_dict`` (tuples restored)."""
    names = {f.name for f in dataclasses.fields(ProbeConfig)}
    d = {k: v for k, v in data.items() if k in names}
    spec_names = {f.name for f in dataclasses.fields(DrafterSpec)}
    d["drafters"] = tuple(DrafterSpec(**{k: v for k, v in x.items() if k in spec_names}) for x in d.get("drafters", ()))
    for k, v in list(d.items()):
        if isinstance(v, list):
            d[k] = tuple(v)
    return ProbeConfig(**d)


# --------------------------------------------------------------------------- CLI


def _parse_drafter(text: str) -> DrafterSpec:
    """``ngram:4``, ``self:4`` or ``draft_model:/path:4``."""
    parts = text.split(":")
    if parts[0] == "ngram":
        return DrafterSpec("ngram", int(parts[1]) if len(parts) > 1 else 4)
    if parts[0] == "self":
        return DrafterSpec("draft_model", int(parts[1]) if len(parts) > 1 else 4, model="self")
    if parts[0] == "draft_model" and len(parts) >= 2:
        return DrafterSpec("draft_model", int(parts[2]) if len(parts) > 2 else 4, model=parts[1])
    raise ValueError(f"bad drafter {text!r}: use ngram:K, self:K or draft_model:PATH:K")


def main(argv: list[str] | None = None) -> int:
    import argparse

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--engine-plan"]:
        return _engine_plan_main(argv[1])
    p = argparse.ArgumentParser(description="Run calibration probes through vLLM and write JSON.")
    p.add_argument("--model", default=None, help="target checkpoint (default: cached SmolLM2-135M-Instruct)")
    p.add_argument("--probes", default="memory,timing,acceptance")
    p.add_argument("--drafter", action="append", default=None,
                   help="ngram:K | self:K | draft_model:PATH:K | none (the target alone: no drafter engine)")
    p.add_argument("--structures", default=",".join(STRUCTURES))
    p.add_argument("--temperatures", default="0,0.7,1.0")
    p.add_argument("--batch-sizes", default="1,2,4,8")
    p.add_argument("--verify-ks", default="4")
    p.add_argument("--prompt-lengths", default="64,256,1024")
    p.add_argument("--prompts-per-probe", type=int, default=ProbeConfig.prompts_per_probe)
    p.add_argument("--max-tokens", type=int, default=ProbeConfig.max_tokens)
    p.add_argument("--prompts-file", default=None)
    p.add_argument("--load-format", default="auto")
    p.add_argument("--compiled", action="store_true", default=None,
                   help="CUDA graphs / torch.compile on the CPU too (default: eager on the CPU, compiled on GPUs)")
    p.add_argument("--kv-cache-space-gib", type=int, default=2)
    p.add_argument("--step-clock", choices=("engine", "wall"), default=None,
                   help="how steps are timed (default: vLLM's engine clock on GPUs, the wall clock on the CPU)")
    p.add_argument("--output", "-o", default="-", help="JSON file (default stdout)")
    args = p.parse_args(argv)

    from .vllm_cpu.env import reexec_with_cpu_env

    try:
        from vllm.platforms import current_platform

        on_cpu = current_platform.is_cpu()
    except Exception:
        on_cpu = False
    if on_cpu:
        reexec_with_cpu_env(kv_cache_space_gib=args.kv_cache_space_gib)

    floats = lambda s: tuple(float(x) for x in s.split(",") if x)  # noqa: E731
    ints = lambda s: tuple(int(x) for x in s.split(",") if x)  # noqa: E731
    cfg = ProbeConfig(
        model=args.model,
        probes=tuple(x for x in args.probes.split(",") if x),
        drafters=tuple(_parse_drafter(d) for d in (args.drafter or ["ngram:4"]) if d != "none"),
        structures=tuple(x for x in args.structures.split(",") if x),
        temperatures=floats(args.temperatures),
        batch_sizes=ints(args.batch_sizes),
        verify_ks=ints(args.verify_ks),
        prompt_lengths=ints(args.prompt_lengths),
        prompts_per_probe=args.prompts_per_probe,
        max_tokens=args.max_tokens,
        prompts_file=args.prompts_file,
        load_format=args.load_format,
        enforce_eager=None if args.compiled is None else False,
        kv_cache_space_gib=args.kv_cache_space_gib,
        step_clock=args.step_clock,
    )
    from tqdm import tqdm

    bar = tqdm(total=1, unit="step", file=sys.stderr)

    def progress(done: int, total: int, msg: str) -> None:
        bar.total = total
        bar.n = done
        bar.set_description(msg[:60])
        bar.refresh()

    status = 0
    try:
        result = run_probes(cfg, progress=progress)
    except ProbeRunError as exc:
        result, status = exc.result, 1
        print(f"error: {exc}", file=sys.stderr)
    finally:
        bar.close()
    text = json.dumps(result.to_dict(), indent=2)
    if args.output == "-":
        print(text)
    else:
        Path(args.output).write_text(text + "\n")
        print(args.output, file=sys.stderr)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
