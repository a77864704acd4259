"""The vLLM settings for an answer: speculative_config JSON and `vllm serve` flags (design.md §6)."""
from __future__ import annotations

import json
import shlex
from typing import Any

from .memory import MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS
from .types import ModelSpec

NGRAM_LOOKUP = {"prompt_lookup_min": 2, "prompt_lookup_max": 5}  # design.md §6
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))  # json.dumps(…, separators=(",", ":")), built once


def repo_of(model: ModelSpec | None) -> str | None:
    if model is None:
        return None
    return model.hf_repo or model.name


def speculative_config(method: str, k: int, draft: ModelSpec | None, temperature: float = 0.0) -> dict[str, Any]:
    """One k at every batch size. vLLM's per-batch-size table (num_speculative_tokens_per_batch_size) is left out:
    with it vLLM 0.24 runs the V1 model runner with piecewise CUDA graphs (vllm/config/vllm.py), and on an H100
    EAGLE-3 decoded 1.3-2.9x as slowly at the same k, B = 1-64 (benchmarks/data/h100-vllm0.24-dynamic-table).
    A draft model at T > 0 samples its drafts (draft_sample_method "probabilistic", as the calibration measures
    and the priors assume: Leviathan et al. 2023); vLLM's default proposes its argmax, which accepts less
    (benchmarks/draft_sampling.py)."""
    config: dict[str, Any] = {"method": method, "num_speculative_tokens": int(k)}
    if method in ("draft_model", "eagle", "eagle3") and draft is not None:
        config["model"] = repo_of(draft)
    if method == "draft_model" and temperature > 0:
        config["draft_sample_method"] = "probabilistic"
    if method == "mtp" and draft is not None and draft.kind == "mtp_head":
        config["model"] = repo_of(draft)
    if method == "ngram":
        config.update(NGRAM_LOOKUP)
    return config


# weights vLLM cannot make from the bf16 repository at load time (fp8 it can: --quantization fp8): a checkpoint
# quantized offline, whose config.json names its method (vLLM's quantization/ configs: awq, gptq, compressed-tensors)
PREQUANTIZED = {"int4": "int4 (AWQ or GPTQ)", "int8": "int8 (W8A8, e.g. llm-compressor)"}


def checkpoint_of(target: ModelSpec, weights_dtype: str) -> str:
    """What ``vllm serve`` loads: the repository, or for int4 / int8 weights a placeholder for its quantized
    checkpoint (serving the bf16 repository would load weights the answer did not price)."""
    repo = repo_of(target) or target.name
    return f"<{PREQUANTIZED[weights_dtype]} checkpoint of {repo}>" if weights_dtype in PREQUANTIZED else repo


def serve_flags(target: ModelSpec, config: dict[str, Any], gpu_count: int, gpu_memory_utilization: float,
                weights_dtype: str, kv_cache_dtype: str = "auto", max_model_len: int | None = None) -> str:
    """``max_model_len``: where the KV space holds no request of the model's whole window (memory.max_model_len)."""
    parts = ["vllm", "serve", checkpoint_of(target, weights_dtype),
             "--speculative-config", _COMPACT_JSON.encode(config),
             "--tensor-parallel-size", str(gpu_count),
             "--gpu-memory-utilization", f"{gpu_memory_utilization:g}"]
    # the scheduler limits the answer priced (its resident cap, its activation reserve): vLLM 0.24's own defaults
    # depend on the GPU (vllm/engine/arg_utils.py: `vllm serve` takes 1,024 sequences on cards of 70 GiB or more)
    parts += ["--max-num-seqs", str(MAX_NUM_SEQS), "--max-num-batched-tokens", str(MAX_NUM_BATCHED_TOKENS)]
    if max_model_len is not None:
        parts += ["--max-model-len", str(max_model_len)]
    if weights_dtype == "fp8":
        parts += ["--quantization", "fp8"]
    elif weights_dtype == "fp16":  # vLLM's "auto" takes the config's torch_dtype (bf16 for every catalog model)
        parts += ["--dtype", "float16"]
    if kv_cache_dtype != "auto":
        parts += ["--kv-cache-dtype", kv_cache_dtype]
    return " ".join(shlex.quote(p) for p in parts)
