"""Weights, KV cache and VRAM budget (design.md §3 "Memory")."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from .types import KV_CACHE_DTYPES, CostModelError, GpuSpec, ModelSpec, WEIGHTS_DTYPES

GB = 1e9  # decimal GB, as vendors quote VRAM and as vLLM logs "GiB"-rounded figures; docs state the choice
# bytes per KV element by vLLM's kv_cache_dtype: "auto" = the model's bf16/fp16; "fp8" (e4m3, per-tensor scales)
KV_CACHE_BYTES_PER_ELEMENT: dict[str, int] = {"auto": 2, "fp8": 1}
EMBEDDING_BYTES_PER_PARAM = 2  # embeddings and lm_head stay bf16 under fp8/int8/int4 checkpoints (AWQ/GPTQ/llm-compressor)
# bytes per quantised layer parameter; int4 = 4 bits + one fp16 scale per 128-weight group (AWQ/GPTQ, group_size=128)
BYTES_PER_PARAM: dict[str, float] = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5 + 2.0 / 128}
MAX_NUM_BATCHED_TOKENS = 8192  # vLLM V1 default chunked-prefill budget for the profiling run (online serving)
MAX_NUM_SEQS = 256  # vLLM default max_num_seqs
CUDA_GRAPH_RESERVE_GB = 0.5  # vLLM captures ~67 graph sizes; typically 0.3-1 GB (vLLM startup log "Graph capturing ... took X GiB")
NON_TORCH_RESERVE_GB = 0.4  # cuBLAS workspace, NCCL buffers, CUDA context outside torch's allocator


# vLLM engine arguments -> the cost model's weights dtype (vLLM's `--dtype` and `--quantization` choices)
ENGINE_DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "half": "fp16", "fp16": "fp16"}
ENGINE_QUANTIZATIONS = {"fp8": "fp8", "awq": "int4", "gptq": "int4", "awq_marlin": "int4", "gptq_marlin": "int4"}


def engine_weights_dtype(settings: dict[str, Any]) -> str | None:
    """The weights dtype an engine ran at, from its vLLM arguments: the quantization where set, else the dtype;
    None where neither says (dtype 'auto' is the checkpoint's own)."""
    return (ENGINE_QUANTIZATIONS.get(str(settings.get("quantization") or "").lower())
            or ENGINE_DTYPES.get(str(settings.get("dtype") or "").lower()))


def engine_kv_cache_dtype(settings: dict[str, Any]) -> str | None:
    """The KV-cache dtype an engine ran with (KV_CACHE_DTYPES), from vLLM's ``kv_cache_dtype`` argument (fp8,
    fp8_e4m3 and fp8_e5m2 are one byte; auto, bfloat16 and float16 two); None where not recorded."""
    kv = settings.get("kv_cache_dtype")
    return None if kv is None else ("fp8" if str(kv).lower().startswith("fp8") else "auto")


def bytes_per_param(weights_dtype: str) -> float:
    if weights_dtype not in BYTES_PER_PARAM:
        raise CostModelError("weights_dtype", f"unknown dtype '{weights_dtype}'; one of {', '.join(WEIGHTS_DTYPES)}")
    return BYTES_PER_PARAM[weights_dtype]


def attention_params_per_layer(model: ModelSpec) -> int:
    # q, k, v, o projections of a GQA decoder layer (HF LlamaAttention)
    q_out = model.num_attention_heads * model.head_dim
    kv_out = 2 * model.num_kv_heads * model.head_dim
    return model.hidden_size * (q_out + kv_out) + q_out * model.hidden_size


def mlp_params_per_expert(model: ModelSpec) -> int:
    return 3 * model.hidden_size * model.intermediate_size  # gate, up, down (SwiGLU, HF LlamaMLP)


def lm_head_params(model: ModelSpec) -> int:
    return model.vocab_size * model.hidden_size  # read every step, tied or not


def head_extra_params(model: ModelSpec) -> int:
    """Extra weights of EAGLE-style heads beyond one decoder layer and the lm_head."""
    h = model.hidden_size
    if model.kind == "eagle_head":
        return 2 * h * h  # fc: concat(embedding, feature) -> hidden (Li et al. 2024, EAGLE §4)
    if model.kind == "eagle3_head":
        q_kv_out = (model.num_attention_heads + 2 * model.num_kv_heads) * model.head_dim
        return 3 * h * h + h * q_kv_out  # fc over 3 fused target layers + 2h-wide qkv input (EAGLE-3, arXiv 2503.01840)
    if model.kind == "mtp_head":
        return 2 * h * h  # eh_proj: concat(embedding, hidden) -> hidden (DeepSeek-V3 report §2.2)
    return 0


def expected_experts_touched(model: ModelSpec, tokens: float) -> float:
    """Distinct experts read by `tokens` tokens with uniform top-k routing: E·(1 − (1 − k/E)^N)."""
    if not model.num_experts:
        return 1.0
    e, k = model.num_experts, model.num_experts_per_token or 1
    return e * (1.0 - (1.0 - k / e) ** max(tokens, 0.0))  # occupancy of E bins after N·k draws without repeats per token


def forward_params_dense(model: ModelSpec) -> tuple[float, float]:
    """(layer params read per forward at full expert occupancy, lm_head + head extras)."""
    experts = model.num_experts or 1
    per_layer = attention_params_per_layer(model) + experts * mlp_params_per_expert(model)
    return float(model.num_layers * per_layer), float(lm_head_params(model) + head_extra_params(model))


def active_params_per_token(model: ModelSpec) -> float:
    """Parameters multiplied per token (FLOPs = 2 × this; Kaplan et al. 2020 §2.1)."""
    experts = model.num_experts_per_token or 1 if model.num_experts else 1
    per_layer = attention_params_per_layer(model) + experts * mlp_params_per_expert(model)
    return float(model.num_layers * per_layer + lm_head_params(model) + head_extra_params(model))


def weights_bytes(model: ModelSpec, weights_dtype: str = "bf16") -> float:
    """Resident weight bytes: quantised layers + bf16 embeddings/lm_head (param_count from the catalog)."""
    embed = model.vocab_size * model.hidden_size
    embed_copies = 0 if model.kind != "causal_lm" else (1 if model.tie_word_embeddings else 2)
    embed_params = min(embed * embed_copies, model.param_count)
    layer_params = model.param_count - embed_params
    return layer_params * bytes_per_param(weights_dtype) + embed_params * EMBEDDING_BYTES_PER_PARAM


def kv_cache_bytes_per_element(kv_cache_dtype: str) -> int:
    if kv_cache_dtype not in KV_CACHE_BYTES_PER_ELEMENT:
        raise CostModelError("kv_cache_dtype", f"unknown KV-cache dtype '{kv_cache_dtype}'; one of "
                                               f"{', '.join(KV_CACHE_DTYPES)}")
    return KV_CACHE_BYTES_PER_ELEMENT[kv_cache_dtype]


def kv_bytes_per_token(model: ModelSpec, gpu_count: int = 1, kv_cache_dtype: str = "auto") -> int:
    """KV bytes per token over all GPUs: layers × 2 (K,V) × kv_heads × head_dim × bytes per element (design.md §3;
    2 B, or 1 B for vLLM's fp8 KV cache).

    Under tensor parallelism KV heads are split; with fewer KV heads than GPUs vLLM replicates them.
    """
    kv_heads_per_gpu = math.ceil(model.num_kv_heads / gpu_count)
    per_gpu = model.num_layers * 2 * kv_heads_per_gpu * model.head_dim * kv_cache_bytes_per_element(kv_cache_dtype)
    return per_gpu * gpu_count


def activation_reserve_bytes(model: ModelSpec, gpu_count: int = 1) -> float:
    """Per-GPU non-KV, non-weight memory after vLLM's profiling run (peak activations + graphs + runtime)."""
    act = MAX_NUM_BATCHED_TOKENS * (2 * model.intermediate_size + 4 * model.hidden_size) * 2  # gate/up + residual streams, bf16
    logits = MAX_NUM_SEQS * model.vocab_size * 4 * 2  # fp32 logits + sampler copy (vLLM sampler)
    return (act + logits) / gpu_count + (CUDA_GRAPH_RESERVE_GB + NON_TORCH_RESERVE_GB) * GB


@dataclass(frozen=True)
class MemoryReport:
    usable_gb: float  # per GPU, VRAM × gpu_memory_utilization
    target_weights_gb: float  # total over GPUs
    draft_weights_gb: float
    kv_bytes_per_token_target: int
    kv_bytes_per_token_draft: int
    activation_reserve_gb: float  # total over GPUs
    draft_reserve_gb: float  # a separate draft model's own reserve (its CUDA graphs), total over GPUs
    kv_space_gb_baseline: float  # total over GPUs
    kv_space_gb: float  # with the drafter
    headroom_gb: float  # kv_space_gb minus the KV the workload's concurrency needs (with drafter)
    context_tokens: int
    max_concurrency_baseline: int
    max_concurrency_speculative: int
    fits_baseline: bool
    fits: bool  # drafter + weights + KV for the workload's concurrency fit
    concurrency_lost: int  # sequences lost to the drafter
    context_window_tokens: int | None  # the target's (vLLM serves no longer request); None = unknown
    max_model_len: int | None  # the --max-model-len the speculative server needs; None: the whole window fits

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def memory_report(gpu: GpuSpec, target: ModelSpec, draft: ModelSpec | None, concurrency: float,
                  context_tokens: int, weights_dtype: str = "bf16", gpu_count: int = 1,
                  gpu_memory_utilization: float = 0.92, vram_gb: float | None = None,
                  speculative_tokens: int = 0, kv_cache_dtype: str = "auto") -> MemoryReport:
    """VRAM × util − weights − reserve = KV space, shared by target and draft caches (design.md §3); the drafter's
    cache has the target's KV-cache dtype (vLLM allocates both from one cache config)."""
    per_gpu_gb = vram_gb if vram_gb is not None else gpu.memory_gb
    usable = per_gpu_gb * GB * gpu_memory_utilization * gpu_count
    target_w = weights_bytes(target, weights_dtype)
    draft_w = weights_bytes(draft, "bf16") if draft is not None else 0.0  # drafters ship in bf16
    draft_reserve = DRAFT_MODEL_RESERVE_GB * GB * gpu_count if draft is not None and draft.kind == "causal_lm" else 0.0
    reserve = activation_reserve_bytes(target, gpu_count) * gpu_count
    kv_t = kv_bytes_per_token(target, gpu_count, kv_cache_dtype)
    kv_d = kv_bytes_per_token(draft, gpu_count, kv_cache_dtype) if draft is not None else 0
    space_base = usable - target_w - reserve
    space_spec = space_base - draft_w - draft_reserve
    per_seq_base = context_tokens * kv_t
    per_seq_spec = (context_tokens + speculative_tokens) * (kv_t + kv_d)  # lookahead slots for k drafts
    window = target.max_position_embeddings
    if beyond_context_window(target, context_tokens):  # vLLM rejects the request: nothing serves it
        max_base = max_spec = 0
    else:
        max_base = max(0, int(space_base // per_seq_base)) if space_base > 0 else 0
        max_spec = max(0, int(space_spec // per_seq_spec)) if space_spec > 0 else 0
    need = math.ceil(concurrency)
    return MemoryReport(
        usable_gb=usable / GB / gpu_count, target_weights_gb=target_w / GB, draft_weights_gb=draft_w / GB,
        kv_bytes_per_token_target=kv_t, kv_bytes_per_token_draft=kv_d,
        activation_reserve_gb=reserve / GB, draft_reserve_gb=draft_reserve / GB,
        kv_space_gb_baseline=max(space_base, 0.0) / GB,
        kv_space_gb=max(space_spec, 0.0) / GB, headroom_gb=(space_spec - need * per_seq_spec) / GB,
        context_tokens=context_tokens, max_concurrency_baseline=max_base, max_concurrency_speculative=max_spec,
        fits_baseline=max_base >= max(need, 1), fits=max_spec >= max(need, 1),
        concurrency_lost=max(max_base - max_spec, 0), context_window_tokens=window,
        max_model_len=max_model_len(space_spec, kv_t + kv_d, speculative_tokens, window, context_tokens),
    )


def beyond_context_window(model: ModelSpec, context_tokens: int) -> str | None:
    """Why vLLM rejects a request of ``context_tokens`` (prompt + output) for ``model``; None where its context
    window holds it, or is not known."""
    window = model.max_position_embeddings
    if window is None or context_tokens <= window:
        return None
    return (f"a request of {context_tokens:,} tokens (prompt + output) exceeds {model.name}'s context window of "
            f"{window:,} tokens: vLLM rejects it")


KV_BLOCK_TOKENS = 16  # vLLM's default KV-cache block size on GPUs (CacheConfig.block_size)
# KV space a --max-model-len does not plan on. benchmarks/max_model_len.py, 2026-12-06, an H100, vLLM 0.24, at the
# limits the command pins (8,192 batched tokens, 256 sequences): vLLM's KV came within 0.06 GB of this file's (n-gram
# at utilization 0.28 and 0.45; 0.42 GB more without speculation; with a 1B draft model once DRAFT_MODEL_RESERVE_GB
# is priced). At LLM's own defaults (16,384 tokens, 1,024 sequences) it held 3.07 GB more, hence the pins.
MAX_MODEL_LEN_RESERVE_GB = 0.5
# A separate draft model's reserve beyond its weights: vLLM profiles its CUDA graphs too (an estimate of 2.29 GiB
# against 0.44 with n-gram, same run): 2.06 GB less KV than the weights alone left, for Llama-3.2-1B beside 8B.
# An EAGLE-3 head takes none: vLLM's KV within 0.07 GB of this file's at utilization 0.28 and 0.45 (a later lease)
DRAFT_MODEL_RESERVE_GB = 2.1


def max_model_len(kv_space_bytes: float, kv_bytes_per_token: int, lookahead_tokens: int,
                  context_window_tokens: int | None, context_tokens: int) -> int | None:
    """The --max-model-len a server needs on this KV space: None where one request of the whole context window
    fits (vLLM's default max_model_len is the window), else the longest request whose KV fits, in whole blocks,
    less the pool's null block and the k lookahead slots, and at least the workload's context; both judged on the
    space less MAX_MODEL_LEN_RESERVE_GB. vLLM refuses to start when its KV cache cannot hold one request of
    max_model_len (vllm/v1/core/kv_cache_utils.py, check_enough_kv_cache_memory)."""
    if context_window_tokens is None or kv_bytes_per_token <= 0:
        return None
    planned = max(kv_space_bytes - MAX_MODEL_LEN_RESERVE_GB * GB, 0.0)
    blocks = int(planned // (kv_bytes_per_token * KV_BLOCK_TOKENS)) - 1
    longest = (blocks * KV_BLOCK_TOKENS - lookahead_tokens) // KV_BLOCK_TOKENS * KV_BLOCK_TOKENS
    return None if longest >= context_window_tokens else max(longest, min(context_tokens, context_window_tokens))


def resident_sequences(kv_space_gb: float, kv_bytes_per_token: float, prompt_tokens: int, output_tokens: int,
                       lookahead_tokens: int = 0) -> int:
    """Sequences vLLM keeps in flight in a KV space (at most max_num_seqs). vLLM allocates KV blocks as tokens
    arrive (PagedAttention, Kwon et al. 2023), so in steady state a sequence holds its prompt and on average half
    its output (+ the lookahead slots of k drafts): N = KV space / ((P + O/2 + k)·KV bytes per token)."""
    per_seq = (prompt_tokens + output_tokens / 2.0 + lookahead_tokens) * kv_bytes_per_token
    if kv_space_gb <= 0 or per_seq <= 0:
        return 0
    return int(min(kv_space_gb * GB // per_seq, MAX_NUM_SEQS))
