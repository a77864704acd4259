"""Regression guard on the numbers: predict() answers for a spread of scenarios against stored golden answers.

Every numeric leaf must match to 1e-9 relative, every string / bool / null exactly. A deliberate model change
regenerates the file:  SPECADVISOR_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/costmodel/test_golden.py
(review the diff of golden_answers.json before committing it).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from advisor import costmodel as cm

GOLDEN = Path(__file__).with_name("golden_answers.json")
REL = 1e-9


def _scenarios(scenario) -> dict[str, tuple[cm.Scenario, cm.Calibration | None]]:
    cal = cm.Calibration.from_dict({
        "run_id": 7, "hardware": "H100-SXM",
        "step_time": {"llama-3.1-8b-instruct": {"bandwidth_efficiency": 0.75, "compute_efficiency": 0.45,
                                                "fixed_overhead_s": 8e-4,
                                                "covariance": [[1e-4, 0, 0], [0, 1e-4, 0], [0, 0, 1e-8]]}},
        "prefill": {}, "acceptance": {}, "max_batch_calibrated": 16, "temperature_range": [0.0, 1.0]})
    return {
        "eagle_given_al": (scenario(), None),
        "eagle_prior_k_auto": (scenario(acceptance=None, num_speculative_tokens=None, structure="code",
                                        temperature=0.7), None),
        "arrival_rate": (scenario(concurrency=None, requests_per_second=2.0), None),
        "slo_and_load": (scenario(slo=cm.Slo(latency_ms=3000.0, ttft_ms=200.0),
                                  load=cm.TcoLoad(output_tokens_per_second=20_000)), None),
        "draft_model_tp4": (scenario(target_model="llama-3-70b-instruct", gpu_count=4, method="draft_model",
                                     draft_model="llama-3.2-1b-instruct", acceptance=None, concurrency=4), None),
        "ngram_rag": (scenario(method="ngram", draft_model=None, acceptance=None, structure="rag",
                               num_speculative_tokens=None, concurrency=64), None),
        "eagle3_fp8": (scenario(method="eagle3", draft_model="eagle3-llama-3.1-8b", acceptance=None,
                                num_speculative_tokens=None, weights_dtype="fp8"), None),
        "sglang_tree": (scenario(engine="sglang", concurrency=16, acceptance=None, num_speculative_tokens=None), None),
        "calibrated_far": (scenario(concurrency=64, num_speculative_tokens=None), cal),
    }


def _answers(gpus, models, scenario) -> dict[str, dict]:
    out = {}
    for name, (sc, cal) in _scenarios(scenario).items():
        draft = models.get(sc.speculator.draft_model) if sc.speculator.draft_model else None
        out[name] = cm.predict(sc, gpus[sc.gpu], models[sc.target_model], draft, calibration=cal).to_dict()
    return json.loads(json.dumps(out))  # JSON round trip: tuples → lists, as stored


def _diff(want, got, path: str, out: list[str]) -> None:
    if isinstance(want, dict) and isinstance(got, dict):
        for key in sorted(set(want) | set(got)):
            if key not in want or key not in got:
                out.append(f"{path}.{key}: only in {'golden' if key in want else 'answer'}")
            else:
                _diff(want[key], got[key], f"{path}.{key}", out)
    elif isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            out.append(f"{path}: length {len(want)} != {len(got)}")
        for i, (w, g) in enumerate(zip(want, got)):
            _diff(w, g, f"{path}[{i}]", out)
    elif (isinstance(want, (int, float)) and isinstance(got, (int, float))
          and not isinstance(want, bool) and not isinstance(got, bool)):
        if not math.isclose(want, got, rel_tol=REL, abs_tol=1e-12):
            out.append(f"{path}: {want!r} != {got!r}")
    elif want != got:
        out.append(f"{path}: {want!r} != {got!r}")


def test_answers_match_golden(gpus, models, make_scenario):
    got = _answers(gpus, models, make_scenario)
    if os.environ.get("SPECADVISOR_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        pytest.skip("golden answers regenerated")
    want = json.loads(GOLDEN.read_text(encoding="utf-8"))
    problems: list[str] = []
    _diff(want, got, "", problems)
    assert not problems, f"{len(problems)} differences, first: " + "; ".join(problems[:10])


def test_tco_without_slo_compares_at_the_baseline_latency(gpus, models, make_scenario):
    """No SLO stated: baseline runs at the workload's concurrency; speculation at its own best point that is no
    slower end to end (iso-latency) — not both at max concurrency."""
    scenario = make_scenario
    sc = scenario(load=cm.TcoLoad(output_tokens_per_second=20_000))
    d = cm.predict(sc, gpus["H100-SXM"], models["llama-3.1-8b-instruct"], models["eagle-llama-3.1-8b"]).to_dict()
    tco, op = d["tco"], d["tco"]["operating_point"]
    assert tco["slo"]["source"].startswith("default:") and tco["slo"]["latency_ms"] == d["latency_ms"]["baseline"]["total"]
    assert op["baseline"]["concurrency"] == 8 and op["baseline"]["latency_ms"] == d["latency_ms"]["baseline"]["total"]
    assert op["speculative"]["latency_ms"] <= op["baseline"]["latency_ms"]
    assert op["speculative"]["concurrency"] > op["baseline"]["concurrency"]
    assert op["speculative"]["throughput_tok_s"] > op["baseline"]["throughput_tok_s"]
    assert tco["gpus_needed"]["speculative"] < tco["gpus_needed"]["baseline"] and tco["monthly_savings_usd"] > 0
    stated = cm.predict(scenario(slo=cm.Slo(tpot_ms=20.0)), gpus["H100-SXM"], models["llama-3.1-8b-instruct"],
                        models["eagle-llama-3.1-8b"]).to_dict()["tco"]
    assert stated["slo"] == {"tpot_ms": 20.0, "ttft_ms": None, "latency_ms": None, "source": "input"}
