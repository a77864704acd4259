"""predict(): the answer's shape, provenance, determinism and the behaviours design.md §1 asks for."""
from __future__ import annotations

import dataclasses
import importlib
import json
import re

import numpy as np
import pytest

from advisor import costmodel as cm
from advisor.costmodel.speculation import StepSamples

ALLOWED_PROVENANCE = re.compile(r"^(input|default|catalog:.+|calibration:\d+|prior:.+)$")


def _predict(gpus, models, sc, draft=None):
    draft_name = draft if draft is not None else sc.speculator.draft_model
    return cm.predict(sc, gpus[sc.gpu], models[sc.target_model], models.get(draft_name) if draft_name else None)


def test_answer_has_the_contract_keys(gpus, models, make_scenario):
    d = _predict(gpus, models, make_scenario()).to_dict()
    for key in ("decision", "reasons", "speedup", "num_speculative_tokens", "tpot_ms", "ttft_ms", "latency_ms",
                "throughput_tok_s", "acceptance", "memory", "curve", "break_even_concurrency", "dynamic_sd",
                "methods", "tco", "vllm", "checks", "provenance", "cost_model_version", "calibration_run_id"):
        assert key in d, key
    assert set(d["speedup"]) >= {"expected", "low", "high"}
    assert d["speedup"]["low"] <= d["speedup"]["expected"] <= d["speedup"]["high"]
    assert set(d["latency_ms"]["baseline"]) == {"prefill", "decode", "queue", "total"}
    for key in ("target_weights_gb", "draft_weights_gb", "kv_bytes_per_token_target", "kv_bytes_per_token_draft",
                "kv_space_gb", "activation_reserve_gb", "headroom_gb", "max_concurrency_baseline",
                "max_concurrency_speculative", "fits"):
        assert key in d["memory"], key
    assert [c["concurrency"] for c in d["curve"]] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert {"concurrency", "speedup", "low", "high", "best_k", "tpot_ms_baseline", "tpot_ms_speculative"} \
        <= set(d["curve"][0])
    for key in ("gpu_hour_usd", "usd_per_million_output_tokens", "gpus_needed", "monthly_usd", "monthly_savings_usd"):
        assert key in d["tco"], key
    assert d["cost_model_version"] == cm.COST_MODEL_VERSION and d["calibration_run_id"] is None
    json.dumps(d)  # JSON-able


def test_provenance_covers_numbers_with_allowed_sources(gpus, models, make_scenario):
    d = _predict(gpus, models, make_scenario(acceptance=None)).to_dict()
    prov = d["provenance"]
    assert all(ALLOWED_PROVENANCE.match(v) for v in prov.values()), {k: v for k, v in prov.items()
                                                                      if not ALLOWED_PROVENANCE.match(v)}
    assert prov["memory.target_weights_gb"] == "catalog:llama-3.1-8b-instruct"
    assert prov["memory.draft_weights_gb"] == "catalog:eagle-llama-3.1-8b"
    assert prov["tco.gpu_hour_usd"] == "input"
    assert prov["speedup.expected"].startswith("prior:")
    assert prov["acceptance.mean_acceptance_length"].startswith("prior:")
    assert prov["num_speculative_tokens"] == "input"
    for path in ("speedup.low", "tpot_ms.baseline", "ttft_ms.baseline", "memory.kv_space_gb", "tco.monthly_usd.baseline"):
        assert path in prov, path


def test_deterministic(gpus, models, make_scenario):
    sc = make_scenario(acceptance=None)
    assert _predict(gpus, models, sc).to_dict() == _predict(gpus, models, sc).to_dict()


def test_stated_al_is_used_and_marked_input(gpus, models, make_scenario):
    d = _predict(gpus, models, make_scenario()).to_dict()
    assert d["acceptance"]["mean_acceptance_length"] == pytest.approx(2.04)
    assert d["acceptance"]["source"] == "input"


def test_low_concurrency_eagle_is_go_and_high_concurrency_is_not(gpus, models, make_scenario):
    low = _predict(gpus, models, make_scenario(concurrency=1)).to_dict()
    high = _predict(gpus, models, make_scenario(concurrency=256)).to_dict()
    assert low["decision"] == "go" and low["speedup"]["low"] >= cm.GO_THRESHOLD
    assert high["speedup"]["expected"] < low["speedup"]["expected"]
    assert high["decision"] in ("no-go", "calibrate")
    assert any(r.startswith("verify cost") for r in high["reasons"])


