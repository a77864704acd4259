"""Draft checklist: tokenizer, size ratio, family (design.md §1)."""
from __future__ import annotations

from .types import Issue, ModelSpec

SIZE_RATIO_MIN = 10.0  # a draft model is usually 10-50× smaller than the target (design.md §1)
SIZE_RATIO_MAX = 50.0
HEAD_KINDS = ("eagle_head", "eagle3_head", "mtp_head")
METHOD_KINDS = {"draft_model": ("causal_lm",), "eagle": ("eagle_head",), "eagle3": ("eagle3_head",),
                "mtp": ("mtp_head",)}


def same_tokenizer(target: ModelSpec, draft: ModelSpec) -> bool:
    if target.tokenizer_hash and draft.tokenizer_hash:
        return target.tokenizer_hash == draft.tokenizer_hash
    return (target.tokenizer_family == draft.tokenizer_family
            and target.tokenizer_vocab_size == draft.tokenizer_vocab_size)


def check_draft(target: ModelSpec, draft: ModelSpec | None, method: str) -> list[Issue]:
    """Same tokenizer → error if different; size ratio outside 10–50× → warning; other family → warning."""
    field = "speculator.draft_model"
    issues: list[Issue] = []
    if method in ("ngram", "suffix"):
        if draft is not None:
            issues.append(Issue("warning", field, f"method '{method}' drafts from the prompt; "
                                                  f"draft model '{draft.name}' is ignored"))
        if method == "suffix":  # vllm/config/speculative.py _validate_suffix_decoding raises ImportError without it
            issues.append(Issue("warning", "speculator.method", "suffix decoding needs Arctic Inference beside vLLM "
                                                               "(pip install arctic-inference; vLLM 0.24 names "
                                                               "0.1.1): without it vLLM stops at start"))
        return issues
    if draft is None:
        if method == "draft_model":
            issues.append(Issue("error", field, "method 'draft_model' needs a draft model"))
        return issues
    kinds = METHOD_KINDS.get(method)
    if kinds and draft.kind not in kinds:
        issues.append(Issue("error", field, f"'{draft.name}' is a {draft.kind}; method '{method}' needs a "
                                            f"{' or '.join(kinds)}"))
    if draft.kind in HEAD_KINDS and draft.hidden_size != target.hidden_size:  # a head reads the target's states
        issues.append(Issue("error", field, f"'{draft.name}' was trained for a target with hidden size "
                                            f"{draft.hidden_size}, not '{target.name}' ({target.hidden_size})"))
    if not same_tokenizer(target, draft):
        issues.append(Issue("error", field, (
            f"tokenizer mismatch: target '{target.name}' uses {target.tokenizer_family}/"
            f"{target.tokenizer_vocab_size}, draft '{draft.name}' uses {draft.tokenizer_family}/"
            f"{draft.tokenizer_vocab_size}")))
    if draft.kind == "causal_lm" and draft.param_count > 0:
        ratio = target.param_count / draft.param_count
        if ratio < SIZE_RATIO_MIN:
            issues.append(Issue("warning", field, f"draft only {ratio:.1f}× smaller than target "
                                                  f"(usual {SIZE_RATIO_MIN:g}–{SIZE_RATIO_MAX:g}×)"))
        elif ratio > SIZE_RATIO_MAX:
            issues.append(Issue("warning", field, f"draft {ratio:.0f}× smaller than target: acceptance "
                                                  f"likely low (usual {SIZE_RATIO_MIN:g}–{SIZE_RATIO_MAX:g}×)"))
    if draft.family != target.family:
        issues.append(Issue("warning", field, f"draft family '{draft.family}' differs from target family "
                                              f"'{target.family}'"))
    return issues


def _heads_do_not_split(model: ModelSpec, gpu_count: int) -> str | None:
    """Why vLLM cannot shard ``model``'s attention over ``gpu_count`` GPUs, or None: the query heads divide, and
    the KV heads divide or are replicated a whole number of times (vllm/model_executor/layers/linear.py,
    QKVParallelLinear)."""
    q, kv = model.num_attention_heads, model.num_kv_heads or model.num_attention_heads
    if gpu_count <= 1:
        return None
    if q % gpu_count:
        return f"'{model.name}' has {q} attention heads"
    if (kv % gpu_count) if gpu_count < kv else (gpu_count % kv):
        return f"'{model.name}' has {kv} KV heads"
    return None


def check_tensor_parallel(target: ModelSpec, gpu_count: int, draft: ModelSpec | None = None,
                          method: str | None = None) -> list[Issue]:
    """vLLM shards every model's attention heads over the tensor-parallel GPUs and refuses to start where they do not
    divide (vllm/config/model.py, verify_with_parallel_config); a model drafter runs at the target's size
    (vllm/config/speculative.py, _verify_and_get_draft_tp). Without ``draft``: the target alone."""
    issues: list[Issue] = []
    why = _heads_do_not_split(target, gpu_count)
    if why:
        issues.append(Issue("error", "gpu_count", f"{why}: vLLM cannot split them over {gpu_count} GPUs "
                                                  f"(tensor parallel)"))
    why = _heads_do_not_split(draft, gpu_count) if draft is not None and method not in ("ngram", "suffix") else None
    if why:
        issues.append(Issue("error", "speculator.draft_model", (
            f"{why}: vLLM runs the drafter at the target's tensor-parallel size and cannot split them over "
            f"{gpu_count} GPUs")))
    return issues
