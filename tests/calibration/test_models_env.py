"""Model preparation helpers and the CPU engine environment (no engine)."""

from __future__ import annotations

import json

import pytest

from calibration import models
from calibration.vllm_cpu import env as cpu_env


def _fake_checkpoint(path, layers=3):
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    path.mkdir()
    tensors = {"model.embed_tokens.weight": torch.zeros(10, 4), "model.norm.weight": torch.ones(4)}
    for i in range(layers):
        tensors[f"model.layers.{i}.mlp.up_proj.weight"] = torch.full((4, 4), float(i))
    st.save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"num_hidden_layers": layers, "hidden_size": 4, "vocab_size": 10}))
    (path / "tokenizer.json").write_text("{}")
    return path


def test_truncated_copy_keeps_first_layers(tmp_path):
    from safetensors.torch import load_file

    src = _fake_checkpoint(tmp_path / "src")
    dst = models.make_truncated_copy(src, 2, tmp_path / "dst")
    keys = set(load_file(str(dst / "model.safetensors")))
    assert "model.layers.1.mlp.up_proj.weight" in keys and "model.layers.2.mlp.up_proj.weight" not in keys
    assert {"model.embed_tokens.weight", "model.norm.weight"} <= keys
    assert json.loads((dst / "config.json").read_text())["num_hidden_layers"] == 2
    assert (dst / "tokenizer.json").exists() and models.is_ready(dst)
    with pytest.raises(ValueError):
        models.make_truncated_copy(src, 4, tmp_path / "bad")


def test_dummy_shape_writes_config_and_tokenizer(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text(json.dumps({"num_hidden_layers": 30, "hidden_size": 576, "vocab_size": 10}))
    (base / "tokenizer.json").write_text("{}")
    dst = models.make_dummy_shape(models.DUMMY_SHAPES["llama-1b"], tmp_path / "d", base=base)
    cfg = json.loads((dst / "config.json").read_text())
    assert cfg["hidden_size"] == 2048 and cfg["num_hidden_layers"] == 22 and cfg["vocab_size"] == 10
    assert (dst / "tokenizer.json").exists()


def test_eagle3_shape_embeds_the_targets_vocabulary():
    """An EAGLE-3 head's catalog row carries its draft vocabulary (32k) as vocab_size; vLLM's Eagle3LlamaForCausalLM
    embeds the target's tokens (vocab_size) and proposes from draft_vocab_size, so the shape must say both."""
    from benchmarks.gpu_closed_loop import catalog_row

    rows = {name: catalog_row(name) for name in ("eagle3-llama-3.1-8b", "eagle-llama-3.1-8b")}
    eagle3 = models.shape_config(rows["eagle3-llama-3.1-8b"])
    assert eagle3["vocab_size"] == 128256 and eagle3["draft_vocab_size"] == 32000
    assert eagle3["num_hidden_layers"] == 1 and eagle3["hidden_size"] == 4096
    assert "draft_vocab_size" not in models.shape_config(rows["eagle-llama-3.1-8b"])


def test_prepare_is_idempotent_when_marker_present(tmp_path, monkeypatch):
    target = tmp_path / "m"
    target.mkdir()
    (target / models.MARKER).write_text("{}")
    monkeypatch.setattr(models, "download_smollm2_gguf", lambda *a: pytest.fail("must not download"))
    assert models.prepare_smollm2(target) == target


def test_cache_root_env(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECADVISOR_MODEL_CACHE", str(tmp_path))
    assert models.model_cache_root() == tmp_path


def test_cpu_engine_env(monkeypatch):
    monkeypatch.setattr(cpu_env, "find_tcmalloc", lambda: "/lib/tc.so")
    monkeypatch.setattr(cpu_env, "find_iomp", lambda prefix=None: "/venv/lib/libiomp5.so")
    e = cpu_env.cpu_engine_env(kv_cache_space_gib=3, base={"LD_PRELOAD": "/x.so"})
    assert e["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0" and e["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert e["LD_PRELOAD"] == "/lib/tc.so:/venv/lib/libiomp5.so:/x.so"
    e = cpu_env.cpu_engine_env(kv_cache_space_gib=None, base={}, preload=False)
    assert "VLLM_CPU_KVCACHE_SPACE" not in e and "LD_PRELOAD" not in e
