"""docs/planner.md's run B, simulated again from its stored measurements (no vLLM): the table's figures."""
from __future__ import annotations

import argparse

import pytest

from tests.conftest import REPO


def test_run_b_reanalysed_gives_the_documented_table():
    from benchmarks import serving

    parser = argparse.ArgumentParser()
    serving.add_cli_args(parser)
    result = serving.run(parser.parse_args(["--reanalyse", str(REPO / "benchmarks/data/serving-run-b")]))
    rows = {(r.mode, r.rate): r for r in result.rows}
    assert len(rows) == 6 and result.within_target == 12 and result.cells == 24
    light = rows[("baseline", 0.5)]
    assert light.measured_ms["tpot_p50"] == pytest.approx(42.9, abs=0.05)
    assert light.simulated_ms["tpot_p50"] == pytest.approx(39.0, abs=0.05)
    saturated = rows[("baseline", 3.0)]
    assert saturated.errors["ttft_p50"] == pytest.approx(0.14, abs=0.005)
    assert saturated.errors["tpot_p50"] == pytest.approx(-0.02, abs=0.005)
    front = result.calibration["frontend"]["baseline"]
    assert front["frontend_s_per_step"] == pytest.approx(0.0101, abs=1e-4)
    assert front["frontend_latency_s"] == pytest.approx(0.090, abs=1e-3)