def test_curve_falls_with_concurrency_and_break_even_is_consistent(gpus, models, make_scenario):
    d = _predict(gpus, models, make_scenario()).to_dict()
    sp = [c["speedup"] for c in d["curve"]]
    assert sp[0] > sp[-1]
    be = d["break_even_concurrency"]
    if be is not None:
        assert all(c["speedup"] >= 1 for c in d["curve"] if c["concurrency"] < be)
        assert all(c["speedup"] < 1 for c in d["curve"] if c["concurrency"] > be * 1.01)
    table = d["dynamic_sd"]
    assert table[0][0] == 1 and all(len(row) == 3 for row in table)


def test_best_k_chosen_when_absent(gpus, models, make_scenario):
    d = _predict(gpus, models, make_scenario(num_speculative_tokens=None, concurrency=1)).to_dict()
    assert 1 <= d["num_speculative_tokens"] <= 8
    assert d["provenance"]["num_speculative_tokens"] != "input"


def test_tokenizer_mismatch_is_no_go(gpus, models, make_scenario):
    sc = make_scenario(method="draft_model", draft_model="qwen3-0.6b", acceptance=None)
    d = _predict(gpus, models, sc).to_dict()
    assert d["decision"] == "no-go"
    assert any("tokenizer mismatch" in r for r in d["reasons"])


def test_fp8_kv_cache_at_long_context(gpus, models, make_scenario):
    """An fp8 KV cache halves the attention's bytes (read at 0.72x bf16's time, as vLLM 0.24 did on the H200): at
    16 sequences of 16k tokens the KV read (≈ 35 GB per step) outweighs the 16 GB of weights, so a decode step is
    markedly faster; the serve flags carry it, and a calibration measured with the other KV-cache dtype is not used."""
    long = dict(concurrency=16, prompt_tokens=16_384, output_tokens=512)  # resident in either cache
    auto = _predict(gpus, models, make_scenario(**long)).to_dict()
    fp8 = _predict(gpus, models, make_scenario(kv_cache_dtype="fp8", **long)).to_dict()
    assert fp8["tpot_ms"]["baseline"] < 0.85 * auto["tpot_ms"]["baseline"]
    assert fp8["memory"]["kv_bytes_per_token_target"] * 2 == auto["memory"]["kv_bytes_per_token_target"]
    assert "--kv-cache-dtype fp8" in fp8["vllm"]["serve_flags"]
    assert "--kv-cache-dtype" not in auto["vllm"]["serve_flags"]
    cal = cm.Calibration(0, "H100-SXM", {}, {}, {}, 8, (0.0, 0.0), kv_cache_dtype="auto")
    assert cm.calibration_mismatch(cal, make_scenario(kv_cache_dtype="fp8"), gpus["H100-SXM"]) == (
        "measured with KV-cache dtype auto, not fp8",)
    assert cm.calibration_mismatch(cal, make_scenario(), gpus["H100-SXM"]) == ()
    with pytest.raises(cm.CostModelError) as err:
        _predict(gpus, models, make_scenario(kv_cache_dtype="fp4"))
    assert err.value.field == "kv_cache_dtype"


def test_concurrency_beyond_the_drafters_kv_queues(gpus, models, make_scenario):
    sc = make_scenario(gpu="L40S", method="draft_model", draft_model="llama-3.2-1b-instruct", acceptance=None,
                       concurrency=64, prompt_tokens=2048, output_tokens=1024)
    d = _predict(gpus, models, sc).to_dict()
    assert not d["memory"]["fits"] and d["concurrency"]["queued"]
    assert d["concurrency"]["resident_speculative"] < 64
    assert any("queue" in r for r in d["reasons"]) and d["decision"] != "go"


def test_prefill_dominated_workload_is_flagged(gpus, models, make_scenario):
    d = _predict(gpus, models, make_scenario(prompt_tokens=8000, output_tokens=16, structure="rag",
                                             concurrency=16)).to_dict()
    assert d["latency_ms"]["prefill_share"] > 0.5
    assert any("prefill is" in r and "prefill-dominated" in r for r in d["reasons"])
    assert d["speedup"]["expected"] < d["speedup"]["decode"]


def test_high_temperature_creative_lowers_acceptance(gpus, models, make_scenario):
    cold = _predict(gpus, models, make_scenario(acceptance=None, structure="json", temperature=0.0)).to_dict()
    hot = _predict(gpus, models, make_scenario(acceptance=None, structure="creative", temperature=1.0)).to_dict()
    assert hot["acceptance"]["mean_acceptance_length"] < cold["acceptance"]["mean_acceptance_length"] - 0.2
    assert hot["speedup"]["expected"] < cold["speedup"]["expected"]
    assert any(r.startswith("AL ") and "temperature 1" in r for r in hot["reasons"])


def test_prior_interval_is_wider_than_input_interval(gpus, models, make_scenario):
    given = _predict(gpus, models, make_scenario()).to_dict()["speedup"]
    prior = _predict(gpus, models, make_scenario(acceptance=None)).to_dict()["speedup"]
    assert prior["high"] - prior["low"] > given["high"] - given["low"]


