"""docs/planner.md's run C, simulated again from its stored measurements (no vLLM): the table's figures."""
from __future__ import annotations

import argparse

import pytest

from tests.conftest import REPO


def test_run_c_reanalysed_gives_the_documented_table():
    from benchmarks import serving

    parser = argparse.ArgumentParser()
    serving.add_cli_args(parser)
    result = serving.run(parser.parse_args(["--reanalyse", str(REPO / "benchmarks/data/serving-run-c")]))
    rows = {(r.mode, round(r.load, 1)): r for r in result.rows}
    baseline = [r for r in result.rows if r.mode == "baseline"]
    assert len(rows) == 6 and all(r.requests == 120 for r in result.rows)
    assert result.within_target == 10 and result.cells == 24
    assert sum(abs(e) <= serving.TARGET_ERROR for r in baseline for e in r.errors.values()) == 8
    light = rows[("baseline", 0.3)]
    assert light.rate == pytest.approx(1.049, abs=1e-3)
    assert light.measured_ms["tpot_p50"] == pytest.approx(25.3, abs=0.05)
    assert light.simulated_ms["tpot_p50"] == pytest.approx(27.2, abs=0.05)
    knee = rows[("baseline", 1.0)]
    assert knee.measured_ms["ttft_p90"] == pytest.approx(667, abs=0.5)
    assert knee.errors["ttft_p90"] == pytest.approx(1.30, abs=0.005)
    assert rows[("ngram", 1.0)].rate == pytest.approx(3.755, abs=1e-3)
    assert rows[("ngram", 1.0)].errors["ttft_p50"] == pytest.approx(0.669, abs=0.005)
    front = result.calibration["frontend"]["baseline"]
    assert front["frontend_s_per_step"] == pytest.approx(0.0039, abs=1e-4)
    assert front["frontend_latency_s"] == pytest.approx(0.0196, abs=1e-4)
