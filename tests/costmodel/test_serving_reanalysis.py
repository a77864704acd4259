"""docs/planner.md's runs C and D, simulated again from their stored measurements (no vLLM): the tables' figures."""
from __future__ import annotations

import argparse

import pytest

from tests.conftest import REPO, without_iteration_timing

ACCEPTANCE_30 = str(REPO / "benchmarks/data/acceptance-ngram-code-30.jsonl")


def reanalyse(run: str, *extra: str):
    from benchmarks import serving

    parser = argparse.ArgumentParser()
    serving.add_cli_args(parser)
    result = serving.run(parser.parse_args(["--reanalyse", str(REPO / "benchmarks/data" / run), *extra]))
    rows = {(r.mode, round(r.load, 1)): r for r in result.rows}
    within = {mode: sum(abs(e) <= serving.TARGET_ERROR for r in result.rows if r.mode == mode
                        for e in r.errors.values()) for mode in ("baseline", "ngram")}
    return result, rows, within


def test_run_c_reanalysed_gives_the_documented_table():
    result, rows, within = reanalyse("serving-run-c", "--acceptance-records", ACCEPTANCE_30)
    assert len(rows) == 6 and all(r.requests == 120 for r in result.rows) and result.cells == 24
    assert within == {"baseline": 8, "ngram": 4}
    light = rows[("baseline", 0.3)]
    assert light.rate == pytest.approx(1.049, abs=1e-3)
    assert light.measured_ms["tpot_p50"] == pytest.approx(25.3, abs=0.05)
    assert light.simulated_ms["tpot_p50"] == pytest.approx(22.8, abs=0.05)
    knee = rows[("baseline", 1.0)]
    assert knee.measured_ms["ttft_p90"] == pytest.approx(667, abs=0.5)
    assert knee.errors["ttft_p90"] == pytest.approx(0.010, abs=0.005)
    assert rows[("ngram", 1.0)].rate == pytest.approx(3.755, abs=1e-3)
    assert rows[("ngram", 0.3)].errors["tpot_p50"] == pytest.approx(-0.231, abs=0.005)
    front = result.calibration["frontend"]["baseline"]
    # c = 1, 16 and 48 (a full batch too): the offline steps read longer than the served ones, and the fit cannot
    # give time back (non-negative)
    assert front["frontend_s_per_step"] == 0.0 and front["frontend_s_per_seq"] == 0.0
    assert front["frontend_latency_s"] == pytest.approx(0.0236, abs=1e-4)


def test_each_request_keeping_its_prompts_acceptance_slows_the_median_request():
    _, pooled, _ = reanalyse("serving-run-c", "--acceptance-records", ACCEPTANCE_30, "--pooled-acceptance")
    _, own, _ = reanalyse("serving-run-c", "--acceptance-records", ACCEPTANCE_30)
    light = ("ngram", 0.3)
    assert own[light].simulated_ms["tpot_p50"] > pooled[light].simulated_ms["tpot_p50"]
    assert own[("baseline", 0.3)].simulated_ms == pooled[("baseline", 0.3)].simulated_ms


def test_run_d_reanalysed_gives_the_documented_table():
    result, rows, within = reanalyse("serving-run-d", "--acceptance-records", ACCEPTANCE_30)
    assert within["baseline"] == 10
    light, knee = rows[("baseline", 0.3)], rows[("baseline", 1.0)]
    assert knee.rate == pytest.approx(1.656, abs=1e-3)  # ≈ 2.1× slower host than run C's 3.50 req/s
    assert light.measured_ms["tpot_p50"] == pytest.approx(74.3, abs=0.05)
    assert light.errors["tpot_p50"] == pytest.approx(-0.065, abs=0.005)
    assert knee.errors["ttft_p90"] == pytest.approx(1.272, abs=0.01)
    front = result.calibration["frontend"]["baseline"]
    # c = 1, 4 and 8 were disturbed by other jobs (23-34 % of the cores): the fit rests on c = 16
    assert front["frontend_s_per_step"] == 0.0 and front["frontend_s_per_seq"] == 0.0