def test_arrival_rate_uses_littles_law(gpus, models, make_scenario):
    d = _predict(gpus, models, make_scenario(concurrency=None, requests_per_second=2.0)).to_dict()
    c = d["concurrency"]
    assert c["source"] == "input:requests_per_second"
    lat_s = d["latency_ms"]["baseline"]["total"] / 1e3
    assert c["baseline"] == pytest.approx(max(2.0 * lat_s, 1.0), rel=0.02)  # B = λ·L
    assert d["tco"]["load_output_tokens_per_second"] == pytest.approx(2.0 * 256)


def test_overload_saturates(gpus, models, make_scenario):
    d = _predict(gpus, models, make_scenario(concurrency=None, requests_per_second=1e6)).to_dict()
    assert d["concurrency"]["saturated"] and d["concurrency"]["baseline"] == 256
    assert any("saturated" in r for r in d["reasons"])


def test_a_saturating_arrival_rate_compares_the_rates_one_server_sustains(gpus, models, make_scenario):
    """Qwen3-32B on an H200, 32k-token RAG prompts at 2 req/s: neither server keeps up (7 sequences resident
    without the drafter, 4 with it), so both queues grow without end. Comparing their latencies at 7 and at 4
    resident sequences said "go, 1.65×" (fewer prompts prefilled together), while the drafter's server sustains
    fewer requests per second and the TCO needs more GPUs. The speedup is the ratio of the rates sustained, as a
    closed loop beyond both caps answers it."""
    sc = make_scenario(gpu="H200-SXM", target_model="qwen3-32b", method="draft_model", draft_model="qwen3-1.7b",
                       num_speculative_tokens=None, acceptance=None, prompt_tokens=32_000, output_tokens=300,
                       structure="rag", concurrency=None, requests_per_second=2.0)
    d = _predict(gpus, models, sc).to_dict()
    c, sp, thr = d["concurrency"], d["speedup"], d["throughput_tok_s"]
    assert c["saturated"] and (c["baseline"], c["speculative"]) == (7, 4)
    assert sp["expected"] == pytest.approx(thr["speculative"] / thr["baseline"], rel=1e-9) and sp["expected"] < 1
    assert d["decision"] == "no-go" and d["tco"]["gpus_needed"]["speculative"] > d["tco"]["gpus_needed"]["baseline"]
    assert any("one server sustains 0.131 req/s without speculation and 0.123 with; at 2 req/s" in r
               for r in d["reasons"])
    closed = _predict(gpus, models, dataclasses.replace(
        sc, workload=dataclasses.replace(sc.workload, concurrency=65_536, requests_per_second=None))).to_dict()
    assert closed["num_speculative_tokens"] == d["num_speculative_tokens"]
    for key in ("expected", "low", "high"):
        assert closed["speedup"][key] == pytest.approx(sp[key], rel=1e-9)


def test_serve_flags_limit_the_model_length_where_the_window_does_not_fit(gpus, models, make_scenario):
    """Llama-3.1-8B on a 24 GB RTX 3090 leaves ~4 GB of KV space; vLLM's default --max-model-len (the model's
    131,072-token window, 16 GiB of KV) stops the engine at start ("To serve at least one request with the models's
    max seq len ... KV cache is needed, which is larger than the available KV cache memory"). The command the
    answer gives must start: it limits the length to what the KV space holds, and no more than needed."""
    sc = make_scenario(gpu="RTX-3090", method="ngram", draft_model=None, num_speculative_tokens=4, acceptance=None,
                       prompt_tokens=1000, output_tokens=500, concurrency=1)
    d = _predict(gpus, models, sc).to_dict()
    mem, flags = d["memory"], d["vllm"]["serve_flags"]
    m = int(re.search(r"--max-model-len (\d+)", flags).group(1))
    per_token = mem["kv_bytes_per_token_target"] + mem["kv_bytes_per_token_draft"]
    planned = (mem["kv_space_gb"] - cm.memory.MAX_MODEL_LEN_RESERVE_GB) * 1e9  # what vLLM held beyond the model
    assert 1500 <= m < 131_072 and (m + 4 + 16) * per_token <= planned  # + k slots, a null block
    assert (m + 4 + 3 * 16) * per_token > planned  # within blocks of the longest: no shorter
    assert mem["max_model_len"] == m and any(r.startswith(f"--max-model-len {m}:") for r in d["reasons"])
    roomy = _predict(gpus, models, dataclasses.replace(sc, gpu="H100-SXM")).to_dict()  # 16 GiB of window fits
    assert roomy["memory"]["max_model_len"] is None and "--max-model-len" not in roomy["vllm"]["serve_flags"]


