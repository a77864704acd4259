"""The CPU closed loop validates the product's probe plan on prompts the calibration has not seen."""
import pytest

from benchmarks import closed_loop
from benchmarks import gpu_closed_loop as gcl
from calibration.probes import load_prompts, plan_engines
from calibration.runner import probe_config
from tests.conftest import without_iteration_timing


def _plan():
    cfg = closed_loop.probe_config("/models/smollm2").resolved(on_gpu=False)
    return cfg, plan_engines(cfg, load_prompts())


def test_closed_loop_runs_the_product_plan_with_its_extra_engines():
    cfg, plan = _plan()
    labels = [e.label for e in plan]
    assert labels == ["target", "verify-k4", "truncated-8l", "ngram-k4", "draft_model-self-k4",
                      "draft_model-self-k2"]
    assert [t for t in plan[5].tasks] == [("cycle", b, 0.0) for b in (1, 4, 8)]  # a cycle's scaling with k
    assert cfg.engines_together and not cfg.isolate_engines  # timings interleaved over engines alive together
    verify = plan[1].tasks
    # speculative steps without drafts (width 0) and verify steps, greedy and sampled
    assert {(w, t) for _, _, w, t in verify} == {(0, 0.0), (4, 0.0), (0, 0.8), (4, 0.8)}
    self_cycles = [t for t in plan[4].tasks if t[0] == "cycle"]
    assert ("cycle", 4, 0.8) in self_cycles and len(self_cycles) == 5
    assert cfg.guard_contention and cfg.enforce_eager
    # advisor calibrate's defaults are the same acceptance cells
    user = probe_config({"target_model": "smollm2-135m-instruct"})
    assert (user.prompts_per_probe, user.max_tokens, user.verify_ks, user.sampled_temperature) == \
        (cfg.prompts_per_probe, cfg.max_tokens, cfg.verify_ks, cfg.sampled_temperature) == (12, 128, (4,), 0.8)


def test_held_out_workloads_share_no_prompt_with_the_calibration():
    _, plan = _plan()
    probed = {p for item in plan for task in item.tasks if task[0] == "accept"
              for p in load_prompts()[task[1]][:12]}
    assert len(probed) >= 6 * 12
    for case in closed_loop.workloads():
        for prompt in case.prompts:
            assert not any(prompt[:80] in p or p[:80] in prompt for p in probed), (case.name, prompt[:40])


def test_the_users_sample_prompts_are_not_the_measured_ones():
    sample = load_prompts(gcl.REPO_ROOT / "benchmarks" / "data" / "closed-loop-user-sample.jsonl")
    structures = ("sql", "code", "json", "rag", "prose", "creative")
    assert {s: len(p) for s, p in sample.items()} == dict.fromkeys(structures, 12)
    measured = {p for case in closed_loop.workloads() for p in case.prompts}
    assert not measured & {p for prompts in sample.values() for p in prompts}


def _load(name: str) -> list[dict]:
    """A stored closed loop's JSON lines (``benchmarks/data/NAME``)."""
    return gcl.load_jsonl(gcl.REPO_ROOT / "benchmarks" / "data" / name)


def test_stored_run_reanalysed_gives_the_documented_figures():
    """docs/closed-loop.md's product-plan run, re-fitted and re-predicted from its stored records and measurements."""
    results, _ = closed_loop.compare(closed_loop.workloads(), _load("closed_loop_2026-12-01-plan-measurements.jsonl"),
                                     _load("closed_loop_2026-12-01-plan-records.jsonl"))
    assert len(results) == 9
    assert round(100 * closed_loop.median_abs_error(results), 1) == 6.8
    assert _covered(results) == 9
    assert [r.name for r in results if (r.predicted_speedup > 1) != (r.measured_speedup > 1)] == ["json-b3"]


