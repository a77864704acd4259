"""Step time: roofline behaviour and the H200 verify-cost ratios of design.md §1."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from advisor import costmodel as cm
from advisor.costmodel.speculation import StepSamples
from advisor.costmodel.steptime import forward_cost, prefill_compute_s, prefill_interleave_s, tp_allreduce_s

H200_RATIOS = {1: 1.08, 16: 1.14, 64: 2.04, 256: 3.26}  # verify of 6 tokens / decode step, design.md §1
H200_TOLERANCE = 0.08  # stated tolerance (relative), at an assumed mean context of 1024 tokens
H200_CONTEXT_TOKENS = 1024


@pytest.mark.parametrize("batch", sorted(H200_RATIOS))
def test_h200_verify_ratios(gpus, models, batch):
    g, m = gpus["H200-SXM"], models["llama-3.1-8b-instruct"]
    verify = cm.step_time_s(g, m, batch, 6, H200_CONTEXT_TOKENS)
    decode = cm.step_time_s(g, m, batch, 1, H200_CONTEXT_TOKENS)
    assert verify / decode == pytest.approx(H200_RATIOS[batch], rel=H200_TOLERANCE)


def test_batch_one_decode_is_memory_bound(gpus, models):
    g, m = gpus["H100-SXM"], models["llama-3.1-8b-instruct"]
    t = cm.step_time_s(g, m, 1, 1, 128)
    weights_time = cm.weights_bytes(m) / (g.hbm_bandwidth_gb_per_s * 1e9)
    assert weights_time < t < weights_time / 0.8 + 2e-3  # ≥ ideal streaming, ≤ at η_bw plus overheads


def test_step_time_monotone_in_batch_query_and_context(gpus, models):
    g, m = gpus["H100-SXM"], models["llama-3.1-8b-instruct"]
    assert cm.step_time_s(g, m, 64, 1, 512) > cm.step_time_s(g, m, 8, 1, 512)
    assert cm.step_time_s(g, m, 8, 4, 512) > cm.step_time_s(g, m, 8, 1, 512)
    assert cm.step_time_s(g, m, 8, 1, 8192) > cm.step_time_s(g, m, 8, 1, 512)


def test_compute_bound_regime_scales_with_tokens(gpus, models):
    g, m = gpus["H100-SXM"], models["llama-3.1-8b-instruct"]
    t1 = cm.step_time_s(g, m, 256, 8, 64)
    t2 = cm.step_time_s(g, m, 512, 8, 64)
    assert t2 / t1 == pytest.approx(2.0, rel=0.1)


def test_verify_cost_grows_with_batch(gpus, models):
    g, m = gpus["H100-SXM"], models["llama-3.1-8b-instruct"]
    ratios = [cm.step_time_s(g, m, b, 4, 1024) / cm.step_time_s(g, m, b, 1, 1024) for b in (1, 8, 32, 128)]
    assert ratios == sorted(ratios)


def test_tensor_parallel_is_faster_but_not_linear(gpus, models):
    g, m = gpus["H100-SXM"], models["llama-3-70b-instruct"]
    t1, t4 = cm.step_time_s(g, m, 1, 1, 512), cm.step_time_s(g, m, 1, 1, 512, gpu_count=4)
    assert t1 / 4 < t4 < t1 / 2


def test_fp8_faster_than_bf16_at_decode(gpus, models):
    g, m = gpus["H100-SXM"], models["llama-3.1-8b-instruct"]
    assert cm.step_time_s(g, m, 1, 1, 512, weights_dtype="fp8") < 0.7 * cm.step_time_s(g, m, 1, 1, 512)


def test_calibrated_params_are_used(gpus, models):
    g, m = gpus["H100-SXM"], models["llama-3.1-8b-instruct"]
    slow = cm.StepTimeParams(bandwidth_efficiency=0.4, compute_efficiency=0.3, fixed_overhead_s=1e-3)
    assert cm.step_time_s(g, m, 1, 1, 512, params=slow) > 1.5 * cm.step_time_s(g, m, 1, 1, 512)
    assert cm.StepTimeParams.from_dict(slow.to_dict()) == slow


def test_bad_batch_is_an_error(gpus, models):
    with pytest.raises(cm.CostModelError):
        cm.step_time_s(gpus["H100-SXM"], models["llama-3.1-8b-instruct"], 0, 1, 512)


def test_small_model_step_has_overhead_floor(gpus, models):
    g = gpus["H100-SXM"]
    t = cm.step_time_s(g, models["smollm2-135m-instruct"], 1, 1, 128)
    assert t > 0.5e-3  # launch/engine overheads dominate a 135M model


def test_two_piece_proposer_draws_are_one_sided_around_the_point_estimate():
    """``proposer_overhead_log_std_low`` set: a draw below the point estimate (z ≤ 0) spreads with σ_low, one above
    with σ_high, half on each side; row 0 stays the point estimate. None: the symmetric log-normal, as before."""
    z = np.random.default_rng(3).standard_normal((4001, 4))
    target = cm.StepTimeParams(0.7, 0.5, 1e-3)
    draft = cm.StepTimeParams(0.7, 0.5, 1e-3, proposer_overhead_log_std=0.5)
    base = StepSamples.point(target)
    symmetric = base.with_overheads(target, draft, z).proposer_scale.ravel()
    split = base.with_overheads(target, dataclasses.replace(draft, proposer_overhead_log_std_low=0.1),
                                z).proposer_scale.ravel()
    assert symmetric[0] == split[0] == 1.0
    ln = np.log(split[1:])
    up, down = z[1:, 1] > 0, z[1:, 1] <= 0
    assert np.allclose(ln[up], 0.5 * z[1:, 1][up]) and np.allclose(ln[down], 0.1 * z[1:, 1][down])
    assert np.array_equal(split[1:][up], symmetric[1:][up])  # the slow side as before
    assert np.quantile(ln, 0.05) > -0.1 * 1.8 and np.quantile(ln, 0.95) > 0.5 * 1.5
    assert np.allclose(np.log(symmetric[1:]), 0.5 * z[1:, 1])


def test_a_step_in_which_not_every_sequence_drafts_costs_at_least_the_ragged_floor(gpus, models):
    """``ragged_step_s`` (CUDA-graph engines): a copy drafter's cycle is uniform with probability f^B; every other
    step costs max(its uniform price, the floor). Without a floor, or when every sequence drafts, nothing changes."""
    from advisor.costmodel.speculation import CycleSetup, evaluate_grid
    from advisor.costmodel.steptime import default_prefill_params, default_step_time_params, forward_cost

    gpu = gpus["H200-SXM"]
    cost, pre = forward_cost(gpu, models["llama-3.1-8b-instruct"]), default_prefill_params(gpu)
    plain = dataclasses.replace(default_step_time_params(gpu), copy_sync_step_s=0.0)  # as a fit sets it: a floor is
    # only ever calibrated, and a calibrated engine's in-line host step is in its fitted overheads

    def cycle_s(floor: float, f: float, b: int) -> float:
        params = dataclasses.replace(plain, ragged_step_s=floor)
        setup = CycleSetup(method="ngram", target=cost, draft=None, target_step=params, draft_step=params,
                           target_prefill=pre, draft_prefill=pre, prompt_tokens=128, output_tokens=1)
        grid = evaluate_grid(setup, np.array([float(b)]), np.array([3]), np.full((1, 3), 0.7), np.array([f]),
                             StepSamples.point(params))
        return float(grid.cycle_s[0, 0, 0])

    uniform = cycle_s(0.0, 0.5, 8)
    assert cycle_s(0.05, 1.0, 8) == cycle_s(0.0, 1.0, 8)  # every sequence drafts: a full graph
    ragged = cycle_s(0.05, 0.5, 8)
    assert ragged > (1 - 0.5 ** 8) * 0.05 > uniform
    host = uniform - 8 * (10e-6 + plain.per_sequence_overhead_s)  # the cycle less its per-sequence host terms
    assert ragged == pytest.approx(uniform + (1 - 0.5 ** 8) * (0.05 - host), rel=1e-9)
    assert cycle_s(uniform / 2, 0.5, 8) == uniform  # a floor below the uniform price changes nothing


@pytest.mark.parametrize("gpu,model,prompt", [("H100-SXM", "llama-3.1-8b-instruct", 1000),
                                              ("H100-SXM", "llama-3-70b-instruct", 1024),
                                              ("H200-SXM", "qwen3-32b", 32_000)])
def test_prompts_riding_in_decode_steps_cost_between_nothing_and_their_compute(gpus, models, gpu, model, prompt):
    """The others' prompts in a request's decode steps (steptime.prefill_interleave_s) cost more than nothing and at
    most their own compute (and all-reduces) plus a prefill step's overhead per step that carries a chunk: the
    roofline can only hide them under the decode's weight read. More of them cost more. One whole prompt beside a
    small batch costs most of its compute (the step is compute-bound; it hides one decode step's weight read)."""
    g, m = gpus[gpu], models[model]
    cost = forward_cost(g, m, "bf16", 4 if "70b" in model else 1)
    step = cm.default_step_time_params(g)
    eta_pre = 0.67
    overhead = 4e-3

    def rides(batch: float, steps: float = 299.0) -> float:
        return float(prefill_interleave_s(cost, step, batch, 1.0, prompt + 150, steps, prompt,
                                             step.bandwidth_efficiency, step.compute_efficiency, eta_pre, overhead))

    def compute(batch: float) -> float:  # the prompts' FLOPs, and their all-reduces across tensor-parallel GPUs
        tokens = (batch - 1.0) * prompt
        return tokens / prompt * float(prefill_compute_s(cost, prompt, eta_pre)) \
            + float(tp_allreduce_s(cost, tokens + 1.0) - tp_allreduce_s(cost, 1.0))

    chunks = math.ceil(prompt / (8192 - 1))
    assert rides(1.0) == 0.0
    assert rides(1.5) == pytest.approx(0.5 * rides(2.0), rel=0.1)  # half the time a whole prompt, not half a prompt
    assert 0.75 * compute(2.0) < rides(2.0) <= compute(2.0) + chunks * overhead + 1e-9
    for b in (4.0, 16.0, 64.0, 256.0):
        assert 0.0 < rides(b / 2) < rides(b) <= compute(b) + min(299.0, (b - 1) * chunks) * overhead + 1e-9


def test_a_stated_concurrency_within_the_caps_keeps_the_batch_start_pricing(gpus, models, make_scenario):
    """A batch that starts together (the closed loops' measurement) prefills its prompts before it decodes; requests
    arriving apart at the rate that puts as many in flight have them ride in their decode steps, which a memory-bound
    8B decode partly hides: the same concurrency reads a shorter baseline latency at the arrival rate."""
    target, head = models["llama-3.1-8b-instruct"], models["eagle-llama-3.1-8b"]
    closed = cm.predict(make_scenario(prompt_tokens=1000, output_tokens=300, concurrency=64), gpus["H100-SXM"],
                        target, head).to_dict()
    lat_s = closed["latency_ms"]["baseline"]["total"] / 1e3
    opened = cm.predict(make_scenario(prompt_tokens=1000, output_tokens=300, concurrency=None,
                                      requests_per_second=64 / lat_s), gpus["H100-SXM"], target, head).to_dict()
    assert closed["concurrency"]["baseline"] == 64 and opened["concurrency"]["baseline"] < 64
    assert opened["latency_ms"]["baseline"]["prefill"] < closed["latency_ms"]["baseline"]["prefill"]