@pytest.mark.parametrize("dtype,loads,flag", [
    ("bf16", "meta-llama/Llama-3.1-8B-Instruct", None), ("fp16", "meta-llama/Llama-3.1-8B-Instruct", "--dtype float16"),
    ("fp8", "meta-llama/Llama-3.1-8B-Instruct", "--quantization fp8"),
    ("int8", "'<int8 (W8A8, e.g. llm-compressor) checkpoint of meta-llama/Llama-3.1-8B-Instruct>'", None),
    ("int4", "'<int4 (AWQ or GPTQ) checkpoint of meta-llama/Llama-3.1-8B-Instruct>'", None)])
def test_serve_flags_load_the_weights_the_answer_priced(gpus, models, make_scenario, dtype, loads, flag):
    """vLLM quantizes a bf16 repository to fp8 as it loads it (--quantization fp8), and serves fp16 when told to
    (its "auto" takes the config's bf16); int8 and int4 need a checkpoint quantized offline, which it reads the
    method of from its config. The 8B repository named for int4 would load 16 GB of bf16 weights where the answer
    priced 5."""
    d = _predict(gpus, models, make_scenario(weights_dtype=dtype)).to_dict()
    flags = d["vllm"]["serve_flags"]
    assert flags.startswith(f"vllm serve {loads} --speculative-config ")
    assert (flag in flags) if flag else ("--quantization" not in flags and "--dtype" not in flags)
    assert any(r.startswith(f"{dtype} weights: serve an {dtype}") for r in d["reasons"]) == (dtype in ("int4", "int8"))


def test_suffix_decoding_says_what_vllm_needs_beside_it(gpus, models, make_scenario):
    """vLLM's suffix decoding imports Arctic Inference when the engine starts (ImportError without it)."""
    d = _predict(gpus, models, make_scenario(method="suffix", draft_model=None, acceptance=None)).to_dict()
    assert d["vllm"]["speculative_config"]["method"] == "suffix"
    assert any(c["severity"] == "warning" and "pip install arctic-inference" in c["message"] for c in d["checks"])
    assert any(r.startswith("warning: suffix decoding needs Arctic Inference") for r in d["reasons"])


def test_a_request_beyond_the_context_window_is_not_served(gpus, models, make_scenario):
    """400,000 prompt tokens for Llama-3.1-8B (a 131,072-token window) fit a B200's memory, but vLLM rejects the
    request: no-go, saying why, with no speedup and no command."""
    d = _predict(gpus, models, make_scenario(gpu="B200", method="ngram", draft_model=None, acceptance=None,
                                             prompt_tokens=400_000, output_tokens=500, concurrency=1)).to_dict()
    assert d["decision"] == "no-go" and d["speedup"]["expected"] is None and d["vllm"]["serve_flags"] is None
    assert d["reasons"][0] == ("a request of 400,500 tokens (prompt + output) exceeds llama-3.1-8b-instruct's "
                               "context window of 131,072 tokens: vLLM rejects it")
    assert not d["memory"]["deployable"] and d["memory"]["context_window_tokens"] == 131_072


def test_ngram_and_methods_comparison(gpus, models, make_scenario):
    d = _predict(gpus, models, make_scenario(method="ngram", draft_model=None, structure="rag",
                                             acceptance=None)).to_dict()
    assert d["memory"]["draft_weights_gb"] == 0.0
    assert d["vllm"]["speculative_config"]["method"] == "ngram"
    assert d["vllm"]["speculative_config"]["prompt_lookup_max"] == 5
    methods = {m["method"] for m in d["methods"]}
    assert {"ngram", "suffix", "eagle", "eagle3"} <= methods


def test_vllm_settings(gpus, models, make_scenario):
    d = _predict(gpus, models, make_scenario()).to_dict()
    cfg = d["vllm"]["speculative_config"]
    assert cfg["method"] == "eagle" and cfg["model"] == "yuhuili/EAGLE-LLaMA3.1-Instruct-8B"
    assert cfg["num_speculative_tokens"] == 2
    flags = d["vllm"]["serve_flags"]
    assert flags.startswith("vllm serve meta-llama/Llama-3.1-8B-Instruct --speculative-config ")
    assert "--tensor-parallel-size 1" in flags


def test_tco_with_load_and_slo(gpus, models, make_scenario):
    sc = make_scenario(load=cm.TcoLoad(output_tokens_per_second=20_000), slo=cm.Slo(tpot_ms=10))
    tco = _predict(gpus, models, sc).to_dict()["tco"]
    assert tco["gpus_needed"]["speculative"] <= tco["gpus_needed"]["baseline"]
    assert tco["monthly_usd"]["baseline"] == pytest.approx(tco["gpus_needed"]["baseline"] * 730 * 3.0)
    assert tco["monthly_savings_usd"] >= 0


