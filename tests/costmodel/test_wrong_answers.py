"""Regression tests for the wrong answers of issue 9 (each failed on main before the fix)."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from advisor import costmodel as cm
from advisor.costmodel.acceptance import per_position_rates
from advisor.costmodel.priors import prior_acceptance


def _predict(gpus, models, sc, calibration=None, **kw):
    draft = models.get(sc.speculator.draft_model) if sc.speculator.draft_model else None
    return cm.predict(sc, gpus[sc.gpu], models[sc.target_model], draft, calibration=calibration, **kw).to_dict()


# --- a method the target cannot run -------------------------------------------------------------------------
def test_mtp_on_a_model_without_mtp_layers_is_refused(gpus, models, make_scenario):
    """main answered 'go 1.56×' for MTP on Llama-3.1-8B (no MTP layers)."""
    sc = make_scenario(method="mtp", draft_model=None, acceptance=None, num_speculative_tokens=None)
    with pytest.raises(cm.CostModelError) as err:
        _predict(gpus, models, sc)
    assert err.value.field == "speculator.method" and "MTP" in err.value.message


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_eagle_without_a_catalog_head_is_refused(gpus, models, make_scenario, method):
    """main synthesized a head and answered with a speculative_config without "model" (vLLM cannot start it)."""
    sc = make_scenario(method=method, draft_model=None, acceptance=None)
    with pytest.raises(cm.CostModelError) as err:
        _predict(gpus, models, sc)
    assert err.value.field == "speculator.method"


def test_eagle_head_of_another_target_is_no_go(gpus, models, make_scenario):
    sc = make_scenario(target_model="llama-3-70b-instruct", gpu_count=4, acceptance=None)  # 8B head on a 70B
    assert models["llama-3-70b-instruct"].hidden_size != models["eagle-llama-3.1-8b"].hidden_size
    d = _predict(gpus, models, sc)
    assert d["decision"] == "no-go" and any("hidden size" in r for r in d["reasons"])


# --- output_tokens = 1 ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("method", "draft"), [("ngram", None), ("draft_model", "llama-3.2-1b-instruct"),
                                               ("eagle", "eagle-llama-3.1-8b")])
def test_one_output_token_gives_speedup_one_and_no_go(gpus, models, make_scenario, method, draft):
    """main: 'go 1.15×' for n-gram with output_tokens 1; the only token comes from prefill."""
    sc = make_scenario(method=method, draft_model=draft, acceptance=None, output_tokens=1,
                       num_speculative_tokens=None)
    d = _predict(gpus, models, sc)
    assert d["speedup"]["expected"] == pytest.approx(1.0, abs=1e-12)
    assert d["speedup"]["low"] == pytest.approx(1.0, abs=1e-12) == d["speedup"]["high"]
    assert d["decision"] == "no-go"
    assert d["latency_ms"]["speculative"]["total"] == pytest.approx(d["latency_ms"]["baseline"]["total"])


def test_decode_covers_output_minus_one_tokens(gpus, models, make_scenario):
    d = _predict(gpus, models, make_scenario(output_tokens=101))
    lat = d["latency_ms"]["baseline"]
    assert lat["decode"] == pytest.approx(100 * d["tpot_ms"]["baseline"], rel=1e-9)


# --- the target alone does not fit ---------------------------------------------------------------------------
def test_target_that_does_not_fit_says_so_first_and_shows_no_speedup(gpus, models, make_scenario):
    """main: 70B bf16 on one RTX-3090 said 'draft + KV exceed VRAM' and showed 2.21× and a TCO."""
    sc = make_scenario(gpu="RTX-3090", target_model="llama-3-70b-instruct", method="draft_model",
                       draft_model="llama-3.2-1b-instruct", acceptance=None)
    d = _predict(gpus, models, sc)
    assert d["decision"] == "no-go"
    assert d["reasons"][0].startswith("the target alone does not fit")
    assert d["speedup"]["expected"] is None and d["speedup"]["low"] is None and d["tco"] is None
    assert d["curve"] == [] and d["vllm"]["speculative_config"] is None and not d["memory"]["deployable"]


# --- acceptance fits keyed by what was measured -------------------------------------------------------------
def _acc_fit(method, drafter, structure="prose", intercept=3.0):
    return cm.AcceptanceModel(method=method, drafter=drafter, structure=structure, logit_intercept=intercept,
                              logit_position_slope=0.0, logit_temperature_slope=0.0,
                              covariance=np.diag([0.01, 0.001, 0.0]).tolist(), source="calibration")


def _cal(acceptance, **kw):
    return cm.Calibration(run_id=5, hardware="H100-SXM", step_time={}, prefill={}, acceptance=acceptance,
                          max_batch_calibrated=64, temperature_range=(0.0, 1.0), **kw)


def test_self_drafted_fit_is_not_reused_for_a_real_drafter(gpus, models, make_scenario):
    """main fell back to the drafter-less key: a real 1B drafter inherited an AL near k + 1."""
    target = "llama-3.1-8b-instruct"
    cal = _cal({cm.acceptance_key("draft_model", None, "prose"): _acc_fit("draft_model", None),
                cm.acceptance_key("draft_model", target, "prose"): _acc_fit("draft_model", target)})
    sc = make_scenario(method="draft_model", draft_model="llama-3.2-1b-instruct", acceptance=None)
    d = _predict(gpus, models, sc, calibration=cal)
    assert d["acceptance"]["source"].startswith("prior")
    assert d["acceptance"]["mean_acceptance_length"] < 2.9  # the prior, not the self-drafting AL ≈ 3


def test_fit_stored_under_a_drafter_it_was_not_measured_with_is_not_used(gpus, models, make_scenario):
    key = cm.acceptance_key("draft_model", "llama-3.2-1b-instruct", "prose")
    cal = _cal({key: _acc_fit("draft_model", "llama-3.1-8b-instruct")})  # the key says 1B, the fit says self
    sc = make_scenario(method="draft_model", draft_model="llama-3.2-1b-instruct", acceptance=None)
    assert _predict(gpus, models, sc, calibration=cal)["acceptance"]["source"].startswith("prior")
    good = _cal({key: _acc_fit("draft_model", "llama-3.2-1b-instruct")})
    assert _predict(gpus, models, sc, calibration=good)["acceptance"]["source"] == "calibration:5"


@pytest.mark.parametrize(("conditions", "words"), [
    ({"weights_dtype": "fp8"}, "fp8"), ({"tensor_parallel_size": 2}, "tensor-parallel"),
    ({"engine_mode": "eager"}, "CUDA graphs")])
def test_calibration_measured_under_other_conditions_is_not_substituted(gpus, models, make_scenario, conditions,
                                                                       words):
    key = cm.acceptance_key("draft_model", "llama-3.2-1b-instruct", "prose")
    cal = _cal({key: _acc_fit("draft_model", "llama-3.2-1b-instruct")}, **conditions)
    sc = make_scenario(method="draft_model", draft_model="llama-3.2-1b-instruct", acceptance=None)
    d = _predict(gpus, models, sc, calibration=cal)
    assert d["acceptance"]["source"].startswith("prior") and d["calibration_run_id"] is None
    assert any("not used" in r and words in r for r in d["reasons"])
    assert cm.calibration_mismatch(cal, sc, gpus["H100-SXM"])
    same = _cal({key: _acc_fit("draft_model", "llama-3.2-1b-instruct")}, weights_dtype="bf16",
                tensor_parallel_size=1, engine_mode="graphs")
    assert _predict(gpus, models, sc, calibration=same)["acceptance"]["source"] == "calibration:5"


def test_service_keys_fits_by_the_drafter_really_measured():
    from advisor.services.calibrations import measured_conditions, measured_drafter
    assert measured_drafter({"draft_model": "llama-3.2-1b-instruct"}, "draft_model", "t") == "t"
    assert measured_drafter({"draft_model": "llama-3.2-1b-instruct", "draft_model_path": "self"},
                            "draft_model", "t") == "t"
    assert measured_drafter({"draft_model": "d", "draft_model_path": "/m/d"}, "draft_model", "t") == "d"
    assert measured_drafter({}, "ngram", "t") is None
    assert measured_conditions({"engine": {"dtype": "bfloat16"}}, {"enforce_eager": False,
                                                                    "tensor_parallel_size": 2}) == \
        {"weights_dtype": "bf16", "kv_cache_dtype": None, "tensor_parallel_size": 2, "engine_mode": "graphs"}
    assert measured_conditions({}, {"dtype": "auto"})["weights_dtype"] is None
    # run 11's engines: vLLM's own fp8 (its dtype says only bfloat16), an fp8 KV cache in vLLM's spelling
    got = measured_conditions({}, {"dtype": "bfloat16", "quantization": "fp8", "kv_cache_dtype": "fp8_e4m3"})
    assert (got["weights_dtype"], got["kv_cache_dtype"]) == ("fp8", "fp8")
    assert measured_conditions({}, {"kv_cache_dtype": "auto", "quantization": "awq"})["weights_dtype"] == "int4"


# --- one function, one answer ---------------------------------------------------------------------------------
def test_method_comparison_does_not_change_the_answer(gpus, models, make_scenario):
    """main: with compare_methods the grid used a constant drafting fraction, the interval the T-dependent one."""
    fit = dataclasses.replace(prior_acceptance("ngram", "code"), draft_fraction=0.9, draft_fraction_logit=2.0,
                              draft_fraction_temperature_slope=-3.0, source="calibration")
    cal = _cal({cm.acceptance_key("ngram", None, "code"): fit})
    sc = make_scenario(method="ngram", draft_model=None, acceptance=None, structure="code", temperature=0.9,
                       num_speculative_tokens=None)
    with_cmp = _predict(gpus, models, sc, calibration=cal)
    without = _predict(gpus, models, sc, calibration=cal, compare_methods=False)
    assert with_cmp["methods"] and not without["methods"]
    for key in ("speedup", "num_speculative_tokens", "acceptance", "curve", "dynamic_sd", "tco", "decision"):
        assert with_cmp[key] == without[key], key


def test_a_longer_output_drafts_more_where_the_calibration_read_it(gpus, models, make_scenario):
    """An n-gram fit with an output slope (the probes' output checkpoints): the answer's drafting fraction is the
    fit's over the workload's output, the same in the point grid, the interval and the methods compared; a longer
    output drafts more and speeds up more. Read at most at the fit's limit."""
    from advisor.costmodel.acceptance import draft_fraction_at

    fit = dataclasses.replace(prior_acceptance("ngram", "code"), draft_fraction_logit=-2.0,
                              draft_fraction_output_slope=0.9, draft_fraction_output_tokens_up_to=230.0,
                              source="calibration")
    cal = _cal({cm.acceptance_key("ngram", None, "code"): fit})
    answers = {}
    for tokens in (32, 128, 230, 2048):
        sc = make_scenario(method="ngram", draft_model=None, acceptance=None, structure="code", output_tokens=tokens,
                           num_speculative_tokens=4, concurrency=1)
        answers[tokens] = _predict(gpus, models, sc, calibration=cal)
        assert answers[tokens]["acceptance"]["draft_fraction"] == pytest.approx(draft_fraction_at(fit, 0.0, tokens))
        again = _predict(gpus, models, sc, calibration=cal, compare_methods=False)
        assert answers[tokens]["speedup"] == again["speedup"]
    shares = [answers[t]["acceptance"]["draft_fraction"] for t in (32, 128, 230, 2048)]
    assert shares[0] < shares[1] < shares[2] == shares[3]
    assert answers[32]["speedup"]["decode"] < answers[128]["speedup"]["decode"] < answers[230]["speedup"]["decode"]
    # a stated AL counts the drafting steps only: how often n-gram drafts still comes from the calibration
    stated = make_scenario(method="ngram", draft_model=None, structure="code", output_tokens=32,
                           acceptance=cm.AcceptanceInput(mean_acceptance_length=2.5), num_speculative_tokens=4)
    assert _predict(gpus, models, stated, calibration=cal)["acceptance"]["draft_fraction"] == pytest.approx(shares[0])


def test_each_draft_is_accepted_more_along_a_longer_output_where_the_calibration_read_it(gpus, models, make_scenario):
    """An n-gram fit with a slope along the output (calibration.fit, from the probes' output checkpoints): the answer's
    AL is the fit's at the workload's output, read at most at the fit's limit, whether n-gram is the scenario's
    method or one compared with an EAGLE head's; a stated AL stays as stated."""
    from advisor.costmodel.acceptance import at_output
    from calibration.fit import al_of

    fit = dataclasses.replace(prior_acceptance("ngram", "code"), draft_fraction_logit=-2.0, logit_output_slope=0.6,
                              logit_output_ref_tokens=100.0, draft_fraction_output_tokens_up_to=230.0,
                              source="calibration")
    cal = _cal({cm.acceptance_key("ngram", None, "code"): fit})
    al = {}
    for tokens in (32, 100, 230, 2048):
        own = make_scenario(method="ngram", draft_model=None, acceptance=None, structure="code", output_tokens=tokens,
                            num_speculative_tokens=4, concurrency=1)
        al[tokens] = _predict(gpus, models, own, calibration=cal)["acceptance"]["mean_acceptance_length"]
        assert al[tokens] == pytest.approx(al_of(at_output(fit, tokens), 0.0, 4))
        head = make_scenario(structure="code", output_tokens=tokens, num_speculative_tokens=4, concurrency=1)
        row = next(m for m in _predict(gpus, models, head, calibration=cal)["methods"] if m["method"] == "ngram")
        assert row["mean_acceptance_length"] == pytest.approx(
            al_of(at_output(fit, tokens), 0.0, row["num_speculative_tokens"]))
    assert al[32] < al[100] < al[230] == al[2048] and al[100] == pytest.approx(al_of(fit, 0.0, 4))
    stated = make_scenario(method="ngram", draft_model=None, structure="code", output_tokens=32,
                           acceptance=cm.AcceptanceInput(mean_acceptance_length=2.5), num_speculative_tokens=4)
    assert _predict(gpus, models, stated, calibration=cal)["acceptance"]["mean_acceptance_length"] == pytest.approx(2.5)


# --- acceptance words -----------------------------------------------------------------------------------------
def test_acceptance_words_follow_vllm(gpus, models, make_scenario):
    """AL (in and out) = 1 + A/N over drafting steps; acceptance_rate = A/D; tokens per cycle carries the drafting
    fraction. main read a pasted n-gram AL as tokens per step and reported tokens per step as AL."""
    sc = make_scenario(method="ngram", draft_model=None, num_speculative_tokens=4,
                       acceptance=cm.AcceptanceInput(mean_acceptance_length=3.0))
    acc = _predict(gpus, models, sc)["acceptance"]
    assert acc["mean_acceptance_length"] == pytest.approx(3.0, abs=1e-6)
    assert acc["acceptance_rate"] == pytest.approx(0.5, abs=1e-6)
    assert 0 < acc["draft_fraction"] < 1
    assert acc["tokens_per_cycle"] == pytest.approx(1 + acc["draft_fraction"] * 2.0, abs=1e-6)
    assert acc["mean_acceptance_length"] == pytest.approx(1 + sum(acc["per_position"]), abs=1e-9)
    rate = _predict(gpus, models, dataclasses.replace(sc, acceptance=cm.AcceptanceInput(acceptance_rate=0.5)))
    assert rate["acceptance"]["mean_acceptance_length"] == pytest.approx(3.0, abs=1e-6)
    every_step = dataclasses.replace(sc, acceptance=cm.AcceptanceInput(mean_acceptance_length=3.0,
                                                                       draft_fraction=1.0))
    assert _predict(gpus, models, every_step)["acceptance"]["tokens_per_cycle"] == pytest.approx(3.0, abs=1e-6)


# --- the dynamic-SD table is advice; the command runs one k -----------------------------------------------------
@pytest.mark.parametrize("k", [1, 2, 3])
def test_dynamic_table_is_capped_at_k(gpus, models, make_scenario, k):
    """vLLM caps table entries at num_speculative_tokens; main's table held k up to 8 next to k = 2."""
    sc = make_scenario(concurrency=16, num_speculative_tokens=k, acceptance=cm.AcceptanceInput(
        per_position=(0.95, 0.9, 0.85, 0.8, 0.75, 0.7)))
    d = _predict(gpus, models, sc)
    assert all(row[2] <= d["num_speculative_tokens"] == k for row in d["dynamic_sd"])
    band = next(row for row in d["dynamic_sd"] if row[0] <= 16 <= row[1])
    assert band[2] == (k if d["speedup"]["expected"] > 1 else 0)


def test_the_command_runs_one_k_where_the_best_k_varies(gpus, models, make_scenario):
    """Until 2026-12-06 the command carried the table (num_speculative_tokens_per_batch_size), with which vLLM 0.24
    runs its V1 model runner on piecewise CUDA graphs: EAGLE-3 on an H100 ran 0.76-0.79x the baseline at B=1 where
    the same k without the table ran 1.47-2.27x (benchmarks/data/h100-vllm0.24-dynamic-table)."""
    d = _predict(gpus, models, make_scenario(concurrency=8, num_speculative_tokens=None))
    assert len({row[2] for row in d["dynamic_sd"]}) > 1  # the best k varies over the bands
    cfg = d["vllm"]["speculative_config"]
    assert "num_speculative_tokens_per_batch_size" not in cfg and cfg["num_speculative_tokens"] == d[
        "num_speculative_tokens"]
    assert "per_batch_size" not in d["vllm"]["serve_flags"]
    assert any("the command keeps k=" in r for r in d["reasons"])


@pytest.mark.parametrize("method,drafter,temperature,sampled", [
    ("draft_model", "llama-3.2-1b-instruct", 0.7, True), ("draft_model", "llama-3.2-1b-instruct", 0.0, False),
    ("eagle3", "eagle3-llama-3.1-8b", 0.7, False)])
def test_a_draft_model_samples_its_drafts_at_temperature(gpus, models, make_scenario, method, drafter, temperature,
                                                         sampled):
    """Until 2026-12-06 the command left vLLM's default draft_sample_method ("greedy": the drafter proposes its
    argmax), while the calibration measured a draft model sampling its drafts, as the priors assume: at T = 0.7 the
    greedy drafter accepted less (benchmarks/data/draft-sampling-cpu.json)."""
    sc = make_scenario(concurrency=1, temperature=temperature, method=method, draft_model=drafter)
    cfg = _predict(gpus, models, sc)["vllm"]["speculative_config"]
    assert (cfg.get("draft_sample_method") == "probabilistic") is sampled


def test_chosen_k_runs_in_the_workloads_band(gpus, models, make_scenario):
    d = _predict(gpus, models, make_scenario(concurrency=8, num_speculative_tokens=None))
    band = next(row for row in d["dynamic_sd"] if row[0] <= 8 <= row[1])
    assert band[2] == d["num_speculative_tokens"]


# --- concurrency above KV capacity queues -----------------------------------------------------------------------
def test_concurrency_above_capacity_is_capped_and_queues(gpus, models, make_scenario):
    """main: C = 100 000 computed as if all were resident (TPOT of seconds, a tiny $/token). Beyond the cap the
    server is full with a queue, as it is with one client more than it holds (both admit requests one by one)."""
    huge = _predict(gpus, models, make_scenario(concurrency=100_000))
    cap = huge["concurrency"]["resident_baseline"]
    assert huge["concurrency"]["queued"] and cap <= 256
    at_cap = _predict(gpus, models, make_scenario(concurrency=int(cap) + 1))
    assert huge["tpot_ms"]["baseline"] == pytest.approx(at_cap["tpot_ms"]["baseline"], rel=1e-9)
    assert huge["throughput_tok_s"]["baseline"] == pytest.approx(at_cap["throughput_tok_s"]["baseline"], rel=1e-9)
    assert huge["tpot_ms"]["baseline"] < 1000
    assert huge["tco"]["usd_per_million_output_tokens"]["baseline"] == pytest.approx(
        at_cap["tco"]["usd_per_million_output_tokens"]["baseline"], rel=1e-9)
    assert any("queue" in r for r in huge["reasons"])


# --- a clear no-go stays no-go ----------------------------------------------------------------------------------
def test_clear_no_go_outranks_outside_calibrated_range(gpus, models, make_scenario):
    """main answered 'calibrate' when the interval lay entirely below 1, because the batch was beyond calibration."""
    cal = cm.Calibration.from_dict({
        "run_id": 3, "hardware": "H100-SXM",
        "step_time": {"llama-3.1-8b-instruct": cm.default_step_time_params(gpus["H100-SXM"]).to_dict()},
        "prefill": {}, "acceptance": {}, "max_batch_calibrated": 4, "temperature_range": [0.0, 1.0]})
    sc = make_scenario(concurrency=256, num_speculative_tokens=4,
                       acceptance=cm.AcceptanceInput(mean_acceptance_length=1.2))
    d = _predict(gpus, models, sc, calibration=cal)
    assert d["speedup"]["high"] < cm.GO_THRESHOLD
    assert d["decision"] == "no-go"


# --- no NaN / infinity ------------------------------------------------------------------------------------------
def test_per_position_with_equal_neighbours_gives_a_finite_answer(gpus, models, make_scenario):
    sc = make_scenario(num_speculative_tokens=3, acceptance=cm.AcceptanceInput(per_position=(0.7, 0.7, 0.7)))
    d = _predict(gpus, models, sc)
    assert all(math.isfinite(x) for x in (d["speedup"]["expected"], d["speedup"]["low"], d["speedup"]["high"]))
    assert d["acceptance"]["mean_acceptance_length"] == pytest.approx(3.1, abs=0.3)


def test_uncalibrated_draft_model_is_not_confident(gpus, models, make_scenario):
    """Issue 8: on vLLM 0.24 an 8B target + 1B draft model at high acceptance ran slower than no speculation on an
    H200, while main said 'go 1.58× (1.47–1.69×)'. The drafter's per-step overhead is a wide prior until measured."""
    sc = make_scenario(gpu="H200-SXM", method="draft_model", draft_model="llama-3.2-1b-instruct", concurrency=1,
                       num_speculative_tokens=3, acceptance=cm.AcceptanceInput(per_position=(0.8, 0.64, 0.51)))
    d = _predict(gpus, models, sc)
    assert d["decision"] != "go" and d["speedup"]["low"] < 1.05
    r = per_position_rates(cm.prior_acceptance("draft_model", "prose"), 0.0, 3)
    assert r.shape == (3,)