def test_run_e_on_a_steady_host_comes_within_15_percent_but_at_the_knee():
    """Run E (2026-12-01 16:55-17:15, the host-speed guard's first run): the host stayed within 5.5 % of the serving
    probe's speed before and after every rate, and 22 of 24 percentiles come within 15 % -- every percentile at 0.3x
    and 0.7x, every TPOT, and at the knee (1.0x) every TTFT but the baseline's (-54 %, -19 %); n-gram's knee p50,
    +110 % until the prefill fit could follow this AMX host (calibration.fit.PREFILL_COMPUTE_EFFICIENCY_MAX), is now
    +4 %: the knee moves tens of points with a few per cent of service time. With n-gram the simulation draws each
    request's accepted drafts: one draw of 120 requests put the 0.7x TTFT p90 anywhere from +9 to +26 % (eight seeds,
    before the probe's own tokens per step), so eight draws are pooled."""
    result, rows, within = reanalyse("serving-run-e", "--acceptance-records", ACCEPTANCE_30)
    assert result.cells == 24 and within == {"baseline": 10, "ngram": 12}
    assert all(abs(d) < 0.06 for r in result.rows for d in r.host_drift.values())
    misses = {(r.mode, round(r.load, 1), k) for r in result.rows for k, e in r.errors.items() if abs(e) > 0.15}
    assert misses == {("baseline", 1.0, "ttft_p50"), ("baseline", 1.0, "ttft_p90")}
    assert all(abs(e) <= 0.08 for r in result.rows for k, e in r.errors.items() if k.startswith("tpot"))
    assert all(abs(e) <= 0.10 for r in result.rows if r.load < 0.9 for e in r.errors.values())
    assert rows[("ngram", 0.7)].errors["ttft_p90"] == pytest.approx(0.073, abs=0.005)
    _, one, _ = reanalyse("serving-run-e", "--acceptance-records", ACCEPTANCE_30, "--replicates", "1")
    assert one[("ngram", 0.7)].errors["ttft_p90"] != rows[("ngram", 0.7)].errors["ttft_p90"]  # one draw, not eight
    assert one[("baseline", 1.0)].simulated_ms == rows[("baseline", 1.0)].simulated_ms  # nothing drawn


def test_run_e_knee_ttft_moves_tens_of_points_per_percent_of_service_speed():
    """docs/planner.md, "How sensitive the knee is": Run E simulated with every fitted time 1 % faster or slower.
    At 1.0x the TTFT p50 moves by up to 48-62 points per per cent in both modes; the TPOTs by about one."""
    from benchmarks.ngram_cost import slower_rows

    run = REPO / "benchmarks/data/serving-run-e"
    by = {f: {(r.mode, round(r.load, 1)): r.errors for r in slower_rows(run, f)} for f in (0.99, 1.0, 1.01)}
    for mode in ("baseline", "ngram"):
        p50 = [by[f][(mode, 1.0)]["ttft_p50"] for f in (0.99, 1.0, 1.01)]
        assert p50[0] < p50[1] < p50[2] and max(p50[1] - p50[0], p50[2] - p50[1]) > 0.4
    assert by[1.0][("ngram", 1.0)]["ttft_p50"] == pytest.approx(0.040, abs=0.01)  # Run E's row
    for f in (0.99, 1.01):
        for key, errors in by[f].items():
            for k in ("tpot_p50", "tpot_p90"):
                assert abs(errors[k] - by[1.0][key][k]) < 0.02


