"""The capacity planner (advisor/costmodel/plan.py): replicas, costs, ranking, infeasibility and its reasons."""
from __future__ import annotations

import math

import pytest

from advisor.costmodel import default_prefill_params, default_step_time_params, prior_acceptance
from advisor.costmodel.plan import GpuOffer, PlanInput, PlanSlo, SpeculatorCandidate, plan_capacity, tp_candidates


def offer(gpu, price=None):
    return GpuOffer(gpu, price or gpu.gpu_hour_usd, "input" if price else "catalog", default_step_time_params(gpu),
                    default_prefill_params(gpu), "default")


@pytest.fixture(scope="module")
def plan_in(gpus, models):
    target = models["llama-3.1-8b-instruct"]
    head = models["eagle3-llama-3.1-8b"]
    cands = (SpeculatorCandidate("ngram", None, prior_acceptance("ngram", "code", target), "prior"),
             SpeculatorCandidate("eagle3", head, prior_acceptance("eagle3", "code", target, head), "prior"))
    return PlanInput(target, 512, 256, 0.0, 20.0, PlanSlo(90.0, ttft_ms=1000.0, tpot_ms=50.0),
                     (offer(gpus["H100-SXM"], 3.0), offer(gpus["L40S"]), offer(gpus["RTX-3060"])), cands,
                     growth=(1.0, 3.0))


@pytest.fixture(scope="module")
def answer(plan_in):
    return plan_capacity(plan_in)


def test_replicas_and_costs_follow_from_the_per_replica_rate(plan_in, answer):
    for o in answer["options"]:
        if not o["feasible"]:
            continue
        lam = o["max_requests_per_second_per_replica"]
        for load, at in zip(plan_in.loads, o["loads"]):
            assert at["replicas"] == math.ceil(load / lam - 1e-9)
            assert at["gpus"] == at["replicas"] * o["tensor_parallel_size"]
            assert at["monthly_usd"] == pytest.approx(at["gpus"] * o["gpu_hour_usd"] * 730.0)
            tokens_per_month = load * 256 * 3600 * 730
            assert at["usd_per_million_output_tokens"] == pytest.approx(at["monthly_usd"] / tokens_per_month * 1e6)
            assert at["requests_per_second_per_replica"] <= lam * (1 + 1e-9)
            assert at["meets_slo"] and at["slo_headroom"] >= 0
            assert at["ttft_p90_ms"] <= 1000.0 and at["tpot_p90_ms"] <= 50.0
            assert at["concurrency_per_replica"] >= at["requests_per_second_per_replica"] * 0.001
    h100 = next(o for o in answer["options"] if o["key"] == "H100-SXM/tp1/baseline")
    assert h100["gpu_hour_usd"] == 3.0 and h100["sources"]["gpu_hour_usd"] == "input"


def test_ranked_by_monthly_cost_with_what_speculation_saves(answer):
    feasible = [o for o in answer["options"] if o["feasible"]]
    costs = [[x["monthly_usd"] for x in o["loads"]] for o in feasible]
    assert costs == sorted(costs)
    assert [o["rank"] for o in answer["options"]] == list(range(1, len(answer["options"]) + 1))
    by_key = {o["key"]: o for o in answer["options"]}
    for o in feasible:
        if o["mode"] == "speculative":
            base = by_key[o["key"].replace("speculative", "baseline")]
            assert o["speculation_saves_monthly_usd"] == [b["monthly_usd"] - s["monthly_usd"]
                                                          for b, s in zip(base["loads"], o["loads"])]
            assert o["speculator"]["method"] in ("ngram", "eagle3") and 1 <= o["speculator"]["num_speculative_tokens"] <= 6
    for best, load in zip(answer["best"], (20.0, 60.0)):
        assert best["requests_per_second"] == load
        i = (20.0, 60.0).index(load)
        assert best["monthly_usd"] == min(o["loads"][i]["monthly_usd"] for o in feasible)


def test_a_higher_percentile_or_a_tighter_slo_allows_less_load_per_replica(plan_in):
    loose = plan_capacity(plan_in)
    tight = plan_capacity(type(plan_in)(**{**plan_in.__dict__, "slo": PlanSlo(99.0, ttft_ms=300.0, tpot_ms=25.0)}))
    rate = {o["key"]: o["max_requests_per_second_per_replica"] or 0.0 for o in loose["options"]}
    for o in tight["options"]:
        assert (o["max_requests_per_second_per_replica"] or 0.0) <= rate[o["key"]] * 1.06  # within the tolerance