def test_run_on_an_amx_host_meets_every_cpu_target():
    """The same plan and workloads on another host class (2026-12-01 17:56, an Intel Xeon with AMX; the catalog's
    CPU-2core row describes an AMD EPYC, whose bf16 peak this host's prefill exceeds about 2x): median 7.2 %,
    sign 9/9, interval 8/9 (rag-b6, measured 1.60x above 1.48x). json-b3's sign is right by a hair: predicted
    1.02x (0.96x on the earlier host), measured 1.23x -- its held-out prompts still draft on 44 % of steps against
    22 % on the probe set."""
    results, _ = closed_loop.compare(closed_loop.workloads(), _load("closed_loop_2026-12-01-amx-measurements.jsonl"),
                                     _load("closed_loop_2026-12-01-amx-records.jsonl"))
    assert len(results) == 9 and round(100 * closed_loop.median_abs_error(results), 1) == 7.2
    assert all((r.predicted_speedup > 1) == (r.measured_speedup > 1) for r in results)
    assert [r.name for r in results if not r.predicted_low <= r.measured_speedup <= r.predicted_high] == ["rag-b6"]
    json_b3 = next(r for r in results if r.name == "json-b3")
    assert 1.0 < json_b3.predicted_speedup < 1.05 and json_b3.measured_speedup > 1.2


def test_a_third_host_misses_only_json_b3s_sign_on_its_drafted_fraction():
    """2026-12-04, an Intel Xeon with AMX, from a fresh clone: median 4.3 %, sign 8/9, interval 9/9 (8/9 before the
    drafted fraction's draws moved with the acceptance's: json-b3 left it). The one miss is json-b3 at break-even ("calibrate": predicted 0.99x, measured 1.31x), as on the first host: its held-out
    prompts draft on 44 % of steps against 22 % on the probe set. At the drafted fraction measured its speculative
    TPOT comes out 10 % high instead of 27 %; the rest is its acceptance length (1.95 predicted, 2.24 measured)."""
    import dataclasses

    records = _load("closed_loop_2026-12-04-records.jsonl")
    results, _ = closed_loop.compare(closed_loop.workloads(), _load("closed_loop_2026-12-04-measurements.jsonl"),
                                     records)
    assert len(results) == 9 and round(100 * closed_loop.median_abs_error(results), 1) == 4.3
    assert [r.name for r in results if (r.predicted_speedup > 1) != (r.measured_speedup > 1)] == ["json-b3"]
    assert [r.name for r in results if not r.predicted_low <= r.measured_speedup <= r.predicted_high] == []
    json_b3 = next(r for r in results if r.name == "json-b3")
    assert json_b3.decision == "calibrate" and json_b3.predicted_draft_fraction < 0.6 * json_b3.measured_draft_fraction
    gpu, target = closed_loop.load_catalog()
    cal, _ = closed_loop.build_calibration(records, gpu, target)
    case = next(c for c in closed_loop.workloads() if c.name == "json-b3")
    acc = {k: dataclasses.replace(v, draft_fraction=json_b3.measured_draft_fraction, draft_fraction_logit=None)
           for k, v in closed_loop._at_temperature(cal, case.temperature, case.output_tokens).acceptance.items()}
    at_measured_f = closed_loop.predict_case(dataclasses.replace(case, output_tokens=json_b3.output_tokens),
                                             json_b3.prompt_tokens, gpu, target,
                                             dataclasses.replace(cal, acceptance=acc))
    assert json_b3.predicted_tpot_ms_spec / json_b3.measured_tpot_ms_spec == pytest.approx(1.27, abs=0.01)
    assert at_measured_f["tpot_spec"] / json_b3.measured_tpot_ms_spec == pytest.approx(1.10, abs=0.01)
    assert (round(json_b3.predicted_al, 2), round(json_b3.measured_al, 2)) == (1.95, 2.24)


def _stored_loop(name: str, per_iteration: bool = True, long_step: bool = True):
    """A stored closed loop re-derived: its results and its step-time fit's rms. ``per_iteration=False`` drops the
    cycles' ``engine_step_s`` and ``batch_occupancy`` (the accounting until 2026-12-05: per mean sequence's cycle);
    ``long_step=False`` drops the target's decode step at 1,024 tokens of context."""
    records = [r for r in _load(f"{name}-records.jsonl")
               if long_step or not (r["probe"] == "step_time" and r["values"].get("context_len", 0) > 500)]
    if not per_iteration:
        records = without_iteration_timing(records)
    results, _ = closed_loop.compare(closed_loop.workloads(), _load(f"{name}-measurements.jsonl"), records)
    gpu, target = closed_loop.load_catalog()
    _, fits = closed_loop.build_calibration(records, gpu, target)
    step = next(f for f in fits if f["kind"] == "step_time")
    rms = (sum(x * x for x in step["residuals"]) / len(step["residuals"])) ** 0.5
    return results, rms


