"""The scheduler simulation (advisor/costmodel/simulate.py): physics at the limits, scheduler rules, seeded draws."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from advisor.costmodel import default_prefill_params, default_step_time_params
from advisor.costmodel.simulate import (EngineLimits, SpecDecode, StepModel, Traffic, decode_cycles, simulate)
from advisor.costmodel.steptime import forward_cost, prefill_time_s, step_time_from_cost


@pytest.fixture(scope="module")
def h100_8b(gpus, models):
    gpu, target = gpus["H100-SXM"], models["llama-3.1-8b-instruct"]
    step, pre = default_step_time_params(gpu), default_prefill_params(gpu)
    return StepModel(forward_cost(gpu, target), step, pre), gpu, target


def test_an_idle_engine_gives_the_step_time_model_back(h100_8b):
    """One request at a time: TTFT = the prefill step, TPOT = a batch-1 decode step at the mean context."""
    model, _, _ = h100_8b
    traffic = Traffic(prompt_tokens=512, output_tokens=129, arrival_s=[0.0, 100.0, 200.0])
    sim = simulate(model, EngineLimits(500_000), traffic)
    pre = float(prefill_time_s(model.target, model.prefill, model.step, 512)) \
        + max(model.step.fixed_overhead_s - model.prefill.fixed_overhead_s, 0.0)  # a step pays the larger overhead
    assert sim.ttft_s == pytest.approx([pre] * 3, rel=1e-3)
    decode = float(step_time_from_cost(model.target, model.step, 1, 1, 512 + 1 + 64))  # mean context of the decode
    assert sim.tpot_s == pytest.approx([decode] * 3, rel=2e-3)
    assert sim.finished == 3 and sim.preemptions == 0 and not sim.saturated
    assert sim.mean_decode_batch == pytest.approx(1.0)


def test_long_prompts_are_chunked_under_the_token_budget(h100_8b):
    model, _, _ = h100_8b
    one = simulate(model, EngineLimits(500_000, max_num_batched_tokens=8192), Traffic(4096, 2, arrival_s=[0.0]))
    chunked = simulate(model, EngineLimits(500_000, max_num_batched_tokens=1024), Traffic(4096, 2, arrival_s=[0.0]))
    assert chunked.steps == one.steps + 3  # 4 chunks of 1024 instead of one step
    assert chunked.ttft_s[0] > one.ttft_s[0]  # each chunk pays the fixed overheads and re-reads the weights


def test_every_request_finishes_and_throughput_matches_the_offered_load(h100_8b):
    model, _, _ = h100_8b
    sim = simulate(model, EngineLimits(500_000), Traffic(512, 256, requests_per_second=10.0, num_requests=400))
    assert sim.finished == 400 and not sim.saturated
    assert sim.output_tokens == 400 * 256
    arrivals = np.cumsum(np.random.default_rng(0).exponential(0.1, 400))  # the seeded Poisson draws
    span = arrivals[-1] - arrivals[0] + np.median(sim.latency_s)  # stable: what arrives leaves
    assert sim.throughput_tok_s == pytest.approx(400 * 256 / span, rel=0.02)


def test_latency_grows_with_load_and_saturation_is_reported(h100_8b):
    model, _, _ = h100_8b
    limits = EngineLimits(500_000)
    runs = [simulate(model, limits, Traffic(512, 256, requests_per_second=r, num_requests=300, max_queue=256))
            for r in (2.0, 15.0, 30.0)]
    tpot = [r.percentile_ms("tpot", 50) for r in runs]
    ttft = [r.percentile_ms("ttft", 90) for r in runs]
    assert tpot[0] < tpot[1] < tpot[2]
    assert ttft[0] < ttft[2]
    flooded = simulate(model, limits, Traffic(512, 256, requests_per_second=500.0, num_requests=2000, max_queue=256))
    assert flooded.saturated and math.isinf(flooded.percentile_ms("ttft", 90))


def test_max_num_seqs_caps_the_batch(h100_8b):
    model, _, _ = h100_8b
    sim = simulate(model, EngineLimits(500_000, max_num_seqs=8), Traffic(128, 128, requests_per_second=200.0,
                                                                         num_requests=200))
    assert sim.finished == 200
    assert sim.mean_decode_batch <= 8.0
    assert sim.percentile_ms("ttft", 90) > 10 * sim.percentile_ms("ttft", 10)  # the rest waited in the queue


def test_a_small_kv_cache_preempts_and_still_finishes_everything(h100_8b):
    model, _, _ = h100_8b
    small = EngineLimits(kv_capacity_tokens=6000, block_size=16)  # ~8 sequences of 700 tokens
    sim = simulate(model, small, Traffic(200, 500, requests_per_second=50.0, num_requests=60))
    big = simulate(model, EngineLimits(500_000), Traffic(200, 500, requests_per_second=50.0, num_requests=60))
    assert sim.preemptions > 0 and big.preemptions == 0
    assert sim.finished == 60
    assert sim.mean_decode_batch < big.mean_decode_batch
    with pytest.raises(ValueError, match="exceeds the KV cache"):
        simulate(model, small, Traffic(5000, 2000, arrival_s=[0.0]))


def test_speculation_that_always_accepts_needs_a_cycle_per_k_plus_one_tokens(h100_8b):
    model, _, _ = h100_8b
    spec = SpecDecode("ngram", 3, (1.0, 1.0, 1.0), 1.0)
    sim = simulate(model, EngineLimits(500_000), Traffic(256, 101, arrival_s=[0.0]), spec)
    assert sim.steps == 1 + 25  # the prefill step, then 100 tokens at 4 per cycle
    base = simulate(model, EngineLimits(500_000), Traffic(256, 101, arrival_s=[0.0]))
    assert sim.tpot_s[0] < base.tpot_s[0] / 2.5  # 4 tokens per verify step that costs little more than a decode


def test_tokens_per_cycle_pmf_is_vllms_acceptance():
    spec = SpecDecode("eagle", 3, (0.8, 0.5, 0.2), draft_fraction=0.5)
    pmf = spec.tokens_pmf()
    assert pmf.sum() == pytest.approx(1.0)
    # AL over drafted steps = 1 + Σ r_i (design.md §2); over all steps with a drafting fraction f: 1 + f·Σ r_i
    assert pmf @ np.arange(1, 5) == pytest.approx(1.0 + 0.5 * 1.5)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(st.floats(0.05, 0.95), st.integers(1, 6), st.floats(0.1, 1.0), st.integers(20, 400))
def test_drawn_cycles_average_to_the_renewal_rate(alpha, k, f, tokens):
    spec = SpecDecode("ngram", k, tuple(alpha ** (i + 1) for i in range(k)), f)
    cycles = decode_cycles(spec, np.full(4000, tokens), np.random.default_rng(3))
    mean_tokens = float(spec.tokens_pmf() @ np.arange(1, k + 2))
    assert cycles.min() >= math.ceil(tokens / (k + 1)) and cycles.max() <= tokens
    assert cycles.mean() == pytest.approx(tokens / mean_tokens, rel=0.06, abs=1.0)


def test_each_request_keeps_its_own_measured_acceptance():
    # one prompt never drafts, the other accepts every draft: a request is one or the other for all its steps
    spec = SpecDecode("ngram", 4, (0.5, 0.5, 0.5, 0.5), 0.5, request_pmfs=((1, 0, 0, 0, 0), (0, 0, 0, 0, 1)))
    cycles = decode_cycles(spec, np.full(2000, 100), np.random.default_rng(5))
    assert set(np.unique(cycles)) == {20, 100}
    assert np.mean(cycles == 100) == pytest.approx(0.5, abs=0.05)
    pooled = decode_cycles(dataclasses.replace(spec, request_pmfs=()), np.full(2000, 100), np.random.default_rng(5))
    assert 20 < pooled.min() and pooled.max() < 100  # i.i.d. steps: every request in between


@settings(max_examples=20, deadline=None, derandomize=True)
@given(st.lists(st.lists(st.integers(0, 20), min_size=5, max_size=5).filter(any), min_size=1, max_size=6),
       st.integers(20, 300))
def test_per_request_cycles_average_to_the_mixture_rate(hists, tokens):
    pmfs = tuple(tuple(c / sum(h) for c in h) for h in hists)
    spec = SpecDecode("ngram", 4, (0.5, 0.4, 0.3, 0.2), 0.5, request_pmfs=pmfs)
    cycles = decode_cycles(spec, np.full(3000, tokens), np.random.default_rng(11))
    expected = np.mean([tokens / (np.asarray(p) @ np.arange(1, 6)) for p in pmfs])
    assert cycles.min() >= math.ceil(tokens / 5) and cycles.max() <= tokens
    assert cycles.mean() == pytest.approx(expected, rel=0.08, abs=1.5)


def test_seeded_and_deterministic(h100_8b):
    model, _, _ = h100_8b
    spec = SpecDecode("ngram", 4, (0.6, 0.4, 0.3, 0.2), 0.5)
    traffic = Traffic(300, 200, requests_per_second=20.0, num_requests=200, seed=7, warmup_fraction=0.1)
    a, b = simulate(model, EngineLimits(100_000), traffic, spec), simulate(model, EngineLimits(100_000), traffic, spec)
    assert a.summary() == b.summary()
    c = simulate(model, EngineLimits(100_000), dataclasses.replace(traffic, seed=8), spec)
    assert c.summary() != a.summary()
    assert len(a.ttft_s) == 180  # the first 10 % are warm-up


def test_bad_traffic_is_refused(h100_8b):
    model, _, _ = h100_8b
    with pytest.raises(ValueError, match="requests_per_second"):
        simulate(model, EngineLimits(1000), Traffic(10, 10, requests_per_second=0.0))
    with pytest.raises(ValueError, match="arrival"):
        simulate(model, EngineLimits(1000), Traffic(10, 10, arrival_s=[1.0, 0.5]))
    with pytest.raises(ValueError, match="at most"):
        simulate(model, EngineLimits(1000), Traffic(10, 10, requests_per_second=1.0, num_requests=10**6))


def test_a_front_end_on_shared_cores_delays_admission_and_slows_each_step(h100_8b):
    model, _, _ = h100_8b
    traffic = Traffic(512, 129, arrival_s=[0.0, 100.0])
    bare = simulate(model, EngineLimits(500_000), traffic)
    served = simulate(dataclasses.replace(model, frontend_latency_s=0.05, frontend_s_per_step=0.002,
                                          frontend_s_per_seq=0.001), EngineLimits(500_000), traffic)
    # alone: the prompt's step pays the per-step cost, the decode steps the per-step and one sequence's
    assert served.ttft_s == pytest.approx(bare.ttft_s + 0.05 + 0.002, rel=1e-6)
    assert served.tpot_s == pytest.approx(bare.tpot_s + 0.003, rel=1e-3)


def test_steps_that_not_every_sequence_drafts_in_cost_at_least_the_ragged_floor(h100_8b):
    """A calibrated ``ragged_step_s`` (CUDA-graph engines) as ``speculation.evaluate_grid`` charges it: one request
    at a time that drafts half its steps pays the floor in half of them; drafting every step, never."""
    model, _, _ = h100_8b
    model = dataclasses.replace(model, step=dataclasses.replace(model.step, copy_sync_step_s=0.0))  # calibrated
    traffic = Traffic(prompt_tokens=128, output_tokens=65, arrival_s=[0.0, 100.0])
    floor = 0.05
    ragged = dataclasses.replace(model, step=dataclasses.replace(model.step, ragged_step_s=floor))

    def tpot(m, f):
        return float(np.mean(simulate(m, EngineLimits(500_000), traffic, SpecDecode("ngram", 3, (0.0,) * 3, f)).tpot_s))

    assert tpot(ragged, 1.0) == tpot(model, 1.0)
    plain, charged = tpot(model, 0.5), tpot(ragged, 0.5)
    assert charged == pytest.approx(plain + 0.5 * (floor - plain), rel=0.02)  # no accepted drafts: a step a token