def test_run_f_saturated_with_ngram_within_12_percent_on_an_unsteady_host():
    """Run F (2026-12-01 evening): a fourth rate at 1.5x the capacity, on a host ~35 % slower than Run E's and
    unsteady (three rates redone). Saturated, the n-gram server's four percentiles come within 12 %; the saturated
    baseline run was served ~19 % faster than the 1.0x run before it, and the simulation misses it."""
    result, rows, within = reanalyse("serving-run-f", "--acceptance-records", ACCEPTANCE_30)
    assert result.cells == 32 and sum(within.values()) == 23
    assert all(abs(e) < 0.12 for e in rows[("ngram", 1.5)].errors.values())
    assert rows[("ngram", 1.5)].measured_ms["ttft_p50"] > 5000  # a queue that grows through the run
    sat, knee = rows[("baseline", 1.5)], rows[("baseline", 1.0)]
    assert sat.measured_ms["tpot_p50"] < 0.85 * knee.measured_ms["tpot_p50"]
    assert sat.errors["tpot_p50"] == pytest.approx(0.199, abs=0.005)
    assert rows[("baseline", 0.7)].host_drift["after"] < -0.2  # the drift behind its -82 % TTFT p90


def test_host_guard_waits_for_the_host_and_redoes_a_run_it_drifted_during(monkeypatch):
    """benchmarks/serving.py's host-speed guard: a c = 1 reference before a rate waits (bounded) while the host runs
    off the probe's speed; one after it redoes the rate when the host drifted during it; the last run stands."""
    from benchmarks import serving

    monkeypatch.setattr(serving, "wait_for_quiet", lambda max_wait_s: 0.0)
    monkeypatch.setattr(serving.time, "sleep", lambda s: None)
    drifts = iter([0.25, 0.04, 0.30, 0.02, -0.03])  # before (slow, then back), after (drifted), before, after
    runs = []

    def run_once():
        runs.append(len(runs))
        return {"run": len(runs)}, 0.01

    result, others, drift = serving.host_guarded_run(run_once, lambda when: next(drifts), "t", 3, 0.10, 1.0)
    assert result == {"run": 2} and len(runs) == 2 and drift == {"before": 0.02, "after": -0.03}
    # with one attempt the run stands whatever the host did, without waiting, and says so
    drifts = iter([0.5, 0.4])
    result, _, drift = serving.host_guarded_run(run_once, lambda when: next(drifts), "t", 1, 0.10, 1.0)
    assert result == {"run": 3} and drift == {"before": 0.5, "after": 0.4}


def _three_rates(result) -> tuple[int, set]:
    """Within 15 % at the three rates from light to saturated (0.3x, 0.7x, 2x the capacity), and the misses."""
    from benchmarks import serving

    rows = [r for r in result.rows if round(r.load, 1) in (0.3, 0.7, 2.0)]
    within = sum(abs(e) <= serving.TARGET_ERROR for r in rows for e in r.errors.values())
    misses = {(r.mode, round(r.load, 1), k) for r in rows for k, e in r.errors.items() if abs(e) > serving.TARGET_ERROR}
    return within, misses


def test_run_h_light_middle_and_saturated_all_within_15_percent():
    """Run H (2026-12-03, this AMX host, nothing else running): 0.3x, 0.7x and 2x the capacity -- a queue that grows
    through the run, TTFTs of 5-12 s -- every percentile within 15 % in both modes (24 / 24; worst the baseline's
    2x TTFT p90, -11.4 %). At the knee (1.0x, a fourth rate) only the baseline's TTFT p50 misses (+35.6 %): 31 / 32
    over the four rates."""
    result, rows, within = reanalyse("serving-run-h", "--acceptance-records", ACCEPTANCE_30)
    assert result.cells == 32 and sum(within.values()) == 31
    assert _three_rates(result) == (24, set())
    assert max(abs(e) for r in result.rows if round(r.load, 1) != 1.0 for e in r.errors.values()) < 0.115
    knee = rows[("baseline", 1.0)]
    assert {k for k, e in knee.errors.items() if abs(e) > 0.15} == {"ttft_p50"}
    assert rows[("baseline", 2.0)].measured_ms["ttft_p50"] > 5000  # saturated: the queue grows through the run
    assert all(abs(d) < 0.09 for r in result.rows for d in r.host_drift.values())


