"""TCO arithmetic, decision rules and the dynamic-SD table format."""
from __future__ import annotations

import math

import numpy as np
import pytest

from advisor import costmodel as cm
from advisor.costmodel.decision import DecisionInput
from advisor.costmodel.tco import best_operating_point, gpus_needed, tco_report, usd_per_million_tokens


def test_usd_per_million_tokens():
    # $3/GPU-h, 1 GPU, 1000 tok/s → 3.6M tok/h → $0.8333 per 1M
    assert usd_per_million_tokens(3.0, 1, 1000.0) == pytest.approx(3.0 / 3.6)
    assert usd_per_million_tokens(3.0, 4, 1000.0) == pytest.approx(4 * 3.0 / 3.6)
    assert math.isinf(usd_per_million_tokens(3.0, 1, 0.0))


def test_gpus_needed_rounds_up_replicas_times_tp():
    assert gpus_needed(10_000, 3_000, 1) == 4
    assert gpus_needed(9_000, 3_000, 1) == 3
    assert gpus_needed(10_000, 3_000, 4) == 16


def test_operating_point_respects_slo_and_memory():
    conc = np.array([1, 8, 64, 256], dtype=float)
    thr = np.array([100, 700, 3000, 6000], dtype=float)
    tpot = np.array([10, 11, 20, 40], dtype=float)
    lat = tpot * 100
    ttft = np.full(4, 50.0)
    assert best_operating_point(conc, thr, tpot, lat, ttft, 512, None).concurrency == 256
    assert best_operating_point(conc, thr, tpot, lat, ttft, 100, None).concurrency == 64
    assert best_operating_point(conc, thr, tpot, lat, ttft, 512, cm.Slo(tpot_ms=15)).concurrency == 8
    assert best_operating_point(conc, thr, tpot, lat, ttft, 512, cm.Slo(tpot_ms=5)) is None


def test_tco_monthly_and_savings():
    from advisor.costmodel.tco import OperatingPoint
    points = {"baseline": OperatingPoint(64, 2000, 20, 5000), "speculative": OperatingPoint(64, 3000, 13, 3300)}
    rep = tco_report(2.0, 1, 730.0, {"baseline": 2000, "speculative": 3000}, points, 9000).to_dict()
    assert rep["gpus_needed"] == {"baseline": 5, "speculative": 3}
    assert rep["monthly_usd"] == {"baseline": 5 * 730 * 2.0, "speculative": 3 * 730 * 2.0}
    assert rep["monthly_savings_usd"] == pytest.approx(2 * 730 * 2.0)
    assert rep["usd_per_million_output_tokens"]["speculative"] == pytest.approx(2.0 / (3000 * 3600) * 1e6)


@pytest.mark.parametrize(("low", "high", "fits", "errors", "outside", "expected"), [
    (1.10, 1.50, True, (), (), "go"),
    (1.05, 1.50, True, (), (), "go"),  # threshold is inclusive
    (0.95, 1.30, True, (), (), "calibrate"),  # straddles
    (0.70, 1.04, True, (), (), "no-go"),
    (1.20, 1.50, False, (), (), "no-go"),  # drafter doesn't fit
    (1.20, 1.50, True, ("tokenizer mismatch",), (), "no-go"),
    (1.20, 1.50, True, (), ("concurrency 300 > calibrated max batch 64",), "calibrate"),
    (0.60, 0.90, True, (), ("concurrency 300 > calibrated max batch 64",), "no-go"),  # clear no-go stays (issue 9)
    (0.95, 1.30, True, (), ("concurrency 300 > calibrated max batch 64",), "calibrate"),
    (0.60, 0.90, False, (), ("concurrency 300 > calibrated max batch 64",), "no-go"),  # but memory is hard
])
def test_decision_rules(low, high, fits, errors, outside, expected):
    decision, reasons = cm.decide(DecisionInput(low, high, fits, errors, outside))
    assert decision == expected and reasons
    assert cm.GO_THRESHOLD == 1.05


def test_dynamic_table_format():
    points = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    ks = [4, 4, 4, 3, 3, 2, 1, 1, 1]
    gains = [1.6, 1.6, 1.5, 1.4, 1.3, 1.1, 1.02, 0.9, 0.8]
    table = cm.dynamic_table(points, ks, gains)
    assert table == [[1, 7, 4], [8, 31, 3], [32, 63, 2], [64, 127, 1], [128, 512, 0]]
    # contiguous, non-overlapping bands covering 1..512
    assert table[0][0] == 1 and table[-1][1] == 512
    assert all(a[1] + 1 == b[0] for a, b in zip(table, table[1:]))
