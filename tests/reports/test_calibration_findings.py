"""The calibration page's sentence builder and plot series, on the H200 × vLLM 0.24 run's stored records."""

from __future__ import annotations

import json
from pathlib import Path

from advisor.reports.calibration_findings import findings, fit_findings, prefill_series, step_series

# benchmarks/data/h200-vllm0.24/calibration{,-redo}.jsonl with the nested model configs dropped
H200_RECORDS = Path(__file__).parent / "data" / "h200-calibration.jsonl"


def h200_measurements() -> list[dict]:
    return [json.loads(line) for line in H200_RECORDS.read_text().splitlines()]


def test_findings_of_the_h200_run():
    sentences = findings(h200_measurements())
    assert sentences[:2] == [
        "A verify step at k=3 (q=4) costs 1.44× a decode step at B=8 (7.57 ms vs 5.24 ms).",
        "A verify step at k=5 (q=6) costs 1.35× a decode step at B=8 (7.07 ms vs 5.24 ms).",
    ]
    assert sentences[2].startswith("A speculative step without drafts costs 2.12 ms more than a plain decode")
    # the redo's records replace the first run's (24.81 ms, not 35.05 ms)
    assert sentences[3].startswith("One draft-model cycle (k=3) at B=1 takes 24.81 ms, 5.03× a decode step; "
                                   "it cannot pay off at B=1")
    assert sentences[4].startswith("One ngram cycle (k=3) at B=1 takes 6.33 ms, 1.28× a decode step; it pays off")
    assert "Prefill runs at up to 41,999 tokens/s (B=4 × 2048 tokens in 195.05 ms)." in sentences
    assert ("KV cache: 701,152 tokens with the draft model engine vs 914,304 without a drafter (-23.3 %)."
            in sentences)
    assert any(s.startswith("Repeats agreed to a median relative spread of 4.2 %") for s in sentences)
    assert sentences[-1] == ("Batches were co-scheduled: tokens per engine step grew 241× from B=1 to B=256 "
                             "(ideal 256×).")


def test_batches_not_co_scheduled_are_called_out():
    def step(batch: int, tokens: float) -> dict:
        return {"probe": "step_time", "params": {"engine": {"label": "target", "speculative_config": None}},
                "values": {"kind": "step", "batch_size": batch, "q": 1, "step_s": 0.01,
                           "tokens_per_engine_step": tokens}}

    assert findings([step(1, 5.0), step(64, 40.0)]) == [
        "Batches were NOT fully co-scheduled: tokens per engine step grew 8× from B=1 to B=64 (ideal 64×)."
    ]


def test_cycles_whose_batch_drained_are_said_per_iteration():
    """An n-gram engine's cycles at B = 8 on the CPU (2026-12-05 closed loop): the sequences that drafted finished
    first, and vLLM ran its iterations at 4.2 sequences on average."""
    def cycle(batch: int, occupancy: float, engine_step_s: float, step_s: float) -> dict:
        return {"probe": "step_time", "params": {"engine": {"label": "ngram-k4", "speculative_config": {
            "method": "ngram", "num_speculative_tokens": 4}}},
                "values": {"kind": "cycle", "batch_size": batch, "q": 5, "step_s": step_s,
                           "engine_step_s": engine_step_s, "batch_occupancy": occupancy}}

    said = findings([cycle(4, 1.95, 0.0284, 0.0597), cycle(8, 4.17, 0.0346, 0.0690), cycle(2, 1.95, 0.03, 0.031)])
    assert said == ["ngram cycles (k=4) at B=8 drained: their sequences finished at different steps, so vLLM ran its "
                    "iterations at 4.2 sequences on average, 34.60 ms each (69.00 ms per cycle of the mean sequence). "
                    "The fit prices them per iteration at that occupancy."]


def test_drafting_along_the_output_is_said_per_structure():
    """A copy drafter's cells stopped at an output checkpoint: the share of drafting steps over the first tokens
    against the whole generation (SmolLM2, n-gram k = 4 on the CPU build, tests/calibration/test_fit.py), and each
    draft's acceptance where the records count the accepted tokens."""
    def acceptance(probe: str, structure: str, temperature: float, tokens: int, steps: int, drafts: int,
                   accepted: int | None = None) -> dict:
        return {"probe": probe, "params": {"engine": {}}, "values": {
            "label": "ngram-k4", "method": "ngram", "structure": structure, "temperature": temperature,
            "num_prompts": 12, "output_tokens": tokens, "decode_steps": steps, "num_drafts": drafts,
            **({"num_accepted_tokens": accepted} if accepted is not None else {})}}

    said = findings([acceptance("acceptance", "code", 0.0, 1373, 1102, 199, 246),
                     acceptance("acceptance_checkpoint", "code", 0.0, 768, 675, 79, 82),
                     acceptance("acceptance", "json", 0.0, 1300, 1000, 150),
                     acceptance("acceptance_checkpoint", "json", 0.0, 716, 579, 95),
                     acceptance("acceptance", "code", 0.7, 1373, 1102, 100),
                     acceptance("acceptance_checkpoint", "code", 0.7, 768, 675, 40)])
    assert said == ["ngram-k4's share of steps that drafted, by output length (T = 0, the same prompts stopped "
                    "early): code 12% over 64 tokens, 18% over 114 (AL 2.04 and 2.24); json 16% over 60 tokens, 15% "
                    "over 108. Answers read the share and each draft's acceptance at the workload's output length, up "
                    "to 2× each structure's longest output (217–229 tokens here); for longer outputs, calibrate with "
                    "--max-tokens at their length."]