def test_run_g_an_hour_earlier_misses_on_the_ngram_ttfts():
    """Run G, the same benchmark an hour before Run H on the same host: the baseline's 2x rate within 5 %, n-gram's
    TPOTs within 10 %, but n-gram's TTFTs simulated 9-26 % long at every rate and the baseline's 0.7x TTFT p90 17 %
    short (the host 7-16 % slower around it than at the serving probe): 21 / 24. The n-gram server ran its requests
    faster than its calibration said (TPOT p50 at 0.3x 29.9 ms, Run H's 31.0)."""
    result, rows, _ = reanalyse("serving-run-g", "--acceptance-records", ACCEPTANCE_30)
    within, misses = _three_rates(result)
    assert within == 21 and misses == {("ngram", 0.7, "ttft_p50"), ("ngram", 0.7, "ttft_p90"),
                                       ("baseline", 0.7, "ttft_p90")}
    assert all(abs(e) < 0.05 for e in rows[("baseline", 2.0)].errors.values())
    assert rows[("baseline", 0.7)].host_drift["after"] > 0.15


def test_run_i_on_a_host_that_changed_speed_misses():
    """Run I, after Run H on the same machine: the host ran ~35 % slower than in Run H (capacity 2.41 against 3.73
    req/s) and then sped up during the n-gram rates (the c = 1 reference ~20 % faster than the serving probe around
    the 1x and 2x rates; the guard redid them until its attempts ran out). 11 / 24 at the three rates: a calibration
    holds for the host speed it measured."""
    result, rows, within = reanalyse("serving-run-i", "--acceptance-records", ACCEPTANCE_30)
    assert sum(within.values()) == 13 and _three_rates(result)[0] == 11
    assert all(r.host_drift["before"] < -0.18 for r in result.rows if r.mode == "ngram" and r.load > 0.9)
    assert all(e > 0.3 for k, e in rows[("ngram", 2.0)].errors.items() if k.startswith("tpot"))
    assert rows[("baseline", 0.3)].rate == pytest.approx(0.722, abs=1e-3)


def test_ngram_probe_steps_take_the_tokens_per_step_the_server_counted():
    """The serving probe's few prompts draft less than the 30 pooled (Run H: 1.158 tokens per decode step at c = 1
    by the server's counters, 1.206 pooled). Read at the pooled rate its steps looked ~4 % long, and the front-end
    fit charged every simulated n-gram step 1.5 ms more; at its own rate 0.03 ms."""
    import json

    from benchmarks import serving

    probe = {mode: json.loads((REPO / f"benchmarks/data/serving-run-h/probe-{mode}.json").read_text())
             for mode in ("baseline", "ngram")}
    assert serving.tokens_per_decode_step(probe["ngram"]["1"]["server_counters"]) == pytest.approx(1.158, abs=1e-3)
    assert serving.tokens_per_decode_step(probe["ngram"]["16"]["server_counters"]) == pytest.approx(1.222, abs=1e-3)
    assert serving.tokens_per_decode_step(probe["baseline"]["1"]["server_counters"]) is None
    assert serving.tokens_per_decode_step({}) is None
    result, _, _ = reanalyse("serving-run-h", "--acceptance-records", ACCEPTANCE_30)
    assert result.calibration["frontend"]["ngram"]["frontend_s_per_step"] == pytest.approx(0.00003, abs=2e-5)