@pytest.mark.parametrize(("changes", "field"), [
    ({"structure": "poetry"}, "workload.structure"),
    ({"method": "lookahead"}, "speculator.method"),
    ({"temperature": 3.0}, "workload.temperature"),
    ({"concurrency": 0}, "workload.concurrency"),
    ({"num_speculative_tokens": 40}, "speculator.num_speculative_tokens"),
    ({"weights_dtype": "fp4"}, "weights_dtype"),
    ({"gpu_count": 0}, "gpu_count"),
    ({"method": "draft_model", "draft_model": None}, "speculator.draft_model"),
])
def test_impossible_inputs_name_the_field(gpus, models, make_scenario, changes, field):
    with pytest.raises(cm.CostModelError) as err:
        _predict(gpus, models, make_scenario(**changes))
    assert err.value.field == field


def test_impossible_al_names_acceptance_field(gpus, models, make_scenario):
    with pytest.raises(cm.CostModelError) as err:
        _predict(gpus, models, make_scenario(acceptance=cm.AcceptanceInput(mean_acceptance_length=3.5)))
    assert err.value.field == "acceptance.mean_acceptance_length"


def test_calibration_is_used_and_ranges_checked(gpus, models, make_scenario):
    cal = cm.Calibration.from_dict({
        "run_id": 7, "hardware": "H100-SXM",
        "step_time": {"llama-3.1-8b-instruct": {"bandwidth_efficiency": 0.7, "compute_efficiency": 0.5,
                                                "fixed_overhead_s": 8e-4,
                                                "covariance": [[1e-4, 0, 0], [0, 1e-4, 0], [0, 0, 1e-8]]}},
        "prefill": {}, "acceptance": {}, "max_batch_calibrated": 16, "temperature_range": [0.0, 1.0]})
    assert cm.Calibration.from_dict(cal.to_dict()) == cal
    sc = make_scenario(concurrency=8)
    d = cm.predict(sc, gpus["H100-SXM"], models["llama-3.1-8b-instruct"], models["eagle-llama-3.1-8b"],
                   calibration=cal).to_dict()
    assert d["calibration_run_id"] == 7 and d["provenance"]["tpot_ms.baseline"] == "calibration:7"
    far = cm.predict(make_scenario(concurrency=64), gpus["H100-SXM"], models["llama-3.1-8b-instruct"],
                     models["eagle-llama-3.1-8b"], calibration=cal).to_dict()
    assert far["decision"] in ("calibrate", "no-go")
    if far["decision"] == "calibrate":
        assert any("outside calibrated range" in r for r in far["reasons"])


def test_calibrated_acceptance_model_round_trip(gpus, models, make_scenario):
    acc = cm.AcceptanceModel(method="eagle", drafter="eagle-llama-3.1-8b", structure="prose", logit_intercept=1.0,
                             logit_position_slope=-0.1, logit_temperature_slope=-0.5,
                             covariance=[[0.01, 0, 0], [0, 0.001, 0], [0, 0, 0.01]], source="fit")
    cal = cm.Calibration(run_id=3, hardware="H100-SXM", step_time={}, prefill={},
                         acceptance={cm.acceptance_key("eagle", "eagle-llama-3.1-8b", "prose"): acc},
                         max_batch_calibrated=64, temperature_range=(0.0, 1.0))
    assert cm.AcceptanceModel.from_dict(acc.to_dict()) == acc
    d = cm.predict(make_scenario(acceptance=None), gpus["H100-SXM"], models["llama-3.1-8b-instruct"],
                   models["eagle-llama-3.1-8b"], calibration=cal).to_dict()
    assert d["acceptance"]["source"] == "calibration:3"
    assert d["provenance"]["acceptance.mean_acceptance_length"] == "calibration:3"


def test_tensor_parallel_70b(gpus, models, make_scenario):
    sc = make_scenario(target_model="llama-3-70b-instruct", gpu_count=4, method="draft_model",
                       draft_model="llama-3.2-1b-instruct", acceptance=None, concurrency=4)
    d = _predict(gpus, models, sc).to_dict()
    assert d["memory"]["fits"] and "--tensor-parallel-size 4" in d["vllm"]["serve_flags"]
    assert d["speedup"]["expected"] > 1.2