def _covered(results) -> int:
    return sum(r.predicted_low <= r.measured_speedup <= r.predicted_high for r in results)


@pytest.mark.parametrize("name, long_step, median_pct, old_median_pct, covered, old_covered", [
    ("closed_loop_2026-12-05", True, 7.5, 8.6, 8, 8),  # the product plan as shipped
    ("closed_loop_2026-12-05-long-step", False, 3.5, 5.4, 8, 8),  # a second run, its extra long step left out
])
def test_cycles_timed_per_engine_iteration_fit_the_steps_and_the_held_out_workloads(
        name, long_step, median_pct, old_median_pct, covered, old_covered):
    """2026-12-05, two closed loops on an AMD EPYC host (the catalog's CPU-2core). An n-gram engine's cycles at B = 8
    ran 2.4x the iterations its mean sequence needed (the sequences that drafted finished first); timed per mean
    cycle, they read 69 ms, per engine iteration 34.6 ms at 4.2 sequences. With cycles per iteration the step-time
    fit goes from POOR (11-12 % rms) to ok, and the held-out workloads' median error drops. The narrower timing
    interval covers one workload less in the first run: its misses are acceptance transfers (sql-b1 drafts on 29 % of
    steps against 12 % on the probe set) and rag-b6's baseline at 304-token prompts."""
    results, rms = _stored_loop(name, long_step=long_step)
    old, old_rms = _stored_loop(name, per_iteration=False, long_step=long_step)
    assert len(results) == len(old) == 9
    assert rms < 0.10 and old_rms > 0.11
    assert round(100 * closed_loop.median_abs_error(results), 1) == median_pct
    assert round(100 * closed_loop.median_abs_error(old), 1) == old_median_pct
    assert (_covered(results), _covered(old)) == (covered, old_covered)
    assert [r.name for r in results if (r.predicted_speedup > 1) != (r.measured_speedup > 1)] == ["json-b3"]


def test_a_decode_step_at_a_long_context_left_the_cpu_loop_as_it_was():
    """The second run also timed a decode at B = 8 and 1,024 tokens (the GPU plan's long step, not in the CPU plan):
    112 s on the wall clock for a 63 % spread between repeats, and the median error 4.0 % against 3.5 % without it."""
    with_step, _ = _stored_loop("closed_loop_2026-12-05-long-step")
    without, _ = _stored_loop("closed_loop_2026-12-05-long-step", long_step=False)
    assert round(100 * closed_loop.median_abs_error(with_step), 1) == 4.0
    assert round(100 * closed_loop.median_abs_error(without), 1) == 3.5


def test_on_a_gpu_the_closed_loop_runs_the_same_plan_with_the_gpu_defaults():
    """``closed_loop.py --gpu``: the CPU loop's engines and acceptance cells, as a GPU node serves them."""
    cpu_cfg, cpu_plan = _plan()
    cfg = closed_loop.probe_config("/models/smollm2", on_gpu=True).resolved(on_gpu=True)
    plan = plan_engines(cfg, load_prompts())
    assert [e.label for e in plan] == [e.label for e in cpu_plan]
    assert [t for t in plan[3].tasks if t[0] == "accept"] == [t for t in cpu_plan[3].tasks if t[0] == "accept"]
    assert not cfg.enforce_eager and cfg.isolate_engines and cfg.parallel_starts and cfg.step_clock == "engine"
    assert ("mixed_step", 8, 4) in plan[1].tasks and ("mixed_step", 8, 4) not in cpu_plan[1].tasks
    assert ("text_cycle", 8, 0.0) in plan[3].tasks and not any(t[0] == "text_cycle" for t in cpu_plan[3].tasks)
    assert cpu_cfg.enforce_eager and cfg.kv_cache_space_gib is None


