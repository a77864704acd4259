"""docs/planner.md "What the model still misses": the n-gram diagnostics on stored data (benchmarks/ngram_cost.py)."""
from __future__ import annotations

import statistics

import pytest

from tests.conftest import REPO

RUN_C = REPO / "benchmarks/data/serving-run-c"


def test_n_gram_cycle_probes_ran_more_engine_steps_than_counted_cycles():
    from benchmarks.ngram_cost import cycle_rows

    rows = {r.batch: r for r in cycle_rows(RUN_C)}
    assert sorted(rows) == [1, 2, 4, 8, 16]
    # alone, the counted cycles are the engine's steps but for the drafts accepted past max_tokens
    assert rows[1].engine_steps / rows[1].mean_cycles == pytest.approx(1.10, abs=0.01)
    assert rows[1].model_error == pytest.approx(0.035, abs=0.005)
    for b in (2, 4, 8, 16):  # a batch drains: the fit misses fast at the probe's batch, slow over the engine steps
        assert rows[b].engine_steps / rows[b].mean_cycles > 1.7
        assert rows[b].model_error < -0.10 < 0.0 < rows[b].drained_error
    assert rows[4].model_error == pytest.approx(-0.366, abs=0.005)
    assert rows[16].engine_steps / rows[16].mean_cycles == pytest.approx(2.52, abs=0.01)


def test_first_tokens_at_an_idle_server_were_slower_in_the_light_n_gram_run():
    from benchmarks.ngram_cost import idle_rows

    rows = {r.label: r for r in idle_rows(RUN_C)}
    median = {label: statistics.median(t for _, t in rows[label].ttft_ms)
              for label in ("baseline-0.3x", "ngram-0.3x", "probe-ngram-c1")}
    assert (len(rows["baseline-0.3x"].ttft_ms), len(rows["ngram-0.3x"].ttft_ms)) == (13, 9)
    assert median == pytest.approx({"baseline-0.3x": 66.2, "ngram-0.3x": 79.4, "probe-ngram-c1": 61.8}, abs=0.1)
    # the n-gram server's first request waited for numba's compile of the lookup
    assert dict(rows["probe-ngram-c1"].ttft_ms)[54] > 1000


def test_a_uniformly_slower_host_accounts_for_the_middle_runs_misses():
    from benchmarks.ngram_cost import slower_rows
    from benchmarks.serving import TARGET_ERROR

    def within(rows):
        return {(r.mode, round(r.load, 1)): sum(abs(e) <= TARGET_ERROR for e in r.errors.values()) for r in rows}

    same, slow = within(slower_rows(RUN_C, 1.0)), within(slower_rows(RUN_C, 1.2))
    assert sum(same.values()) == 12  # the re-analysis itself (docs/planner.md, test_serving_reanalysis.py)
    middle = (("ngram", 0.3), ("ngram", 0.7), ("baseline", 0.7))
    assert [same[m] for m in middle] == [0, 0, 1] and [slow[m] for m in middle] == [4, 2, 4]
    assert slow[("baseline", 0.3)] < same[("baseline", 0.3)] and slow[("baseline", 1.0)] < same[("baseline", 1.0)]
