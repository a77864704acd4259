"""The thirteen calibrations of the GPU plan as it ships, each predicting its own lease
(benchmarks/calibration_tally.py, docs/gpu-closed-loop.md "One calibration, thirteen times"): the tally re-derived
from the stored records."""
from __future__ import annotations

import json

import pytest

from benchmarks import calibration_tally as ct

STORED = json.loads((ct.DATA / "calibration-tally-2026-12-05.json").read_text())
TALLIES = {t["variant"]: t for t in STORED["tallies"]}


@pytest.fixture(scope="module")
def spread() -> float:
    return ct.start_spread()


@pytest.fixture(scope="module")
def implied() -> float:
    """How far the thirteen calibrations' draft-model proposer overhead lands from what their leases' measurements
    ran (in log, RMS; +0.14 of it a bias: the calibrations caught the drafter faster)."""
    value = ct.implied_proposer_spread()
    assert value == pytest.approx(STORED["implied_spread"], rel=1e-4) and 0.35 < value < 0.40
    return value


def _floor(variant: str, spread: float, implied: float) -> float:
    return implied if variant.endswith("implied-spread") else spread


def test_the_off_graph_steps_are_the_verify_engines_plain_steps_at_widths_other_than_k_plus_one():
    records = ct.gcl.calibration_records(ct.run_dir("run17"))
    left = ct.off_graph_left_out(records)
    gone = [r for r in records if r not in left]
    assert {(r["values"].get("q"), r["params"]["engine"]["speculative_config"]["num_speculative_tokens"])
            for r in gone} == {(1, 5), (4, 5)}  # the verify engine runs k = 5: q = 1 (no drafts) and q = 4
    assert all(r["probe"] == "step_time" and r["values"].get("kind", "step") == "step" for r in gone)
    assert len(gone) == 11 and len(left) == len(records) - 11  # its full-width (q = 6) steps and every cycle stay


@pytest.mark.parametrize("variant", ["as-shipped", "off-graph-left-out", "off-graph-left-out+start-spread",
                                     "off-graph-left-out+implied-spread"])
def test_tally(variant, spread, implied):
    assert spread == pytest.approx(STORED["start_spread"], rel=1e-4)
    got, stored = ct.tally(variant, _floor(variant, spread, implied)), TALLIES[variant]
    assert (got.signs_right, got.covered, got.points, got.within_10_percent) == (
        stored["signs_right"], stored["covered"], stored["points"], stored["within_10_percent"])
    assert got.mean_median == pytest.approx(stored["mean_median"], rel=1e-4)
    assert got.ngram_bias == pytest.approx(stored["ngram_bias"], rel=1e-3, abs=1e-4)


def test_what_the_tally_says():
    shipped, left_out = TALLIES["as-shipped"], TALLIES["off-graph-left-out"]
    spread = TALLIES["off-graph-left-out+start-spread"]
    # as the fit ships, a calibration prices n-gram low at small batches: the median signed error over the thirteen
    # is negative at every B up to 64, at both acceptances
    assert all(v < 0 for k, v in shipped["ngram_bias"].items() if not k.endswith(("/128", "/256")))
    # with the verify engine's off-graph steps left out the n-gram errors centre and 12 of 16 sign misses go ...
    assert max(map(abs, left_out["ngram_bias"].values())) < 0.10
    assert (shipped["points"] - shipped["signs_right"], left_out["points"] - left_out["signs_right"]) == (16, 4)
    assert left_out["ngram_mean"] < shipped["ngram_mean"] - 0.02 and left_out["mean_median"] < shipped["mean_median"]
    # ... but the intervals, which that misfit widened, cover 91 % (one calibration 61 %), and the draft model's
    # spread between engine starts brings them back to 96 % (the lowest 83 %)
    assert left_out["covered"] / left_out["points"] < 0.92 and left_out["min_coverage"] < 0.65
    assert spread["covered"] / spread["points"] > 0.95 and spread["min_coverage"] > 0.8
    # the draft model's error is its state between engine starts, which neither change touches: most calibrations
    # caught it faster than their lease's measurement did
    assert min(t["draft_model_mean"] for t in TALLIES.values()) > 0.17
    signed = [c["draft_model_signed"] for c in shipped["calibrations"].values()]
    assert sum(e > 0 for e in signed) == 8 and max(signed) > 0.5 and min(signed) > -0.15
    assert {t["within_10_percent"] for t in (shipped, left_out, spread)} <= {5, 6}


LEASES = {(t["variant"], t["source"]): t for t in STORED["leases"]}


@pytest.mark.parametrize("variant", ["as-shipped", "off-graph-left-out+start-spread",
                                     "off-graph-left-out+implied-spread"])
@pytest.mark.parametrize("source", ["own", "profile"])
def test_every_bf16_lease(variant, source, spread, implied):
    got, stored = ct.fourteen_leases(variant, source, _floor(variant, spread, implied)), LEASES[variant, source]
    assert (got.signs_right, got.covered, got.points) == (stored["signs_right"], stored["covered"], stored["points"])
    assert got.medians == pytest.approx(stored["medians"], rel=1e-3, abs=1e-4)


def test_what_every_bf16_lease_says():
    """Over all fourteen bf16 leases the change is mixed: signs gain, coverage loses 5 points, and the profile it
    would refit predicts a little worse (run 1's n-gram, timed before the plan as it ships, goes more optimistic)."""
    before_own, before_profile = LEASES["as-shipped", "own"], LEASES["as-shipped", "profile"]
    after_own, after_profile = LEASES["off-graph-left-out+start-spread", "own"], LEASES[
        "off-graph-left-out+start-spread", "profile"]
    assert after_own["signs_right"] > before_own["signs_right"] and after_own["median"] < before_own["median"]
    assert after_profile["mean"] > before_profile["mean"] and after_profile["median"] > before_profile["median"]
    for after, before in ((after_own, before_own), (after_profile, before_profile)):
        assert before["covered"] - after["covered"] > 0.04 * before["points"]
    assert after_profile["medians"]["h200-vllm0.24"] > before_profile["medians"]["h200-vllm0.24"]
    # with the floor at the drafter's measured calibration-to-measurement spread, coverage comes back to within
    # 3.5 points, signs and errors as without it
    for source in ("own", "profile"):
        floored, before = LEASES["off-graph-left-out+implied-spread", source], LEASES["as-shipped", source]
        assert before["covered"] - 0.035 * before["points"] < floored["covered"] < before["covered"]
        assert floored["signs_right"] == LEASES["off-graph-left-out+start-spread", source]["signs_right"]
    assert TALLIES["off-graph-left-out+implied-spread"]["min_coverage"] > 0.85
