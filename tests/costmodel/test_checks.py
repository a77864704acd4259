"""Draft checklist: tokenizer (error), size ratio and family (warnings)."""
from __future__ import annotations

from advisor import costmodel as cm


def _by(issues, severity):
    return [i for i in issues if i.severity == severity]


def test_good_pair_has_no_issues(models):
    assert cm.check_draft(models["llama-3-70b-instruct"], models["llama-3.2-3b-instruct"], "draft_model") == []
    assert cm.check_draft(models["llama-3.1-8b-instruct"], models["eagle-llama-3.1-8b"], "eagle") == []


def test_tokenizer_mismatch_is_an_error(models):
    issues = cm.check_draft(models["llama-3.1-8b-instruct"], models["qwen3-0.6b"], "draft_model")
    errors = _by(issues, "error")
    assert errors and "tokenizer mismatch" in errors[0].message and errors[0].field == "speculator.draft_model"


def test_size_ratio_warnings(models):
    too_big = cm.check_draft(models["llama-3.1-8b-instruct"], models["llama-3.2-3b-instruct"], "draft_model")
    assert any("only 2.5× smaller" in i.message for i in _by(too_big, "warning"))
    tiny = cm.check_draft(models["vicuna-7b-v1.3"], models["vicuna-68m"], "draft_model")
    assert any("99× smaller" in i.message for i in _by(tiny, "warning"))


def test_family_warning_for_qwama(models):
    issues = cm.check_draft(models["llama-3-70b-instruct"], models["qwama-0.5b-instruct"], "draft_model")
    assert not _by(issues, "error")
    assert any("family" in i.message for i in _by(issues, "warning"))


def test_head_kind_must_match_method(models):
    issues = cm.check_draft(models["llama-3.1-8b-instruct"], models["eagle3-llama-3.1-8b"], "eagle")
    assert _by(issues, "error")
    assert cm.check_draft(models["llama-3.1-8b-instruct"], models["eagle3-llama-3.1-8b"], "eagle3") == []


def test_ngram_needs_no_draft(models):
    assert cm.check_draft(models["llama-3.1-8b-instruct"], None, "ngram") == []
    assert _by(cm.check_draft(models["llama-3.1-8b-instruct"], None, "draft_model"), "error")


def test_heads_that_do_not_divide_over_the_gpus_are_errors_and_the_answer_is_no_go(gpus, models, make_scenario):
    """vLLM refuses to start where the attention heads do not divide over the tensor-parallel GPUs, the drafter's
    too (it runs at the target's size); until 2026-12-06 vicuna-7b with vicuna-68m (12 heads) on 8 GPUs got an
    answer with a command vLLM would not start."""
    target, draft = models["vicuna-7b-v1.3"], models["vicuna-68m"]
    assert cm.check_tensor_parallel(target, 4, draft, "draft_model") == []  # 32 and 12 heads over 4
    [issue] = cm.check_tensor_parallel(target, 8, draft, "draft_model")
    assert issue.severity == "error" and issue.field == "speculator.draft_model" and "12 attention heads" in issue.message
    assert cm.check_tensor_parallel(target, 8, draft, "ngram") == []  # n-gram has no drafter model
    [issue] = cm.check_tensor_parallel(models["smollm2-135m-instruct"], 2)
    assert issue.field == "gpu_count" and "9 attention heads" in issue.message
    sc = make_scenario(gpu="H100-SXM", target_model=target.name, gpu_count=8, method="draft_model",
                       draft_model=draft.name, num_speculative_tokens=3)
    d = cm.predict(sc, gpus["H100-SXM"], target, draft).to_dict()
    assert d["decision"] == "no-go" and any("cannot split them over 8 GPUs" in r for r in d["reasons"])


def test_kv_heads_divide_or_replicate_over_the_gpus(models):
    """QKVParallelLinear: fewer KV heads than GPUs are replicated a whole number of times, more must divide."""
    import dataclasses

    target = models["llama-3.1-8b-instruct"]  # 32 query heads, 8 KV heads
    assert cm.check_tensor_parallel(target, 8) == []
    odd = dataclasses.replace(target, name="odd-kv", num_kv_heads=12)  # 32 % 4 == 0 but 12 % 8 != 0 and 8 < 12
    assert cm.check_tensor_parallel(odd, 4) == []
    [issue] = cm.check_tensor_parallel(odd, 8)
    assert issue.field == "gpu_count" and "12 KV heads" in issue.message
    few = dataclasses.replace(target, name="few-kv", num_kv_heads=3)  # 8 GPUs cannot replicate 3 KV heads evenly
    assert "3 KV heads" in cm.check_tensor_parallel(few, 8)[0].message
