"""Probe runner pieces that need no vLLM engine."""

from __future__ import annotations

import json
from dataclasses import asdict

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