def test_a_runs_acceptance_priced_with_its_own_timing_as_two_runs_predicts_as_the_run_whole():
    """The service's composition of an acceptance run and a timing run (``Calibration.with_timing``), fed one run's
    records split in two, gives that run's predictions to the last bit."""
    records = _load("closed_loop_2026-12-05-records.jsonl")
    measurements = _load("closed_loop_2026-12-05-measurements.jsonl")
    whole, _ = closed_loop.compare(closed_loop.workloads(), measurements, records)
    split, fits = closed_loop.compare(closed_loop.workloads(), measurements,
                                      [r for r in records if r["probe"] == "acceptance"],
                                      timing_records=[r for r in records if r["probe"] != "acceptance"])
    assert [(r.predicted_speedup, r.predicted_low, r.predicted_high) for r in split] == \
        [(r.predicted_speedup, r.predicted_low, r.predicted_high) for r in whole]
    assert [f["kind"] for f in fits][:2] == ["step_time", "prefill"] and len(fits) == 14


@pytest.mark.parametrize("name, measured, long_step, own, user, user_misses", [
    # (median %, signs right, intervals covering) from our probe prompts, then from the user's sample; the
    # sample's interval misses
    ("closed_loop_2026-12-08", None, True, (11.9, 9, 9), (11.8, 9, 8), ["rag-b6"]),
    ("closed_loop_2026-12-05-0927", None, True, (4.8, 8, 7), (5.7, 8, 8), ["rag-b6"]),
    ("closed_loop_2026-12-05", None, True, (7.5, 8, 8), (6.6, 9, 8), ["rag-b6"]),
    ("closed_loop_2026-12-05-long-step", None, False, (3.5, 8, 8), (4.4, 9, 8), ["rag-b6"]),
    ("closed_loop_2026-12-04", None, True, (4.3, 8, 9), (3.5, 9, 8), ["rag-b6"]),
    ("closed_loop_2026-12-01-amx", None, True, (7.2, 9, 8), (5.7, 9, 8), ["rag-b6"]),
    ("closed_loop_2026-12-01-plan", None, True, (6.8, 8, 9), (3.4, 9, 8), ["rag-b6"]),
    ("closed_loop_2026-12-01-engine-clock", "closed_loop_2026-12-01-plan", True, (15.0, 9, 9), (11.3, 9, 9), []),
])
def test_acceptance_on_the_users_own_prompts_fixes_the_sql_transfer(name, measured, long_step, own, user,
                                                                     user_misses):
    """2026-12-05: ``closed_loop --probes acceptance --prompts benchmarks/data/closed-loop-user-sample.jsonl`` (12
    prompts per structure in the held-out workloads' voice, none of theirs; 230 s), priced with each stored run's
    timing as the service prices an acceptance-only run (docs/closed-loop.md). sql-b1, priced 19-28 % low from our
    prompts, comes within 5 % on all seven, and on the fresh run of 2026-12-08 (AVX-512 AMD EPYC, the plan with its
    output checkpoints, 128-token outputs: 11.9 % from our prompts, 11.8 % from the sample, both over the target).
    json-b3's sign, missed at break-even on five of the seven from our prompts, is right on six; on the fresh run of
    09:27 it stays below 1 (0.97x, measured 1.15x). rag-b6 leaves the interval: the sample's RAG questions draft on
    29 % of steps, the workload's on 36-40 %."""
    records = [r for r in _load(f"{name}-records.jsonl")
               if long_step or not (r["probe"] == "step_time" and r["values"].get("context_len", 0) > 500)]
    measurements = _load(f"{measured or name}-measurements.jsonl")
    user_records = _load("closed_loop_2026-12-05-user-prompts-records.jsonl")
    for expected, results in ((own, closed_loop.compare(closed_loop.workloads(), measurements, records)[0]),
                              (user, closed_loop.compare(closed_loop.workloads(), measurements, user_records,
                                                         timing_records=records)[0])):
        assert len(results) == 9
        assert (round(100 * closed_loop.median_abs_error(results), 1),
                sum((r.predicted_speedup > 1) == (r.measured_speedup > 1) for r in results), _covered(results)) \
            == expected
    assert [r.name for r in results if not r.predicted_low <= r.measured_speedup <= r.predicted_high] == user_misses
    sql = next(r for r in results if r.name == "sql-b1")
    assert abs(sql.error) < 0.05 and sql.predicted_draft_fraction > 0.25  # 0.12-0.14 from our probe prompts


