"""Catalogs: shipped entries, token-protected writes, Hugging Face config.json import."""
from __future__ import annotations

import io
import json

import pytest

GPUS = ["H100-SXM", "H200-SXM", "B200", "A100-80GB-SXM", "L40S", "RTX-PRO-6000-Blackwell", "RTX-3090",
        "RTX-3060", "MI300X"]
MODELS = ["llama-3.1-8b-instruct", "llama-3.2-1b-instruct", "llama-3.2-3b-instruct", "llama-3-70b-instruct",
          "llama-3.3-70b-instruct", "qwama-0.5b-instruct", "vicuna-7b-v1.3", "vicuna-68m", "qwen3-0.6b",
          "qwen3-1.7b", "qwen3-8b", "qwen3-32b", "smollm2-135m-instruct", "smollm2-360m-instruct",
          "smollm2-1.7b-instruct", "eagle-llama-3.1-8b", "eagle3-llama-3.1-8b"]

LLAMA_31_8B_CONFIG = {  # meta-llama/Llama-3.1-8B-Instruct config.json (abridged to what matters)
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "max_position_embeddings": 131072,
}

NEW_GPU = {"name": "TEST-GPU-1", "vendor": "acme", "gpu_class": "hopper", "memory_gb": 96,
           "hbm_bandwidth_gb_per_s": 4000, "bf16_tflops": 900, "fp8_tflops": 1800, "gpu_hour_usd": 2.5,
           "gpu_hour_usd_date": "2026-11-01", "source": "test datasheet"}


def test_shipped_catalog_has_every_required_name_with_sources(client):
    gpus = {g["name"]: g for g in client.get("/v1/gpus").get_json()}
    models = {m["name"]: m for m in client.get("/v1/models").get_json()}
    assert set(GPUS) <= set(gpus) and set(MODELS) <= set(models)
    assert all(g["source"] and g["gpu_hour_usd_date"] for g in gpus.values())
    assert all(m["source"] and m["tokenizer_family"] for m in models.values())
    h100 = gpus["H100-SXM"]
    assert h100["memory_gb"] == 80 and 3300 <= h100["hbm_bandwidth_gb_per_s"] <= 3400
    assert 980 <= h100["bf16_tflops"] <= 1000  # dense, not the 2x sparsity figure
    llama = models["llama-3.1-8b-instruct"]
    assert (llama["num_layers"], llama["num_kv_heads"], llama["head_dim"]) == (32, 8, 128)
    assert abs(llama["param_count"] - 8.03e9) / 8.03e9 < 0.01
    assert models["eagle-llama-3.1-8b"]["kind"] == "eagle_head"
    assert client.get("/v1/models?kind=eagle3_head").get_json()[0]["name"] == "eagle3-llama-3.1-8b"


def test_writes_need_a_token(client, auth):
    assert client.post("/v1/gpus", json=NEW_GPU).status_code == 401
    created = client.post("/v1/gpus", json=NEW_GPU, headers=auth)
    assert created.status_code == 201, created.get_json()
    assert client.post("/v1/gpus", json=NEW_GPU, headers=auth).status_code == 409
    changed = client.put("/v1/gpus/TEST-GPU-1", json={"gpu_hour_usd": 1.75, "gpu_hour_usd_date": "2026-11-30"},
                         headers=auth)
    assert changed.status_code == 200 and changed.get_json()["gpu_hour_usd"] == 1.75
    assert client.get("/v1/gpus/TEST-GPU-1").get_json()["gpu_hour_usd_date"] == "2026-11-30"
    assert client.put("/v1/gpus/TEST-GPU-1", json={"gpu_hour_usd": 1}).status_code == 401


@pytest.mark.parametrize("field,value", [("memory_gb", -1), ("bf16_tflops", "fast"), ("name", "has space"),
                                         ("gpu_hour_usd_date", "yesterday"), ("source", None)])
def test_bad_gpu_field_is_named(client, auth, field, value):
    response = client.post("/v1/gpus", json={**NEW_GPU, field: value}, headers=auth)
    assert response.status_code == 422 and field in response.get_json()["error"]["fields"]