def test_run_k_on_an_unsteady_host_holds_for_ngram_not_for_the_baseline():
    """Run K (2026-12-03 evening, the probe with two warm-up requests, 12 at c = 1 and each concurrency's tokens per
    step from the server's counters; 0.3x, 0.7x and 2x): the calibration took 733 s on an unsteady host (step fit
    rms 14 %, "POOR") and the host ran up to 33 % off the serving probe's speed around the rates. n-gram: 12 / 12
    within 15 % but for the saturated TTFT p90 (-17.9 %), its light TTFTs -0.1 % and -8.1 % (Runs G and H: +17 %,
    +8 %). The baseline: 9 / 12; its offline steps read slower than its server then ran (the front-end fit stays at
    0, which cannot give time back), so its saturated TTFTs come out +24 % and +34 %."""
    result, rows, within = reanalyse("serving-run-k", "--acceptance-records", ACCEPTANCE_30)
    assert result.cells == 24 and within == {"baseline": 9, "ngram": 11}
    assert abs(rows[("ngram", 0.3)].errors["ttft_p50"]) < 0.01 and -0.1 < rows[("ngram", 0.3)].errors["ttft_p90"] < 0
    front = result.calibration["frontend"]["baseline"]
    assert front["frontend_latency_s"] == 0.0 and front["frontend_s_per_step"] == 0.0
    assert rows[("baseline", 2.0)].errors["ttft_p90"] > 0.3
    assert max(abs(d) for r in result.rows for d in r.host_drift.values()) > 0.3


def test_run_l_a_quiet_host_misses_only_the_saturated_ttft_p50s():
    """Run L (2026-12-04, a fresh clone on an AMX host, the same benchmark as Run H; others' CPU <= 2 % and the host
    within 4 % of the serving probe's speed around every rate): 0.3x and 0.7x within 7 % in both modes, every TPOT
    within 11 %; the saturated (2x) TTFT p50s miss, the baseline's -24 % and n-gram's +15.1 %: 22 / 24."""
    result, rows, within = reanalyse("serving-run-l", "--acceptance-records", ACCEPTANCE_30)
    assert result.cells == 32 and sum(within.values()) == 26
    assert _three_rates(result) == (22, {("baseline", 2.0, "ttft_p50"), ("ngram", 2.0, "ttft_p50")})
    assert -0.24 < rows[("baseline", 2.0)].errors["ttft_p50"] < -0.23 < 0.15 < rows[("ngram", 2.0)].errors["ttft_p50"]
    assert all(abs(e) < 0.07 for r in result.rows if r.load < 0.9 for e in r.errors.values())
    assert all(abs(e) < 0.11 for r in result.rows for k, e in r.errors.items() if k.startswith("tpot"))
    assert all(abs(d) < 0.05 for r in result.rows for d in r.host_drift.values())
    assert max(r.others_cpu for r in result.rows) < 0.03


def test_run_m_right_after_run_l_holds_the_baseline_and_misses_ngrams_saturated_rate():
    """Run M (2026-12-04, right after Run L on the same quiet host): the baseline's three rates within 9.5 %
    (12 / 12); n-gram's light and middle rates within 6 %, but at 2x its server ran 5.5 % more tokens/s than simulated
    (383 against 363), so its TTFT p50 comes out +22 % (p90 +11.8 %): 23 / 24."""
    result, rows, within = reanalyse("serving-run-m", "--acceptance-records", ACCEPTANCE_30)
    assert result.cells == 32 and sum(within.values()) == 27
    assert _three_rates(result) == (23, {("ngram", 2.0, "ttft_p50")})
    assert all(abs(e) < 0.095 for r in result.rows if r.mode == "baseline" and round(r.load, 1) != 1.0
               for e in r.errors.values())
    saturated = rows[("ngram", 2.0)]
    assert saturated.measured_throughput_tok_s > 1.05 * saturated.simulated_throughput_tok_s