def test_an_unreachable_slo_marks_every_option_infeasible_with_the_reason(plan_in):
    out = plan_capacity(type(plan_in)(**{**plan_in.__dict__, "slo": PlanSlo(50.0, ttft_ms=1.0)}))
    assert not out["feasible"]
    assert all(not o["feasible"] for o in out["options"])
    assert all("SLO unreachable at any load" in o["infeasible_reason"] and "TTFT" in o["infeasible_reason"]
               for o in out["options"])
    assert all(b["option"] is None for b in out["best"])


def test_a_model_that_does_not_fit_says_so(gpus, models, plan_in):
    big = models["llama-3.3-70b-instruct"]
    p = type(plan_in)(**{**plan_in.__dict__, "target": big, "offers": (offer(gpus["RTX-3060"]),),
                         "speculators": (plan_in.speculators[0],), "tp_sizes": (1, 2)})
    out = plan_capacity(p)
    assert [o["feasible"] for o in out["options"]] == [False] * 4
    assert all(o["infeasible_reason"].startswith("does not fit") for o in out["options"])
    # the default TP sizes: the smallest that fits and two doublings
    assert tp_candidates(type(plan_in)(**{**p.__dict__, "tp_sizes": None}), offer(gpus["H100-SXM"])) == [2, 4, 8]
    assert tp_candidates(plan_in, offer(gpus["H100-SXM"])) == [1, 2, 4]


def test_absurd_loads_are_refused(plan_in):
    huge = type(plan_in)(**{**plan_in.__dict__, "requests_per_second": 1e9, "offers": plan_in.offers[2:]})
    with pytest.raises(ValueError, match="replicas"):
        plan_capacity(huge)


def steps(offer: GpuOffer, target, drafter, method: str) -> tuple:
    """(target, drafter) step-time parameters of ``offer`` speculating with ``drafter``."""
    got = offer.speculative_steps(target, drafter, method)
    return got.target_step, got.draft_step


def test_an_offers_untimed_drafter_gets_the_fit_predict_gives_it(gpus, models):
    """A plan and a recommendation price a drafter the engine profile did not time alike: by the profile's fit of
    the timed drafter of its method (its stand-in: 3B by the 1B draft model's engine, its host cost per forward at
    the 3B's 28 layers, at least 20 % spread), and
    where no drafter of its method was timed, the profile's fit for the target and the method's prior for the
    drafter (one helper, ``default_drafter_step``); a timed drafter's own fit prices both."""
    import dataclasses

    from advisor.costmodel.predict import _context
    from advisor.costmodel.steptime import default_drafter_step
    from advisor.costmodel.types import STAND_IN_TIMING_REL, Scenario, Speculator, Workload
    from advisor.services.catalog import engine_profiles

    gpu, target = gpus["H200-SXM"], models["llama-3.1-8b-instruct"]
    profile = next(p for p in engine_profiles() if p.gpu == gpu.name)
    untimed, timed = models["llama-3.2-3b-instruct"], models["eagle3-llama-3.1-8b"]
    base = GpuOffer(gpu, 3.0, "input", profile.step_time, profile.prefill, f"profile:{profile.name}", profile)
    one_b = profile.drafter_step("llama-3.2-1b-instruct")
    stand_in = dataclasses.replace(one_b, timing_rms_rel=max(one_b.timing_rms_rel, STAND_IN_TIMING_REL),
                                   proposer_overhead_s=one_b.proposer_overhead_s * 28 / 16, proposer_layers=28)
    assert steps(base, target, untimed, "draft_model") == (stand_in, stand_in)
    methodless = dataclasses.replace(profile, drafter_methods=())  # a profile that says no drafter's method
    assert steps(dataclasses.replace(base, profile=methodless), target, untimed, "draft_model") == (
        profile.step_time, default_drafter_step(gpu, "vllm", "draft_model"))
    assert steps(base, target, timed, "eagle3") == (profile.drafter_step(timed.name),) * 2
    scenario = Scenario(gpu="H200-SXM", target_model=target.name, vllm_version="0.24",
                        speculator=Speculator("draft_model", untimed.name, 3), workload=Workload(512, 256, 0.0, "code"))
    ctx = _context(scenario, gpu, target, untimed, None, None, profile)
    assert (ctx.target_step, ctx.draft_step) == steps(base, target, untimed, "draft_model")
    assert any("priced by the fit of llama-3.2-1b-instruct" in n for n in ctx.calibration_notes)
    ctx = _context(scenario, gpu, target, untimed, None, None, methodless)
    assert (ctx.target_step, ctx.draft_step) == (profile.step_time, default_drafter_step(gpu, "vllm", "draft_model"))
    ctx = _context(dataclasses.replace(scenario, speculator=Speculator("eagle3", timed.name, 3)), gpu, target, timed,
                   None, None, profile)
    assert (ctx.target_step, ctx.draft_step) == steps(base, target, timed, "eagle3")