def test_nothing_to_say_about_unknown_records():
    assert findings([{"probe": "timing", "params": {"batch_size": 1}, "values": {"step_time_ms": 5}}]) == []


def test_series_per_engine_role_q_and_temperature():
    series = {s.label: s for s in step_series(h200_measurements())}
    assert series["decode (q=1)"].x == [1, 8, 64, 256]
    assert round(series["decode (q=1)"].measured[-1], 2) == 11.06
    assert series["verify k=5 (q=6), T=0.8"].x == [1, 64, 256]
    assert {"spec step, no drafts (q=1)", "draft_model cycle (k=3)", "ngram cycle (k=3)"} <= set(series)
    prefill = {s.label: s for s in prefill_series(h200_measurements())}
    assert prefill["B=1"].x == [512, 2048, 8192] and prefill["B=4"].x == [512, 2048]


def test_fit_parameters_read_with_units():
    from advisor.reports.calibration_findings import fit_param_rows

    rows = dict(fit_param_rows({"fixed_overhead_s": 0.00212, "per_layer_overhead_s": 4.1e-6,
                                "hbm_bandwidth_bytes_per_s": 4.2e12, "bandwidth_efficiency": 0.8,
                                "rates": [0.7, 0.49], "source": "calibration", "nested": {"a": 1}}))
    assert rows == {"fixed_overhead_s": "2.120 ms", "per_layer_overhead_s": "4.1 µs",
                    "hbm_bandwidth_bytes_per_s": "4.2e+03 G/s", "bandwidth_efficiency": "80.0 %",
                    "rates": "0.7, 0.49", "source": "calibration"}


def test_acceptance_per_position_with_binomial_intervals():
    from advisor.reports.calibration_findings import acceptance_series

    path = Path(__file__).parents[1] / "calibration" / "data" / "probe_run_smollm2_cpu.jsonl"
    plots = acceptance_series([json.loads(line) for line in path.read_text().splitlines()])
    assert sorted(plots) == ["ngram-k4, T=0", "ngram-k4, T=0.7", "ngram-k4, T=1",
                             "self-k4, T=0", "self-k4, T=1"]
    code = next(s for s in plots["ngram-k4, T=0"] if s.label == "code")
    assert code.x == [1, 2, 3, 4] and round(code.measured[0], 4) == round(69 / 145, 4)
    assert code.lower[0] < 69 / 145 < code.upper[0] and round(code.upper[0] - code.lower[0], 2) == 0.16
    sentences = findings([json.loads(line) for line in path.read_text().splitlines()])
    assert ("First-position acceptance (ngram-k4, T=0): highest for rag 0.70 (0.62–0.77), lowest for prose "
            "0.35 (0.26–0.46).") in sentences
    assert "First-position acceptance (self-k4, T=0): 1.00 for every structure (code, prose, json)." in sentences
    self_draft = plots["self-k4, T=0"][0]
    assert self_draft.measured == [1.0] * 4 and self_draft.upper[0] == 1.0 and self_draft.lower[0] < 0.9


def test_fitted_step_time_only_on_target_steps():
    calls = []

    def fitted(batch: int, q: int, temperature: float) -> float:
        calls.append((batch, q, temperature))
        return 0.005 * q

    series = {s.label: s for s in step_series(h200_measurements(), fitted)}
    assert series["verify k=3 (q=4)"].fitted == [20.0] * 4  # ms
    assert series["ngram cycle (k=3)"].fitted == [None] * 4  # a drafter cycle is not one target step
    assert (256, 6, 0.8) in calls


def test_mixed_width_batches_are_their_own_sentence_and_series():
    """Run 15 (H200) timed verify steps of batches in which half the sequences draft k = 5 and half nothing: the
    page says what such a batch costs against a uniform verify, as its own series, not as points of "verify k=5"."""
    path = Path(__file__).parents[2] / "benchmarks" / "data" / "h200-vllm0.24-run15" / "calibration.jsonl"
    measurements = [json.loads(line) for line in path.read_text().splitlines()]
    sentences = findings(measurements)
    assert sentences[:2] == [
        "A verify step at k=3 (q=4) costs 1.41× a decode step at B=8 (9.55 ms vs 6.79 ms).",
        "A verify step at k=5 (q=6) costs 1.04× a decode step at B=8 (7.03 ms vs 6.79 ms).",
    ]
    assert ("A batch in which half the sequences draft k=5 and half nothing costs 1.38× a uniform verify step at "
            "B=8 (9.71 ms vs 7.03 ms).") in " ".join(sentences)
    series = {s.label: s for s in step_series(measurements)}
    assert series["half verify k=5, half no drafts"].x == [2, 8, 64, 256]
    assert series["verify k=5 (q=6)"].x == [1, 8, 64, 256]
    assert series["half verify k=5, half no drafts"].fitted == [None] * 4


def test_a_prefill_above_the_catalogs_peak_is_said():
    from advisor.costmodel import GpuSpec

    cpu = GpuSpec("CPU-2core", 23, 33, 0.47, None, 0.05, "2025-06-01", "generic", "cpu")
    fits = [{"kind": "prefill", "key": "smollm2-135m-instruct", "params": {"compute_efficiency": 2.14}},
            {"kind": "step_time", "key": "smollm2-135m-instruct", "params": {"compute_efficiency": 1.2}}]
    assert fit_findings(fits, "CPU-2core", cpu) == [
        "Prefill computed at 2.14× the catalog's bf16 peak for CPU-2core (0.47 TFLOP/s): the catalog row "
        "understates this host (matrix units it does not count, or another machine under its name). Answers for "
        "it follow the measured rate."]
    assert fit_findings([{"kind": "prefill", "params": {"compute_efficiency": 0.7}}], "H200-SXM") == []
