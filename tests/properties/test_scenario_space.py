"""Property-based suite over the scenario space (hypothesis, seeded): invariants every answer must keep (issue 9).

Random valid scenarios are drawn from the shipped catalogs (every GPU, target, method and drafter, workload
shapes, stated or prior acceptance, TP, dtype, arrival rates); each is predicted and checked against physics
and vLLM's rules. Derandomized (a fixed seed) and bounded: a few hundred scenarios in a few seconds. A failing
example found here is kept below as an ``@example`` regression.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from advisor import costmodel as cm

DATA = Path(__file__).resolve().parents[2] / "advisor" / "data"
GPUS = {r["name"]: cm.GpuSpec.from_dict(r) for r in json.loads((DATA / "gpus.json").read_text())["items"]
        if r["gpu_class"] != "cpu"}
MODELS = {r["name"]: cm.ModelSpec.from_dict(r) for r in json.loads((DATA / "models.json").read_text())["items"]}
TARGETS = sorted(n for n, m in MODELS.items() if m.kind == "causal_lm" and m.param_count > 1e9)
HEAD_KIND = {"eagle": "eagle_head", "eagle3": "eagle3_head", "mtp": "mtp_head"}
RUNS = settings(max_examples=300, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def drafters(target: str, method: str) -> list[str | None]:
    t = MODELS[target]
    if method in ("ngram", "suffix"):
        return [None]
    if method == "draft_model":
        return [n for n, m in MODELS.items() if m.kind == "causal_lm" and m.tokenizer_family == t.tokenizer_family
                and m.param_count < t.param_count]
    return [n for n, m in MODELS.items() if m.kind == HEAD_KIND[method] and m.hidden_size == t.hidden_size]


@st.composite
def scenarios(draw) -> cm.Scenario:
    target = draw(st.sampled_from(TARGETS))
    methods = [m for m in ("ngram", "suffix", "draft_model", "eagle", "eagle3") if drafters(target, m)]
    method = draw(st.sampled_from(methods))
    draft = draw(st.sampled_from(drafters(target, method)))
    k = draw(st.one_of(st.none(), st.integers(1, 8)))
    acceptance = draw(st.one_of(
        st.none(),
        st.floats(0.0, 1.0).map(lambda x: cm.AcceptanceInput(mean_acceptance_length=1 + x * (k or 3))),
        st.floats(0.0, 1.0).map(lambda x: cm.AcceptanceInput(acceptance_rate=x)),
        st.lists(st.floats(0.0, 1.0), min_size=1, max_size=8).map(
            lambda xs: cm.AcceptanceInput(per_position=tuple(sorted(xs, reverse=True)))),
    ))
    closed = draw(st.booleans())
    workload = cm.Workload(
        prompt_tokens=draw(st.integers(1, 8192)), output_tokens=draw(st.integers(1, 2048)),
        temperature=draw(st.sampled_from([0.0, 0.3, 0.7, 1.0, 1.5])),
        structure=draw(st.sampled_from(cm.STRUCTURES)),
        concurrency=draw(st.integers(1, 2048)) if closed else None,
        requests_per_second=None if closed else draw(st.floats(0.01, 200.0)))
    return cm.Scenario(gpu=draw(st.sampled_from(sorted(GPUS))), target_model=target,
                       speculator=cm.Speculator(method, draft, k), workload=workload,
                       gpu_count=draw(st.sampled_from([1, 1, 2, 4, 8])),
                       weights_dtype=draw(st.sampled_from(["bf16", "bf16", "fp8", "int4"])),
                       kv_cache_dtype=draw(st.sampled_from(cm.KV_CACHE_DTYPES)),
                       acceptance=acceptance)


def predict(sc: cm.Scenario, **kw) -> dict:
    draft = MODELS.get(sc.speculator.draft_model) if sc.speculator.draft_model else None
    return cm.predict(sc, GPUS[sc.gpu], MODELS[sc.target_model], draft, **kw).to_dict()


def finite_numbers(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(finite_numbers(v) for v in value.values())
    if isinstance(value, list):
        return all(finite_numbers(v) for v in value)
    return True


VLLM_NEEDS = {"draft_model": {"model"}, "eagle": {"model"}, "eagle3": {"model"},
              "ngram": {"prompt_lookup_min", "prompt_lookup_max"}, "suffix": set()}

# Kept regressions. Found by this suite while it was written: one output token with the drafter's memory making
# requests queue (speedup 0.9999999, not 1) and one output token at a saturating arrival rate (1.017: the
# speculative server held one sequence fewer). From the issue: a 70B target on one 24 GB GPU (infeasible: no
# speedup shown), equal per-position neighbours (NaN fit).
KEPT = [
    cm.Scenario(gpu="A100-80GB-SXM", target_model="llama-3.1-8b-instruct",
                speculator=cm.Speculator("draft_model", "llama-3.2-1b-instruct"),
                workload=cm.Workload(1264, 1, 0.0, "code", concurrency=256)),
    cm.Scenario(gpu="RTX-3090", target_model="llama-3.1-8b-instruct", speculator=cm.Speculator("ngram"),
                workload=cm.Workload(511, 1, 0.0, "code", requests_per_second=6.0)),
    cm.Scenario(gpu="RTX-3090", target_model="llama-3-70b-instruct", speculator=cm.Speculator("ngram"),
                workload=cm.Workload(512, 256, 0.0, "prose", concurrency=8)),
    cm.Scenario(gpu="H100-SXM", target_model="llama-3.1-8b-instruct",
                speculator=cm.Speculator("eagle", "eagle-llama-3.1-8b", 3),
                workload=cm.Workload(64, 64, 0.0, "prose", concurrency=4),
                acceptance=cm.AcceptanceInput(per_position=(0.5, 0.5, 0.5))),
]


@RUNS
@given(scenarios())
@example(KEPT[0])
@example(KEPT[1])
@example(KEPT[2])
@example(KEPT[3])
def test_every_answer_keeps_the_invariants(sc):
    d = predict(sc)
    assert finite_numbers(d)
    decision, sp = d["decision"], d["speedup"]
    assert decision in ("go", "no-go", "calibrate")
    if not d["memory"]["deployable"]:  # a config that does not fit never gets go, and shows no speedup
        assert decision == "no-go" and sp["expected"] is None and d["tco"] is None
        return
    k, conc = d["num_speculative_tokens"], d["concurrency"]
    assert sp["low"] <= sp["expected"] <= sp["high"]
    # the ideal bound: end to end at most the decode gain τ·t_decode / t_cycle (or 1), and never above k + 1
    acc = d["acceptance"]
    if conc["baseline"] == conc["speculative"] and not conc["queued"]:  # same batch in both modes
        ideal = acc["tokens_per_cycle"] * d["step_ms"]["decode"] / d["step_ms"]["cycle"]
        assert sp["decode"] == pytest.approx(ideal, rel=1e-9)
        assert sp["expected"] <= max(1.0, ideal) * (1 + 1e-9)
    if sc.workload.concurrency is not None:  # (open loop: a faster server also holds fewer requests in flight)
        assert sp["expected"] <= k + 1
    assert 1.0 <= acc["tokens_per_cycle"] <= acc["mean_acceptance_length"] + 1e-9 <= k + 1 + 1e-9
    if sc.workload.output_tokens == 1:  # nothing to decode: both engines do the same work
        assert sp["expected"] == pytest.approx(1.0, abs=1e-12) and decision == "no-go"
    # the best k per band is capped at k; the command runs k itself (no table: another engine path in vLLM 0.24)
    table = d["dynamic_sd"]
    assert all(row[2] <= k and row[0] <= row[1] for row in table) and table[0][0] == 1
    assert all(a[1] + 1 == b[0] for a, b in zip(table, table[1:]))  # contiguous bands
    cfg = d["vllm"]["speculative_config"]
    assert cfg["method"] == sc.speculator.method and cfg["num_speculative_tokens"] == k
    assert "num_speculative_tokens_per_batch_size" not in cfg
    if decision == "go":
        assert VLLM_NEEDS[sc.speculator.method] <= set(cfg)
        assert not any(c["severity"] == "error" for c in d["checks"])
        assert sp["low"] >= cm.GO_THRESHOLD
    if d["concurrency"]["queued"]:
        assert any("queue" in r for r in d["reasons"])
    # the command starts: vLLM's KV cache must hold one request of --max-model-len (the window by default)
    mem, window = d["memory"], MODELS[sc.target_model].max_position_embeddings
    assert window is None or mem["context_tokens"] <= window
    per_token = mem["kv_bytes_per_token_target"] + mem["kv_bytes_per_token_draft"]
    planned = (mem["kv_space_gb"] - cm.memory.MAX_MODEL_LEN_RESERVE_GB) * 1e9  # (what vLLM held beyond the model)
    length = re.search(r"--max-model-len (\d+)", d["vllm"]["serve_flags"])
    if window is not None and (window + k + 16) * per_token > planned:
        assert length and mem["context_tokens"] <= int(length.group(1)) < window
        assert int(length.group(1)) == mem["context_tokens"] or (int(length.group(1)) + k + 16) * per_token <= planned
    else:
        assert length is None
    if sc.workload.concurrency is not None and sc.speculator.num_speculative_tokens:  # the sweep fast path agrees
        draft = MODELS.get(sc.speculator.draft_model) if sc.speculator.draft_model else None
        point = cm.speedup_point(sc, GPUS[sc.gpu], MODELS[sc.target_model], draft)
        assert point == pytest.approx(sp["expected"], rel=1e-9)


@settings(RUNS, max_examples=150)
@given(scenarios())
def test_an_arrival_rate_beyond_capacity_answers_as_a_closed_loop_beyond_both_caps(sc):
    """A saturated open loop has no steady latency (its queue grows without end): its speedup is the ratio of the
    rates one server sustains, which is what a closed loop with more clients than either server holds answers."""
    assume(sc.workload.requests_per_second is not None)
    sc = dataclasses.replace(sc, workload=dataclasses.replace(sc.workload, requests_per_second=1e9))
    d = predict(sc, compare_methods=False)
    assume(d["memory"]["deployable"])
    assert d["concurrency"]["saturated"]
    closed = predict(dataclasses.replace(sc, workload=dataclasses.replace(
        sc.workload, concurrency=65_536, requests_per_second=None)), compare_methods=False)
    assert closed["num_speculative_tokens"] == d["num_speculative_tokens"]
    assert closed["decision"] == d["decision"]
    for key in ("expected", "low", "high"):
        assert closed["speedup"][key] == pytest.approx(d["speedup"][key], rel=1e-9)


@settings(RUNS, max_examples=100)
@given(scenarios())
def test_the_method_comparison_never_changes_the_answer(sc):
    with_cmp, without = predict(sc), predict(sc, compare_methods=False)
    with_cmp.pop("methods"), without.pop("methods")
    with_cmp["provenance"] = {p: v for p, v in with_cmp["provenance"].items() if not p.startswith("methods")}
    without["provenance"] = {p: v for p, v in without["provenance"].items() if not p.startswith("methods")}
    assert with_cmp == without


PROFILES = [cm.MeasuredEngineProfile.from_dict(r)
            for r in json.loads((DATA / "engine_profiles.json").read_text())["items"]]
PROFILED_GPUS = {p.gpu: GPUS[p.gpu] for p in PROFILES}


def _node_calibration(target: str) -> cm.Calibration:
    """A user's calibration of ``target`` that timed its steps and a 1B draft model's engine (none of EAGLE's)."""
    plain = cm.StepTimeParams(0.75, 0.45, 8e-4, timing_rms_rel=0.05)
    engine = dataclasses.replace(plain, proposer_overhead_s=5e-3)
    return cm.Calibration(9, "any", {target: plain, "llama-3.2-1b-instruct": engine}, {}, {}, 64, (0.0, 1.0),
                          drafter_methods={"llama-3.2-1b-instruct": "draft_model"})


@settings(RUNS, max_examples=80)
@given(scenarios(), st.booleans(), st.booleans())
def test_each_compared_method_is_priced_as_its_own_answer(sc, versioned, calibrated):
    """Every row of ``methods`` for a catalog drafter (or none) is the point estimate that naming it answers, at
    the row's k, with the catalog's heads, for a scenario naming vLLM 0.24 the profile's fits, and with a user's
    calibration that timed a draft model (its stand-in, and the profile for EAGLE heads): where no request queues
    (the compared rows share the scenario's resident caps)."""
    assume(sc.workload.concurrency is not None)
    sc = dataclasses.replace(sc, acceptance=None, vllm_version="0.24" if versioned else None)
    heads = cm.compared_heads(MODELS[sc.target_model], MODELS.values())
    profile = cm.matching_profile(PROFILES, GPUS[sc.gpu], sc.vllm_version, PROFILED_GPUS)
    cal = _node_calibration(sc.target_model) if calibrated else None
    answer = predict(sc, heads=heads, profile=profile, calibration=cal)
    assume(answer.get("methods") and not answer["concurrency"]["queued"])
    checked = 0
    for row in answer["methods"]:
        if row["method"] == sc.speculator.method or (row["drafter"] and row["drafter"] not in MODELS):
            continue  # the scenario's own row; a synthesized head (no catalog row to name)
        own = predict(dataclasses.replace(sc, speculator=cm.Speculator(row["method"], row["drafter"],
                                                                       row["num_speculative_tokens"])),
                      heads=heads, profile=profile, calibration=cal)
        if own.get("speedup") is None or own["concurrency"]["queued"]:
            continue
        assert own["speedup"]["expected"] == pytest.approx(row["expected_speedup"], rel=1e-9), (row["method"], sc)
        checked += 1
    assert checked >= 1  # n-gram or suffix at least


@settings(RUNS, max_examples=150)
@given(scenarios(), st.floats(0.05, 0.95), st.floats(0.05, 0.95))
def test_speedup_does_not_decrease_with_acceptance(sc, a, b):
    k = sc.speculator.num_speculative_tokens or 3
    sc = dataclasses.replace(sc, speculator=dataclasses.replace(sc.speculator, num_speculative_tokens=k))
    lo, hi = sorted((a, b))
    d_lo = predict(dataclasses.replace(sc, acceptance=cm.AcceptanceInput(acceptance_rate=lo)), compare_methods=False)
    d_hi = predict(dataclasses.replace(sc, acceptance=cm.AcceptanceInput(acceptance_rate=hi)), compare_methods=False)
    assume(d_lo["memory"]["deployable"])
    # an arrival rate the faster drafts carry and the slower ones do not changes what the speedup measures (the
    # latency ratio below capacity, the ratio of the rates sustained above): compared within one regime
    assume(d_lo["concurrency"]["saturated"] == d_hi["concurrency"]["saturated"])
    assert d_hi["speedup"]["expected"] >= d_lo["speedup"]["expected"] * (1 - 1e-9)


@settings(RUNS, max_examples=100)
@given(scenarios())
def test_speedup_does_not_increase_with_draft_cost(sc):
    """Same stated acceptance, bigger drafter (more bytes and FLOPs per draft step): never faster."""
    small, big = "llama-3.2-1b-instruct", "llama-3.2-3b-instruct"
    closed = dataclasses.replace(sc.workload, concurrency=sc.workload.concurrency or 8, requests_per_second=None)
    base = dataclasses.replace(sc, target_model="llama-3.1-8b-instruct", workload=closed,
                               acceptance=cm.AcceptanceInput(mean_acceptance_length=2.5),
                               speculator=cm.Speculator("draft_model", small, 3))
    d_small = predict(base, compare_methods=False)
    d_big = predict(dataclasses.replace(base, speculator=cm.Speculator("draft_model", big, 3)),
                    compare_methods=False)
    assume(d_small["memory"]["deployable"] and d_big["memory"]["deployable"])
    assume(not d_big["concurrency"]["queued"] and not d_small["concurrency"]["queued"])
    assert d_big["speedup"]["expected"] <= d_small["speedup"]["expected"] * (1 + 1e-9)


def test_methods_vllm_cannot_run_are_refused_never_answered():
    sc = cm.Scenario(gpu="H100-SXM", target_model="qwen3-8b", speculator=cm.Speculator("eagle3"),
                     workload=cm.Workload(512, 256, 0.0, "prose", concurrency=8))
    for method in ("mtp", "eagle", "eagle3"):
        with pytest.raises(cm.CostModelError) as err:
            predict(dataclasses.replace(sc, speculator=cm.Speculator(method)))
        assert err.value.field == "speculator.method"


def as_request(sc: cm.Scenario) -> dict:
    """A scenario as the JSON body of POST /v1/recommendations (and of `advisor predict --scenarios`)."""
    body = dataclasses.asdict(sc)
    body["speculator"] = {k: v for k, v in body["speculator"].items() if v is not None and k != "num_verify_tokens"}
    body["workload"] = {k: v for k, v in body["workload"].items() if v is not None}
    acceptance = {k: (list(v) if isinstance(v, tuple) else v) for k, v in (body["acceptance"] or {}).items()
                  if v is not None}
    body["acceptance"] = acceptance or None
    for key in ("engine", "slo", "load", "gpu_hour_usd", "vram_gb"):
        body.pop(key)
    return body


@settings(RUNS, max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(scenarios())
def test_the_cli_and_the_api_give_the_same_answer(app, client, tmp_path_factory, sc):
    from advisor.cli import predict as cli_predict

    body = as_request(sc)
    path = tmp_path_factory.mktemp("scenarios") / "one.json"
    path.write_text(json.dumps([body]))
    result = app.test_cli_runner().invoke(cli_predict, ["--scenarios", str(path)])
    cli_answer = json.loads(result.output)[0]
    response = client.post("/v1/recommendations", json=body)
    api_answer = response.get_json()
    if "error" in cli_answer:  # refused by both, naming the same fields
        assert response.status_code == cli_answer["error"]["status"] == 422
        assert set(api_answer["error"]["fields"]) == set(cli_answer["error"]["fields"])
        return
    assert response.status_code == 201
    for key in ("id", "created_at", "workload_id", "scenario"):
        api_answer.pop(key)
    assert api_answer == json.loads(json.dumps(cli_answer))


@settings(RUNS, max_examples=15, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(scenarios())
def test_without_a_speculator_no_candidate_outranks_the_choice(client, sc):
    """Over the scenario space, a body without speculator and acceptance answers with the candidate no other beats
    (decision, then lower bound, then expectation), or is refused naming fields; the chosen candidate named gives
    the same answer but for the choice's own entries."""
    body = {k: v for k, v in as_request(sc).items() if k not in ("speculator", "acceptance")}
    response = client.post("/v1/recommendations", json=body)
    answer = response.get_json()
    if response.status_code == 422:
        assert answer["error"]["fields"]
        return
    assert response.status_code == 201, answer
    rank = {"go": 2, "calibrate": 1, "no-go": 0}

    def key(row):
        return rank[row["decision"]], row["low"] or 0.0, row["expected"] or 0.0

    rows = answer["speculator_choice"]["candidates"]
    chosen = next(r for r in rows if {k: v for k, v in r.items() if k in ("method", "draft_model")}
                  == answer["speculator_choice"]["chosen"])
    assert all(key(r) <= key(chosen) for r in rows)
    named = client.post("/v1/recommendations", json={**body, "speculator": answer["scenario"]["speculator"]})
    assert named.status_code == 201
    strip = ("id", "created_at", "workload_id", "scenario", "speculator_choice", "provenance")
    assert {k: v for k, v in named.get_json().items() if k not in strip} == \
        {k: v for k, v in answer.items() if k not in strip}