def test_a_calibrated_offer_prices_drafters_as_predict_does(gpus, models):
    """A plan timed by the user's calibration prices each drafter as a recommendation does (one rule,
    ``engine_steps``): the drafter the run timed by its engine's fit, for the target's steps too (main: the target's
    plain fit for both, a draft model's host cost per forward left out); another draft model by that fit, its spread
    at least 20 % (the stand-in); a copy drafter by the target's fit and the method's prior, as on a default offer.
    Each by the run a recommendation would take (``timing_run``): the draft models by the older run that timed the
    1B, n-gram by the newer run."""
    import dataclasses

    from advisor.costmodel.predict import _context
    from advisor.costmodel.steptime import default_drafter_step
    from advisor.costmodel.types import STAND_IN_TIMING_REL, Calibration, Scenario, Speculator, Workload

    gpu, target = gpus["H100-SXM"], models["llama-3.1-8b-instruct"]
    one_b, three_b = models["llama-3.2-1b-instruct"], models["llama-3.2-3b-instruct"]
    plain = default_step_time_params(gpu)
    engine = dataclasses.replace(plain, proposer_overhead_s=0.006, timing_rms_rel=0.05, source="calibration")
    cal = Calibration(7, gpu.name, {target.name: plain, one_b.name: engine}, {}, {}, 64, (0.0, 0.0),
                      drafter_methods={one_b.name: "draft_model"})
    newer = Calibration(8, gpu.name, {target.name: plain}, {}, {}, 64, (0.0, 0.0))  # an n-gram run, no drafter
    calibrated = GpuOffer(gpu, 3.0, "input", plain, default_prefill_params(gpu), "calibration:8", None, (newer, cal))
    stand_in = dataclasses.replace(engine, timing_rms_rel=STAND_IN_TIMING_REL)
    assert steps(calibrated, target, one_b, "draft_model") == (engine, engine)
    assert steps(calibrated, target, three_b, "draft_model") == (stand_in, stand_in)
    assert calibrated.speculative_steps(target, three_b, "draft_model").source == "calibration:7"
    assert steps(calibrated, target, None, "ngram") == steps(offer(gpu), target, None, "ngram") \
        == (plain, default_drafter_step(gpu, "vllm", "ngram"))
    assert calibrated.speculative_steps(target, None, "ngram").source == "calibration:8"
    for method, drafter in (("draft_model", one_b), ("draft_model", three_b), ("ngram", None)):
        scenario = Scenario(gpu=gpu.name, target_model=target.name, speculator=Speculator(method, drafter and
                            drafter.name, 3), workload=Workload(512, 256, 0.0, "code"))
        ctx = _context(scenario, gpu, target, drafter, cal, None)
        assert (ctx.target_step, ctx.draft_step) == steps(calibrated, target, drafter, method)


def test_lambda_star_is_read_from_steady_state_runs(gpus, models):
    """Near the queue's knee a p90 TTFT grows with the simulated run's length until the run spans the queue's long
    excursions, so λ* from short runs is optimistic. On L40S (TP 1, README workload, TTFT-bound) 200-request runs
    gave 40 % above a 3,000-request search; the plan searches on short runs and refines on 400-request runs, which
    takes λ* most of the way to the long runs' (docs/planner.md "Run length")."""
    import dataclasses

    target = models["llama-3.1-8b-instruct"]
    plan = PlanInput(target, 512, 256, 0.0, 40.0, PlanSlo(90.0, ttft_ms=1000.0, tpot_ms=50.0),
                     (offer(gpus["L40S"]),), (), tp_sizes=(1,))

    def lam(**kw) -> float:
        answer = plan_capacity(dataclasses.replace(plan, **kw))
        return next(o for o in answer["options"] if o["mode"] == "baseline")["max_requests_per_second_per_replica"]

    short, planned, steady = lam(sim_requests=200, steady_requests=200), lam(), lam(steady_requests=3000)
    assert short > 1.3 * steady and steady < planned < short
    assert planned / steady < (short / steady) ** 0.65  # at least a third of the optimism gone, in log terms


def test_a_request_beyond_the_context_window_makes_every_option_infeasible(plan_in):
    """A 131,072-token window: 130,000 + 2,000 tokens per request fit an H100's memory at TP 2 and more, but vLLM
    rejects such requests, so no option serves the load, and each says why (not "does not fit")."""
    import dataclasses

    long = plan_capacity(dataclasses.replace(plan_in, prompt_tokens=130_000, output_tokens=2_000,
                                             offers=plan_in.offers[:1], tp_sizes=(2, 4)))
    assert not long["feasible"] and long["options"]
    assert {o["infeasible_reason"] for o in long["options"]} == {
        "a request of 132,000 tokens (prompt + output) exceeds llama-3.1-8b-instruct's context window of 131,072 "
        "tokens: vLLM rejects it"}
