"""The planner's simulation against vLLM's OpenAI server driven by `vllm bench serve`: one short rate (CI).

The full validation (three rates, with and without n-gram speculation, a fresh calibration) is
`benchmarks/serving.py`; its table is in docs/planner.md. Here: the benchmark's own calibration on this host (the
product's probes of the target alone -- steps, prefill, KV capacity: no verify, n-gram or acceptance engine, which a
server without speculation does not need; 2-5 min), the closed-loop serving probe (the front end's cost on the shared cores), one light rate,
the server without speculation, and the simulation fed with the run's arrivals and lengths.
"""
from __future__ import annotations

import argparse

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.vllm


def _native_bf16() -> bool:
    """AVX-512 on this CPU: vLLM's CPU build runs the bf16 stand-in natively, not emulated."""
    try:
        with open("/proc/cpuinfo") as f:
            return " avx512f" in f.read()
    except OSError:
        return True

# One short run (16 requests; p90 is the second largest) on 2 shared cores; the benchmark's target is 15 %. It
# calibrates on this host: simulated from the calibration stored from another day's host, clean-clone CIs on
# 2026-12-01 missed by TPOT p50 -19 % on one machine and +41 % on another (the hosts' steps differ by that much).
CI_TOLERANCE = {"ttft_p50": 0.35, "tpot_p50": 0.35, "ttft_p90": 0.5, "tpot_p90": 0.5}


# ~190 s here. The bound only guards against a hang: clean-clone CIs ran out of 600 s (2026-12-01, a host ~1.7x
# slow) and of 1800 s (2026-12-02, before waiting for quiet was bounded: calibration.contention).
@pytest.mark.timeout(1800)
@pytest.mark.skipif(not _native_bf16(), reason="AVX2-only CPU: vLLM's CPU build emulates bf16 and its steps drift "
                    "between calibration and serve (2026-12-03, AMD EPYC: TTFT p50 +77 %, the 15 % target's CI "
                    "tolerance 35 %)")
def test_simulated_percentiles_follow_vllm_bench_serve(smollm2_path, tmp_path):
    from benchmarks import serving

    parser = argparse.ArgumentParser()
    serving.add_cli_args(parser)
    args = parser.parse_args(["--model", str(smollm2_path), "--modes", "baseline", "--rates", "1",
                              "--num-prompts", "16", "--output-len", "64", "--cpu-lock", "", "--attempts", "1", "--probe-concurrency", "1,16",
                              "--max-wait-quiet", "30", "--workdir", str(tmp_path)])
    result = serving.run(args)
    (row,) = result.rows
    assert row.requests == 16
    assert all(v > 0 for v in row.measured_ms.values())
    assert result.calibration["frontend"]["baseline"]["frontend_s_per_step"] >= 0.0
    for key, error in row.errors.items():
        assert abs(error) <= CI_TOLERANCE[key], (key, row.measured_ms, row.simulated_ms)
