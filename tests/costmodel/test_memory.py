"""Weights, KV bytes and the VRAM budget (design.md §3 "Memory")."""
from __future__ import annotations

import pytest

from advisor import costmodel as cm
from advisor.costmodel.memory import GB


def test_kv_bytes_per_token_llama31_8b(models):
    # 32 layers × 2 (K, V) × 8 kv heads × 128 head_dim × 2 bytes
    assert cm.kv_bytes_per_token(models["llama-3.1-8b-instruct"]) == 32 * 2 * 8 * 128 * 2 == 131072


@pytest.mark.parametrize(("name", "expected"), [
    ("llama-3-70b-instruct", 80 * 2 * 8 * 128 * 2),
    ("llama-3.2-1b-instruct", 16 * 2 * 8 * 64 * 2),
    ("vicuna-7b-v1.3", 32 * 2 * 32 * 128 * 2),  # MHA: 512 KiB per token
    ("eagle-llama-3.1-8b", 1 * 2 * 8 * 128 * 2),
])
def test_kv_bytes_other_models(models, name, expected):
    assert cm.kv_bytes_per_token(models[name]) == expected


def test_kv_bytes_tensor_parallel_split_and_replication(models):
    m = models["llama-3.1-8b-instruct"]
    assert cm.kv_bytes_per_token(m, gpu_count=4) == 131072  # 8 kv heads split 2 per GPU: same total
    assert cm.kv_bytes_per_token(m, gpu_count=16) == 2 * 131072  # fewer kv heads than GPUs: replicated


def test_weights_bytes_by_dtype(models):
    m = models["llama-3.1-8b-instruct"]
    assert cm.weights_bytes(m, "bf16") == pytest.approx(8_030_261_248 * 2)
    embed = 2 * 128256 * 4096  # untied embeddings + lm_head stay bf16 under quantisation
    assert cm.weights_bytes(m, "fp8") == pytest.approx((8_030_261_248 - embed) * 1 + embed * 2)
    assert cm.weights_bytes(m, "int4") < cm.weights_bytes(m, "int8") < cm.weights_bytes(m, "bf16")


def test_seed_datum_weights(models):
    # design.md §1: ~16 GB target (Llama-3.1-8B class) + ~2.5 GB draft (Llama-3.2-1B class)
    assert cm.weights_bytes(models["llama-3.1-8b-instruct"]) / GB == pytest.approx(16, rel=0.02)
    assert cm.weights_bytes(models["llama-3.2-1b-instruct"]) / GB == pytest.approx(2.5, rel=0.02)


def test_fp8_kv_cache_halves_the_bytes_and_doubles_what_fits(gpus, models):
    """vLLM's --kv-cache-dtype fp8: one byte per K/V element, for the drafter's cache too (one cache config)."""
    m, d = models["llama-3.1-8b-instruct"], models["llama-3.2-1b-instruct"]
    assert cm.kv_bytes_per_token(m, kv_cache_dtype="fp8") == 32 * 2 * 8 * 128 * 1 == 65536
    auto = cm.memory_report(gpus["H100-SXM"], m, d, 1, 32_768, speculative_tokens=3)
    fp8 = cm.memory_report(gpus["H100-SXM"], m, d, 1, 32_768, speculative_tokens=3, kv_cache_dtype="fp8")
    assert fp8.kv_bytes_per_token_draft == auto.kv_bytes_per_token_draft // 2 == 16 * 2 * 8 * 64
    assert fp8.kv_space_gb == auto.kv_space_gb  # the same space, twice the tokens
    assert fp8.max_concurrency_speculative in (2 * auto.max_concurrency_speculative,
                                               2 * auto.max_concurrency_speculative + 1)
    with pytest.raises(cm.CostModelError) as err:
        cm.kv_bytes_per_token(m, kv_cache_dtype="int4")
    assert err.value.field == "kv_cache_dtype"


def test_unknown_dtype_names_field(models):
    with pytest.raises(cm.CostModelError) as err:
        cm.weights_bytes(models["llama-3.1-8b-instruct"], "fp4")
    assert err.value.field == "weights_dtype"


def test_70b_does_not_fit_one_h100_but_fits_four(gpus, models):
    m = models["llama-3-70b-instruct"]
    one = cm.memory_report(gpus["H100-SXM"], m, None, 1, 2048)
    four = cm.memory_report(gpus["H100-SXM"], m, None, 1, 2048, gpu_count=4)
    assert not one.fits_baseline and one.max_concurrency_baseline == 0
    assert four.fits_baseline and four.max_concurrency_baseline > 100


def test_draft_costs_concurrency_and_kv_space(gpus, models):
    rep = cm.memory_report(gpus["L40S"], models["llama-3.1-8b-instruct"], models["llama-3.2-1b-instruct"], 1, 2048)
    # a separate draft model reserves its CUDA graphs beside its weights (2.06 GB for this one on an H100, vLLM 0.24)
    assert rep.draft_reserve_gb == cm.memory.DRAFT_MODEL_RESERVE_GB
    assert rep.kv_space_gb == pytest.approx(rep.kv_space_gb_baseline - rep.draft_weights_gb - rep.draft_reserve_gb)
    assert rep.max_concurrency_speculative < rep.max_concurrency_baseline
    assert rep.concurrency_lost == rep.max_concurrency_baseline - rep.max_concurrency_speculative


def test_fit_edge_exactly_at_max_concurrency(gpus, models):
    g, t, d = gpus["L40S"], models["llama-3.1-8b-instruct"], models["llama-3.2-1b-instruct"]
    cap = cm.memory_report(g, t, d, 1, 4096).max_concurrency_speculative
    assert cm.memory_report(g, t, d, cap, 4096).fits
    assert not cm.memory_report(g, t, d, cap + 1, 4096).fits


def test_target_alone_exceeds_small_gpu(gpus, models):
    rep = cm.memory_report(gpus["RTX-3060"], models["llama-3.1-8b-instruct"], None, 1, 1024)
    assert not rep.fits_baseline and not rep.fits


def test_vram_override_and_utilization(gpus, models):
    g, m = gpus["H100-SXM"], models["llama-3.1-8b-instruct"]
    small = cm.memory_report(g, m, None, 1, 1024, vram_gb=24)
    assert small.usable_gb == pytest.approx(24 * 0.92)
    low_util = cm.memory_report(g, m, None, 1, 1024, gpu_memory_utilization=0.5)
    assert low_util.max_concurrency_baseline < cm.memory_report(g, m, None, 1, 1024).max_concurrency_baseline