def test_import_model_from_hf_config(client, auth):
    data = {"name": "my-llama-8b", "family": "llama-3", "tokenizer_family": "llama-3",
            "config": (io.BytesIO(json.dumps(LLAMA_31_8B_CONFIG).encode()), "config.json")}
    response = client.post("/v1/models/import", data=data, headers=auth, content_type="multipart/form-data")
    assert response.status_code == 201, response.get_json()
    model = response.get_json()
    assert (model["num_layers"], model["num_kv_heads"], model["head_dim"]) == (32, 8, 128)
    assert model["param_count"] == 8_030_261_248  # the published 8.03 B
    assert model["max_position_embeddings"] == 131_072  # the context window: vLLM's default --max-model-len
    # the imported model is usable as a target at once
    from tests.conftest import example_scenario

    rec = client.post("/v1/recommendations", json=example_scenario(
        target_model="my-llama-8b", speculator={"method": "ngram", "num_speculative_tokens": 3}))
    assert rec.status_code == 201, rec.get_json()


@pytest.mark.parametrize("payload,field", [(b"{oops", "config"), (b"[1, 2]", "config"),
                                           (json.dumps({"model_type": "llama"}).encode(), "config")])
def test_bad_config_json_is_named(client, auth, payload, field):
    data = {"name": "broken", "config": (io.BytesIO(payload), "config.json")}
    response = client.post("/v1/models/import", data=data, headers=auth, content_type="multipart/form-data")
    assert response.status_code == 422 and field in response.get_json()["error"]["fields"]


def test_import_without_file_names_the_field(client, auth):
    response = client.post("/v1/models/import", data={"name": "x"}, headers=auth,
                           content_type="multipart/form-data")
    assert response.status_code == 422 and "config" in response.get_json()["error"]["fields"]


def test_engine_profiles_list_what_ships_and_what_a_gpu_gets(client):
    """``GET /v1/engine-profiles``: the two measured profiles as they ship, with their fits in named units; with
    ``gpu``, the profile a scenario naming that version on that GPU is timed by, the same one its answer names
    (carried from the H100 with its EAGLE-3 head, the EAGLE head from the H200, on the A100); none for another
    vendor; bad input named."""
    shipped = {p["name"]: p for p in client.get("/v1/engine-profiles").get_json()}
    assert set(shipped) == {"H200-SXM × vLLM 0.24", "H100-SXM × vLLM 0.24"}
    h100 = shipped["H100-SXM × vLLM 0.24"]
    assert (h100["gpu"], h100["applied_to"], h100["drafters"], h100["drafters_carried"]) == (
        "H100-SXM", "H100-SXM", ["llama-3.2-1b-instruct", "eagle3-llama-3.1-8b"], {})
    assert 0.5 < h100["step_time"]["fixed_overhead_ms"] < 0.8 and 0.8 < h100["step_time"]["bandwidth_efficiency"] < 0.84
    assert "h100-vllm0.24-kv/kv-auto.jsonl" in h100["source"]
    (a100,) = client.get("/v1/engine-profiles?gpu=A100-80GB-SXM&vllm_version=0.24.1").get_json()
    assert (a100["name"], a100["applied_to"]) == ("H100-SXM × vLLM 0.24 → A100-80GB-SXM", "A100-80GB-SXM")
    assert a100["drafters_carried"] == {"eagle-llama-3.1-8b": "H200-SXM × vLLM 0.24 → A100-80GB-SXM"}
    assert "eagle3-llama-3.1-8b" in a100["drafters"]  # the H100's own fit of the head, carried with its profile
    answer = client.post("/v1/recommendations", json={
        "gpu": "A100-80GB-SXM", "target_model": "llama-3.1-8b-instruct", "vllm_version": "0.24",
        "speculator": {"method": "eagle3", "draft_model": "eagle3-llama-3.1-8b"},
        "workload": {"prompt_tokens": 512, "output_tokens": 256, "temperature": 0.0, "structure": "code",
                     "concurrency": 4}}).get_json()
    assert answer["engine_profile"] == {k: a100[k] for k in answer["engine_profile"]}
    assert client.get("/v1/engine-profiles?gpu=MI300X").get_json() == []
    assert client.get("/v1/engine-profiles?vllm_version=0.23").get_json() == []
    for query, field in (("gpu=nope", "gpu"), ("vllm_version=latest", "vllm_version")):
        r = client.get(f"/v1/engine-profiles?{query}")
        assert r.status_code == 422 and field in r.get_json()["error"]["fields"]