def test_two_prompt_sets_differ_by_less_than_the_intervals_transfer_spread():
    """docs/closed-loop.md, "How far two prompt sets differ": our set against the user's sample over the 18 n-gram
    cells, 0.46 in logit (RMS); one prompt within a cell, 0.73; a workload of 3 prompts about 0.54 from the probe
    set, inside the 0.7 the interval draws a copy drafter's drafted fraction with."""
    import math
    import statistics

    def cells(name: str) -> dict:
        return {(r["values"]["structure"], r["values"]["temperature"]): r["values"] for r in _load(name)
                if r["probe"] == "acceptance" and r["values"]["method"] == "ngram"}

    def logit(p: float) -> float:
        p = min(max(p, 0.01), 0.99)
        return math.log(p / (1 - p))

    ours = cells("closed_loop_2026-12-05-records.jsonl")
    sample = cells("closed_loop_2026-12-05-user-prompts-records.jsonl")
    assert len(ours) == len(sample) == 18
    between = math.sqrt(statistics.mean((logit(sample[k]["drafted_fraction"]) - logit(ours[k]["drafted_fraction"]))
                                        ** 2 for k in ours))
    within = statistics.median(statistics.stdev(logit(drafts / steps) for steps, drafts, *_ in cell["per_request"])
                               for cells_ in (ours, sample) for cell in cells_.values())
    assert (round(between, 2), round(within, 2)) == (0.46, 0.73)
    style = math.sqrt((between / math.sqrt(2)) ** 2 - (within / math.sqrt(12)) ** 2)
    three_prompts = math.sqrt(style ** 2 + (within / math.sqrt(12)) ** 2 + within ** 2 / 3)
    assert round(style, 2) == 0.25 and round(three_prompts, 2) == 0.54 < 0.7


def test_drafting_and_acceptance_move_together_between_prompt_sets():
    """docs/closed-loop.md, "Drafting and acceptance move together": between our probe set and the user's sample
    (18 n-gram cells) the changes in logit(drafted fraction) and ln(AL) correlate at 0.87, between the probe set and
    the seven held-out n-gram workloads at 0.80; the interval's draws of the drafted fraction share their normal with
    the acceptance intercept's at DRAFT_FRACTION_ACCEPTANCE_CORR = 0.8, and the point (draw 0) stays put."""
    import math
    import statistics

    import numpy as np

    from advisor.costmodel import acceptance

    def logit(p: float) -> float:
        p = min(max(p, 0.01), 0.99)
        return math.log(p / (1 - p))

    def cells(name: str) -> dict:
        return {(r["values"]["structure"], r["values"]["temperature"]): r["values"] for r in _load(name)
                if r["probe"] == "acceptance" and r["values"]["method"] == "ngram"}

    ours = cells("closed_loop_2026-12-05-records.jsonl")
    sample = cells("closed_loop_2026-12-05-user-prompts-records.jsonl")
    between = statistics.correlation(
        [logit(sample[k]["drafted_fraction"]) - logit(ours[k]["drafted_fraction"]) for k in ours],
        [math.log(sample[k]["acceptance_length"] / ours[k]["acceptance_length"]) for k in ours])
    results, _ = closed_loop.compare(closed_loop.workloads(), _load("closed_loop_2026-12-05-0927-measurements.jsonl"),
                                     _load("closed_loop_2026-12-05-0927-records.jsonl"))
    copy = [r for r in results if not r.name.startswith("self")]
    held_out = statistics.correlation(
        [logit(r.measured_draft_fraction) - logit(r.predicted_draft_fraction) for r in copy],
        [math.log(r.measured_al / r.predicted_al) for r in copy])
    assert len(ours) == 18 and len(copy) == 7
    assert (round(between, 2), round(held_out, 2)) == (0.87, 0.80)
    assert acceptance.DRAFT_FRACTION_ACCEPTANCE_CORR == round(min(between, held_out), 2)
    rng = np.random.default_rng(0)
    own, intercept = rng.standard_normal(20_000), rng.standard_normal(20_000)
    draws = acceptance.sample_draft_fraction(0.2, own, intercept)
    assert draws[0] == 0.2
    logits = np.log(draws / (1 - draws))
    assert np.corrcoef(logits, intercept)[0, 1] == pytest.approx(0.8, abs=0.02)
    assert np.std(logits) == pytest.approx(acceptance.DRAFT_FRACTION_LOGIT_STD, rel=0.03)


