"""The GPU open loop (benchmarks/data/h100-vllm0.24-open-loop, two calls on one H100 lease): what one vLLM 0.24 server
sustains under Poisson arrivals above its capacity, against the product's two readings of the same workload."""
from __future__ import annotations

import statistics

import pytest

from advisor import create_app
from benchmarks import gpu_open_loop as gol
from benchmarks.gpu_closed_loop import REPO_ROOT, catalog_gpu

RUNS = [REPO_ROOT / "benchmarks" / "data" / "h100-vllm0.24-open-loop" / name for name in ("first", "second")]


@pytest.fixture(scope="module")
def app():
    return create_app({"SQLALCHEMY_DATABASE_URI": "sqlite://", "REDIS_URL": ""})


def _engines() -> list[tuple[str, list[dict]]]:
    out = []
    for run in RUNS:
        rows = gol.load_rows(run)
        for label in dict.fromkeys(r["engine"] for r in rows):
            out.append((f"{run.name}/{label}", [r for r in rows if r["engine"] == label]))
    return out


def test_the_runs_served_as_an_answers_command_at_a_known_acceptance():
    """vLLM 0.24 on an H100, the answer's scheduler limits, every phase complete; the overload phase kept a queue
    (max_num_seqs bound: its requests waited seconds for a first token); the synthetic acceptance held (AL
    1 + 0.7 + 0.49 + 0.343 = 2.533, from vLLM's counters)."""
    engines = _engines()
    assert {name for name, _ in engines} == {"first/baseline", "first/eagle3-k3", "second/baseline",
                                              "second/ngram-k3"}
    for name, rows in engines:
        first = rows[0]
        assert first["gpu_name"].startswith("NVIDIA H100") and first["vllm_version"] == "0.24.0", name
        assert (first["max_num_seqs"], first["max_num_batched_tokens"]) == (256, 8192)
        assert {r["phase"] for r in rows} == {"overload", "0.5x", "0.8x"}
        over = next(r for r in rows if r["phase"] == "overload")
        assert all(q["output_tokens"] == 300 for r in rows for q in r["requests"])
        assert gol.sustained_rps(over["requests"]) == pytest.approx(over["sustained_rps"])
        c = over["counters"]
        if first["method"]:
            al = 1 + c["vllm:spec_decode_num_accepted_tokens"] / c["vllm:spec_decode_num_drafts"]
            assert al == pytest.approx(2.533, abs=0.01), name


def test_one_server_sustains_what_the_planner_and_the_answer_say(app):
    """The planner's capacity and ``predict``'s saturated rate come within 6 % of what vLLM sustained (20.1-20.3
    req/s without speculation, 22.5 with EAGLE-3, 21.2 with n-gram; EAGLE-3 +5.1 and +4.6 % since the heads' fits
    leave the per-sequence cost free, +4.5 and +4.7 % before). ``predict`` had charged each request the
    others' prompts as compute added to its decode: 17.3, 19.6 and 18.5 req/s (13-15 % low); the prompts now ride in
    its decode steps under one roofline, as the planner's step clock has them. A known miss: the answer for the
    baseline engine (a scenario naming no speculator) is its best candidate's, EAGLE-3's, whose baseline side the
    head's engine fit prices; that fit prices a plain step of 256 sequences 10-11 % fast (in sample, on both GPUs),
    so the rate it quotes without speculation is 13 % high (14-15 % before the heads' per-sequence cost was fitted;
    docs/gpu-closed-loop.md, "An open loop")."""
    with app.app_context():
        for name, rows in _engines():
            over = next(r for r in rows if r["phase"] == "overload")
            first = rows[0]
            engine = gol.Engine(first["engine"], first["method"], first["k"], first["drafter"])
            fraction = gol.measured_draft_fraction(over) if engine.method == "ngram" else None
            got = gol.product_readings(engine, catalog_gpu(first["gpu_name"]), 1000, 300, fraction)
            measured = over["sustained_rps"]
            assert got["planner_capacity_rps"] == pytest.approx(measured, rel=0.06), name
            if engine.method:
                assert got["predict_sustained_rps"] == pytest.approx(measured, rel=0.06), name
                assert got["predict_sustained_rps"] == pytest.approx(got["planner_capacity_rps"], rel=0.05), name
            else:
                assert 1.10 < got["predict_sustained_rps"] / measured < 1.15, name


def test_below_capacity_the_answers_latency_follows_the_prompts_riding_in_the_decode(app):
    """At half the sustained rate the answer's mean request latency comes within 30 % of vLLM's (3.1 s without
    speculation, 1.6 s with EAGLE-3, 1.5 s with n-gram; now +1, -2 and +28 %). Charging each request the others'
    prompts as added compute had read +32, +19 and +44 %."""
    with app.app_context():
        for name, rows in _engines():
            first = rows[0]
            engine = gol.Engine(first["engine"], first["method"], first["k"], first["drafter"])
            over = next(r for r in rows if r["phase"] == "overload")
            fraction = gol.measured_draft_fraction(over) if engine.method == "ngram" else None
            half = next(r for r in rows if r["phase"] == "0.5x")
            measured_ms = statistics.mean(q["done_s"] - q["arrival_s"] for q in half["requests"]) * 1e3
            got = gol.predicted_latency_ms(engine, catalog_gpu(first["gpu_name"]), 1000, 300, half["rate_rps"],
                                           fraction)
            assert got == pytest.approx(measured_ms, rel=0.30), name