def test_run_n_a_burst_shows_that_waiting_requests_cost_the_engine_nothing_per_step():
    """Run N (2026-12-04 evening, an unsteady host: calibration 582 s, the c = 1 reference up to 22 % off the serving
    probe) adds a burst: all 120 requests at once (``vllm bench serve``'s default rate, inf), 104 of them waiting
    behind a full batch. The served steps did not slow down: the baseline's TPOT p50 43.1 ms in the burst against
    46.6 ms at 2x. The front end's former per-waiting term (fitted from c = 48, 0.10 ms per waiting request per
    step) priced the burst's steps 14 % long (TPOT p50 49.2 ms; TTFTs +17 %, +15 %); without it the baseline's
    burst comes within 10.4 %. n-gram's burst ran with the host 21-22 % faster than its probe (+16 to +23 %)."""
    result, rows, _ = reanalyse("serving-run-n", "--acceptance-records", ACCEPTANCE_30)
    burst, twice = rows[("baseline", float("inf"))], rows[("baseline", 2.0)]
    assert burst.measured_ms["tpot_p50"] < twice.measured_ms["tpot_p50"]
    assert burst.measured_ms["ttft_p50"] > 1.9 * twice.measured_ms["ttft_p50"]  # a queue of 104 from the start
    assert all(abs(e) < 0.105 for e in burst.errors.values())
    assert all(d < -0.2 for d in rows[("ngram", float("inf"))].host_drift.values())
    assert _three_rates(result) == (19, {("baseline", 0.7, "tpot_p90"), ("baseline", 2.0, "ttft_p50"),
                                         ("ngram", 0.3, "tpot_p50"), ("ngram", 2.0, "ttft_p50"),
                                         ("ngram", 2.0, "ttft_p90")})


def test_run_o_a_host_slower_than_its_calibration_misses_the_baseline_at_every_rate():
    """Run O (2026-12-04 evening, right after Run N; 0.3x, 0.7x, 2x and the burst): the baseline server ran slower
    than its calibration and probe priced it at every rate (the simulation 7-16 % short on TPOT p50 at 0.3x and 2x;
    the c = 1 reference +8 % before the light rate), and n-gram's 0.7x run stalled once (TTFT p90 1.44 s against
    0.15 s simulated). n-gram's burst came within 7 %. 9 / 24 at 0.3x, 0.7x and 2x: a host that does not hold
    still for the benchmark's 50 minutes, as in Runs I and N."""
    result, rows, within = reanalyse("serving-run-o", "--acceptance-records", ACCEPTANCE_30)
    assert result.cells == 32 and within == {"baseline": 3, "ngram": 11}
    assert _three_rates(result)[0] == 9
    assert all(r.errors["tpot_p50"] < -0.05 for r in result.rows if r.mode == "baseline")
    assert all(abs(e) < 0.07 for e in rows[("ngram", float("inf"))].errors.values())
    assert rows[("ngram", 0.7)].measured_ms["ttft_p90"] > 9 * rows[("ngram", 0.7)].simulated_ms["ttft_p90"]


def test_run_p_a_fresh_amx_host_within_15_percent_at_three_rates(monkeypatch):
    """Run P (2026-12-04 night, a fresh clone on a quiet AMX host, others' CPU 1 %; 0.3x, 0.7x, 1x and 2x): 24 / 24
    at 0.3x, 0.7x and 2x, the worst the baseline's 0.7x TTFT p50 (+11.9 %); 28 / 32 with the knee. With the prefill
    fit's efficiency bounded at 1, as until this run, that TTFT p50 came out +15.4 % (23 / 24): the fit priced this
    host's prefills up to 2.3x long (rms 90 %)."""
    from calibration import fit

    result, rows, within = reanalyse("serving-run-p", "--acceptance-records", ACCEPTANCE_30)
    assert result.cells == 32 and sum(within.values()) == 28
    assert _three_rates(result) == (24, set())
    assert rows[("baseline", 0.7)].errors["ttft_p50"] == pytest.approx(0.119, abs=0.005)
    assert max(r.others_cpu for r in result.rows) < 0.03
    monkeypatch.setattr(fit, "PREFILL_COMPUTE_EFFICIENCY_MAX", 1.0)
    bounded, _, _ = reanalyse("serving-run-p", "--acceptance-records", ACCEPTANCE_30)
    assert _three_rates(bounded) == (23, {("baseline", 0.7, "ttft_p50")})