def test_monte_carlo_step_draws_are_cached_by_parameter_values():
    """Equal parameter sets (other objects, the covariance in new lists) share one cached, read-only set of draws,
    equal to the seeded draws made afresh; another covariance gets its own."""
    predict = importlib.import_module("advisor.costmodel.predict")
    target = cm.StepTimeParams(0.7, 0.4, 5e-4, covariance=[[1e-4, 0, 0], [0, 1e-4, 0], [0, 0, 1e-8]],
                               timing_rms_rel=0.05, verify_overhead_log_std=0.2, per_sequence_overhead_log_std=0.1)
    draft = cm.StepTimeParams(0.6, 0.3, 2e-4, proposer_overhead_log_std=0.3, proposer_overhead_log_std_low=0.1,
                              eager_probability=0.5)
    cached = predict._mc_step_samples(target, draft, 96)
    again = dataclasses.replace(target, covariance=[list(row) for row in target.covariance])
    assert predict._mc_step_samples(again, dataclasses.replace(draft), 96) is cached
    _, z_step, z_over, z_time = predict._mc_normals(96)
    fresh = StepSamples.from_normals(target, z_step).with_overheads(target, draft, z_over) \
        .with_timing_spread(target, z_time)
    for name, value in vars(fresh).items():
        assert np.array_equal(getattr(cached, name), value), name
        assert isinstance(value, float) or not getattr(cached, name).flags.writeable, name
    other = dataclasses.replace(target, covariance=[[4e-4, 0, 0], [0, 1e-4, 0], [0, 0, 1e-8]])
    assert not np.array_equal(predict._mc_step_samples(other, draft, 96).eta_bw, cached.eta_bw)


def test_a_vllm_versions_profile_is_carried_to_a_gpu_without_one(gpus, models, make_scenario, shipped_profiles):
    """A scenario naming vLLM 0.24 on a GPU with no profile of its own takes 0.24's profile from the NVIDIA GPU
    nearest in HBM bandwidth, carried to its specs with a timing spread of at least 20 % (docs/gpu-closed-loop.md
    "Run 19"). The version's engine behaviour is the version's: on the A100 a 0.24 draft model no longer reads as a
    1.8x gain. Another vendor, the CPU build, another version, or no version: no profile."""
    from advisor.costmodel.predict import PROFILE_TRANSFER_TIMING_REL

    h200, h100 = shipped_profiles["H200-SXM"], shipped_profiles["H100-SXM"]
    for profiles, gpu, source in (([h200], "H100-SXM", h200), ([h200], "A100-80GB-SXM", h200), ([h200], "B200", h200),
                                  ([h200, h100], "A100-80GB-SXM", h100), ([h200, h100], "L40S", h100),
                                  ([h200, h100], "B200", h200), ([h100], "H200-SXM", h100)):
        got = cm.matching_profile(profiles, gpus[gpu], "0.24.0", {p.gpu: gpus[p.gpu] for p in profiles})
        assert (got.gpu, got.applied_to, got.name) == (source.gpu, gpu, f"{source.name} → {gpu}")
        assert got.behaviour[0].startswith(f"measured on {source.gpu}, applied to {gpu}")
        assert got.behaviour[1:] == source.behaviour
        steps = [got.step_time, *(step for _, step in got.drafters)]
        assert min(step.timing_rms_rel for step in steps) >= PROFILE_TRANSFER_TIMING_REL
        assert got.step_time.bandwidth_efficiency == source.step_time.bandwidth_efficiency
    both = {"H200-SXM": gpus["H200-SXM"], "H100-SXM": gpus["H100-SXM"]}
    assert cm.matching_profile([h200, h100], gpus["H200-SXM"], "0.24", both) is h200  # it timed every drafter
    measured = {"H200-SXM": gpus["H200-SXM"]}
    for gpu, version, given in (("MI300X", "0.24", measured), ("CPU-2core", "0.24", measured),
                                ("A100-80GB-SXM", "0.12", measured), ("A100-80GB-SXM", None, measured),
                                ("A100-80GB-SXM", "0.24", None)):
        assert cm.matching_profile([h200], gpus[gpu], version, given) is None
    assert cm.matching_profile([h200], gpus["H200-SXM"], "0.24", measured) is h200
    custom = dataclasses.replace(gpus["A100-80GB-SXM"], name="my-a100", vendor="nvidia")  # a row a user added
    assert cm.matching_profile([h200], custom, "0.24", measured).applied_to == "my-a100"
    s = make_scenario(gpu="A100-80GB-SXM", target_model="llama-3.1-8b-instruct", method="draft_model",
                      draft_model="llama-3.2-1b-instruct", num_speculative_tokens=3, concurrency=1, vllm_version="0.24",
                      acceptance=cm.AcceptanceInput(per_position=(0.8, 0.64, 0.512)))
    args = (s, gpus["A100-80GB-SXM"], models["llama-3.1-8b-instruct"], models["llama-3.2-1b-instruct"])
    carried = cm.predict(*args, profile=cm.matching_profile([h200], args[1], "0.24", measured)).to_dict()
    plain = cm.predict(*args).to_dict()
    assert plain["speedup"]["expected"] > 1.5 and carried["speedup"]["expected"] < 1.0
    assert carried["decision"] != "go" and carried["engine_profile"]["applied_to"] == "A100-80GB-SXM"
    assert carried["provenance"]["tpot_ms.speculative"] == "profile:H200-SXM × vLLM 0.24 → A100-80GB-SXM"