def test_the_plan_with_its_output_checkpoints_on_the_cpu_end_to_end():
    """2026-12-07, an AMD EPYC host with AVX-512 bf16: the plan as it ships (its copy drafters' cells stopped at an
    output checkpoint too) calibrated once (931 s), then the nine held-out workloads measured with outputs limited
    to 32, 128 and 512 tokens. Read along the output (the share of steps that draft and each draft's acceptance),
    every CPU target is met at 32 tokens: median 4.3 %, sign 9/9, interval 9/9 (6.2 % and json-b3's sign missed
    with the share alone); at 128: 12.1 %, 9/9, 9/9. The n-gram share meets the 32-token outputs (median |error|
    0.023, one share for every length 0.075), their AL comes within 14.3 % (18.1 %), and their speedups within 3.7 %
    (flat 6.3 %); at the probes' own length 13.6 % either way, the AL within 9.6 % (12.4 %). Outputs of 158-456
    tokens, past twice the probes' longest, ran faster than answered ("calibrate" with --max-tokens at their
    length): 6.6 %, 9/9, 8/9 (sql-b1 at 2.22x above 1.88x), the n-gram speedups 24.1 % off (flat 15.5 %)."""
    import dataclasses
    import statistics

    from benchmarks import drafting_along_output as dao

    run = gcl.REPO_ROOT / "benchmarks" / "data" / "cpu-smollm2-output-length"
    records = gcl.load_jsonl(run / "calibration-records.jsonl")
    assert sum(r["probe"] == "acceptance_checkpoint" for r in records) == 18  # n-gram: six structures x three T
    flat = [r for r in records if r["probe"] != "acceptance_checkpoint"]
    figures = {}
    for limit in (32, 128, 512):
        cases = [dataclasses.replace(c, output_tokens=limit) for c in closed_loop.workloads()]
        measured = closed_loop.pool_measurements(gcl.load_jsonl(run / f"measurements-{limit}.jsonl"))
        results, _ = closed_loop.compare(cases, measured, records)
        al_error = {name: round(100 * statistics.median(abs(r.predicted_al / r.measured_al - 1) for r in res
                                                        if r.method == "ngram"), 1)
                    for name, res in (("along", results), ("flat", closed_loop.compare(cases, measured, flat)[0]))}
        figures[limit] = (round(100 * closed_loop.median_abs_error(results), 1), _covered(results),
                          [r.name for r in results if (r.predicted_speedup > 1) != (r.measured_speedup > 1)], al_error)
    assert figures == {32: (4.3, 9, [], {"along": 14.3, "flat": 18.1}),
                       128: (12.1, 9, [], {"along": 9.6, "flat": 12.4}),
                       512: (6.6, 8, [], {"along": 16.2, "flat": 19.2})}

    along = dao.closed_loop(run)
    summary = {limit: {name: (d[name]["median_abs_speedup_error"], d[name]["median_abs_draft_fraction_error"])
                       for name in ("grown", "flat")} for limit, d in along.items()}
    assert summary == {32: {"grown": (0.0372, 0.0226), "flat": (0.0632, 0.0748)},
                       128: {"grown": (0.1356, 0.0574), "flat": (0.136, 0.0398)},
                       512: {"grown": (0.2415, 0.1345), "flat": (0.155, 0.1525)}}
    assert [w["decision"] for w in along[512]["workloads"]] == ["calibrate"] * 7