def test_run_q_right_after_p_holds_the_baseline_at_every_rate_and_misses_ngrams_saturated_ttfts():
    """Run Q (2026-12-04 night, right after Run P on the same host, the c = 1 reference within 7 % of the serving
    probe around every rate): the baseline within 5 % at every rate, the knee included (16 / 16); n-gram's 0.3x and
    0.7x within 13.3 %, but at 2x its server finished 8.5 % more tokens/s than simulated (395 against 364), so its
    TTFTs came out +27 % and +20 %: 22 / 24 at three rates, as in Runs L and M (21 / 24 with the prefill fit bounded
    at 1: n-gram's 0.7x TTFT p90 +18.9 %)."""
    result, rows, within = reanalyse("serving-run-q", "--acceptance-records", ACCEPTANCE_30)
    assert result.cells == 32 and within == {"baseline": 16, "ngram": 12}
    assert _three_rates(result) == (22, {("ngram", 2.0, "ttft_p50"), ("ngram", 2.0, "ttft_p90")})
    assert all(abs(e) < 0.05 for r in result.rows if r.mode == "baseline" for e in r.errors.values())
    saturated = rows[("ngram", 2.0)]
    assert saturated.measured_throughput_tok_s > 1.08 * saturated.simulated_throughput_tok_s
    assert all(abs(d) < 0.08 for r in result.rows for d in r.host_drift.values())


def test_run_r_a_quiet_epyc_host_within_15_percent_at_every_rate_the_knee_included():
    """Run R (2026-12-05 00:13-00:36, a quiet AMD EPYC host, others' CPU at most 2 %; 0.3x, 0.7x, 1x and 2x): every
    percentile of both modes within 15 %, the knee's too (32 / 32), the worst n-gram's 2x TTFT p50 (+13.8 %). The
    first run on an EPYC host with nothing else running: Runs C, D, F, K, N and O shared theirs or changed speed."""
    result, rows, within = reanalyse("serving-run-r", "--acceptance-records", ACCEPTANCE_30)
    assert result.cells == 32 and within == {"baseline": 16, "ngram": 16}
    assert _three_rates(result) == (24, set())
    assert rows[("ngram", 2.0)].errors["ttft_p50"] == pytest.approx(0.138, abs=0.005)
    assert rows[("baseline", 1.0)].errors["ttft_p90"] == pytest.approx(-0.116, abs=0.005)
    assert max(r.others_cpu for r in result.rows) < 0.03


def test_run_s_calibrated_with_cycles_per_engine_iteration_within_15_percent_at_three_rates(tmp_path):
    """Run S (2026-12-05 01:20-01:42, the same quiet EPYC host as Run R, the probe timing n-gram cycles per vLLM
    iteration at the batch's occupancy): 24 / 24 at 0.3x, 0.7x and 2x, the worst the baseline's 0.7x TTFT p50
    (-12.6 %); 27 / 32 with the knee. The step-time fit is ok at 4.0 % rms; with the cycles' per-iteration fields
    dropped (the accounting until then) it is POOR at 13.5 %, and the three rates still come to 24 / 24 (29 / 32):
    the served steps come from the front-end fit, which absorbs what the offline fit misses."""
    import json
    import shutil

    from benchmarks import gpu_closed_loop as gcl

    result, rows, within = reanalyse("serving-run-s", "--acceptance-records", ACCEPTANCE_30)
    assert result.cells == 32 and sum(within.values()) == 27
    assert _three_rates(result) == (24, set())
    assert rows[("baseline", 0.7)].errors["ttft_p50"] == pytest.approx(-0.126, abs=0.005)
    old_dir = tmp_path / "serving-run-s"
    shutil.copytree(REPO / "benchmarks/data/serving-run-s", old_dir)
    lines = gcl.load_jsonl(old_dir / "records.jsonl")
    (old_dir / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in without_iteration_timing(lines)))
    old, _, old_within = reanalyse(str(old_dir), "--acceptance-records", ACCEPTANCE_30)
    assert _three_rates(old) == (24, set()) and sum(old_within.values()) == 29