def test_drafters_a_gpus_own_profile_did_not_time_are_carried_from_another(gpus, models, make_scenario,
                                                                          shipped_profiles):
    """The H100's profile timed the 1B draft model and the EAGLE-3 head; the H200's also timed the EAGLE head (which
    vLLM 0.24 runs on another runner, with CUDA graphs and async scheduling: the version's, not the GPU's). On the
    H100 an EAGLE scenario takes its engine's fit from the H200's profile carried there (its spread widened), and
    says so: the speculative numbers' provenance and a reason name the carried profile, the baseline stays the
    H100's; an EAGLE-3 scenario keeps the H100's own fit of its head."""
    from advisor.costmodel.predict import PROFILE_TRANSFER_TIMING_REL

    h200, h100 = shipped_profiles["H200-SXM"], shipped_profiles["H100-SXM"]
    measured = {"H200-SXM": gpus["H200-SXM"], "H100-SXM": gpus["H100-SXM"]}
    got = cm.matching_profile([h200, h100], gpus["H100-SXM"], "0.24", measured)
    assert (got.name, got.step_time, got.drafter_step("llama-3.2-1b-instruct")) == (
        h100.name, h100.step_time, h100.drafter_step("llama-3.2-1b-instruct"))
    head, own = "eagle-llama-3.1-8b", "eagle3-llama-3.1-8b"
    assert h100.drafter_step(head) is None and h200.drafter_step(head) is not None
    assert got.drafter_step(own) == h100.drafter_step(own) != h200.drafter_step(own)  # the H100's own fit stays
    assert dict(got.drafter_origins) == {head: "H200-SXM × vLLM 0.24 → H100-SXM"}
    assert got.drafter_step(head).bandwidth_efficiency == h200.drafter_step(head).bandwidth_efficiency
    assert got.drafter_step(head).timing_rms_rel >= PROFILE_TRANSFER_TIMING_REL
    s = make_scenario(gpu="H100-SXM", target_model="llama-3.1-8b-instruct", method="eagle",
                      draft_model=head, concurrency=4, vllm_version="0.24",
                      acceptance=cm.AcceptanceInput(per_position=(0.8, 0.64, 0.512)))
    args = (s, gpus["H100-SXM"], models["llama-3.1-8b-instruct"], models[head])
    answer = cm.predict(*args, profile=got).to_dict()
    prov = answer["provenance"]
    assert prov["step_ms.decode"] == prov["tpot_ms.baseline"] == "profile:H100-SXM × vLLM 0.24"
    assert prov["tpot_ms.speculative"] == prov["speedup.expected"] == "profile:H200-SXM × vLLM 0.24 → H100-SXM"
    assert any(f"timed no cycles of {head}: its engine is timed by H200-SXM × vLLM 0.24 → H100-SXM" in r
               for r in answer["reasons"])
    assert answer["engine_profile"]["drafters_carried"] == dict(got.drafter_origins)
    uncarried = cm.predict(*args, profile=h100).to_dict()  # the H100's own alone: the head's uncalibrated prior
    assert any("the drafter's cost is the uncalibrated prior" in r for r in uncarried["reasons"])
    assert uncarried["speedup"] != answer["speedup"]


def test_a_drafter_no_profile_timed_is_priced_by_a_timed_one_of_its_method(gpus, models, make_scenario,
                                                                           shipped_profiles):
    """vLLM runs every drafter of a method on one engine path (0.24: a separate draft model on the V1 runner without
    CUDA graphs, EAGLE heads on Model Runner V2). A drafter no profile timed is priced by the fit of the first timed
    drafter of its method, at its own size, its spread at least 20 %, and the answer says which: EAGLE-1 for Vicuna
    on the H100 by the EAGLE head for Llama 3.1 8B that the H200 timed (carried). A method no profile timed a drafter
    of keeps the prior (an MTP head)."""
    from advisor.costmodel.types import STAND_IN_TIMING_REL

    measured = {"H200-SXM": gpus["H200-SXM"], "H100-SXM": gpus["H100-SXM"]}
    got = cm.matching_profile(list(shipped_profiles.values()), gpus["H100-SXM"], "0.24", measured)
    vicuna = got.with_stand_in("eagle-vicuna-7b-v1.3", "eagle")
    timed = got.drafter_step("eagle-llama-3.1-8b")
    assert vicuna.drafter_step("eagle-vicuna-7b-v1.3") == dataclasses.replace(
        timed, timing_rms_rel=max(timed.timing_rms_rel, STAND_IN_TIMING_REL))
    assert dict(vicuna.drafter_stand_ins) == {"eagle-vicuna-7b-v1.3": "eagle-llama-3.1-8b"}
    assert dict(vicuna.drafter_origins)["eagle-vicuna-7b-v1.3"] == "H200-SXM × vLLM 0.24 → H100-SXM"
    assert got.with_stand_in("eagle-llama-3.1-8b", "eagle") is got and got.with_stand_in("x", "mtp") is got
    s = make_scenario(gpu="H100-SXM", target_model="vicuna-7b-v1.3", method="eagle", draft_model="eagle-vicuna-7b-v1.3",
                      concurrency=1, vllm_version="0.24",
                      acceptance=cm.AcceptanceInput(per_position=(0.8, 0.64, 0.512)))
    answer = cm.predict(s, gpus["H100-SXM"], models["vicuna-7b-v1.3"], models["eagle-vicuna-7b-v1.3"],
                        profile=got).to_dict()
    assert answer["engine_profile"]["drafters_stand_in"] == {"eagle-vicuna-7b-v1.3": "eagle-llama-3.1-8b"}
    assert answer["provenance"]["tpot_ms.speculative"] == "profile:H200-SXM × vLLM 0.24 → H100-SXM"
    assert any("no profile timed cycles of eagle-vicuna-7b-v1.3: its engine is priced by the fit of "
               "eagle-llama-3.1-8b" in r for r in answer["reasons"])
    prior = cm.predict(s, gpus["H100-SXM"], models["vicuna-7b-v1.3"], models["eagle-vicuna-7b-v1.3"],
                       profile=dataclasses.replace(got, drafter_methods=())).to_dict()
    assert any("the drafter's cost is the uncalibrated prior" in r for r in prior["reasons"])
    assert answer["speedup"]["expected"] > prior["speedup"]["expected"]  # the head's measured engine beats the prior


def test_a_stand_in_draft_model_pays_the_timed_ones_host_cost_per_layer(gpus, models, make_scenario,
                                                                        shipped_profiles):
    """vLLM 0.24 launches a separate draft model's layers from the host (no CUDA graph): a draft model no profile or
    calibration timed is priced by the timed one's host cost per forward scaled to its own depth (H100 run 24: a
    24-layer 0.5B drafter's cycle took 1.5-1.6x a 16-layer 1B's in the same host state). Heads keep theirs, and a fit
    that did not record its drafter's depth keeps its cost per forward."""
    from advisor.costmodel.types import STAND_IN_TIMING_REL, stand_in_step

    profile = shipped_profiles["H100-SXM"]
    timed = profile.drafter_step("llama-3.2-1b-instruct")
    assert timed.proposer_layers == 16 == models["llama-3.2-1b-instruct"].num_layers
    for name, layers in (("qwama-0.5b-instruct", 24), ("llama-3.2-3b-instruct", 28)):
        step = profile.with_stand_in(name, "draft_model", layers).drafter_step(name)
        assert step.proposer_overhead_s == pytest.approx(timed.proposer_overhead_s * layers / 16, rel=1e-12)
        assert step.proposer_layers == layers and step.timing_rms_rel >= STAND_IN_TIMING_REL
    assert stand_in_step(timed, "eagle", 28).proposer_overhead_s == timed.proposer_overhead_s
    unrecorded = dataclasses.replace(timed, proposer_layers=0)
    assert stand_in_step(unrecorded, "draft_model", 28).proposer_overhead_s == timed.proposer_overhead_s
    qwama = models["qwama-0.5b-instruct"]
    s = make_scenario(gpu="H100-SXM", target_model="llama-3.1-8b-instruct", method="draft_model",
                      draft_model=qwama.name, concurrency=1, vllm_version="0.24",
                      acceptance=cm.AcceptanceInput(per_position=(0.7, 0.49, 0.343)))
    answer = cm.predict(s, gpus["H100-SXM"], models["llama-3.1-8b-instruct"], qwama, profile=profile).to_dict()
    one_b = cm.predict(dataclasses.replace(s, speculator=cm.Speculator("draft_model", "llama-3.2-1b-instruct", 3)),
                       gpus["H100-SXM"], models["llama-3.1-8b-instruct"], models["llama-3.2-1b-instruct"],
                       profile=profile).to_dict()
    assert answer["speedup"]["expected"] < one_b["speedup"]["expected"]  # smaller, but deeper: slower on 0.24
    assert any("scaled to its 24 layers from 16" in r for r in answer["reasons"])
