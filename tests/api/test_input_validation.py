"""Bad input of every field: a 422 in the one envelope, naming the field; never a 500."""
from __future__ import annotations

import json

import copy

import pytest

from tests.conftest import example_scenario


def _set(body: dict, path: str, value) -> dict:
    body = copy.deepcopy(body)
    *parents, leaf = path.split(".")
    node = body
    for key in parents:
        node = node.setdefault(key, {})
    if value is _DELETE:
        node.pop(leaf, None)
    else:
        node[leaf] = value
    return body


_DELETE = object()

# (path to change, new value, field the error must name)
CASES = [
    ("gpu", "H900-XL", "gpu"), ("gpu", 7, "gpu"), ("gpu", _DELETE, "gpu"), ("gpu", "", "gpu"),
    ("gpu_count", 0, "gpu_count"), ("gpu_count", "2", "gpu_count"), ("gpu_count", 1.5, "gpu_count"),
    ("target_model", "gpt-9", "target_model"), ("target_model", None, "target_model"),
    ("weights_dtype", "fp4", "weights_dtype"), ("kv_cache_dtype", "int4", "kv_cache_dtype"),
    ("kv_cache_dtype", None, "kv_cache_dtype"),
    ("speculator", _DELETE, "speculator"), ("speculator", "eagle", "speculator"),
    ("speculator.method", "telepathy", "speculator.method"),
    ("speculator.draft_model", _DELETE, "speculator.draft_model"),
    ("speculator.draft_model", "no-such-draft", "speculator.draft_model"),
    ("speculator.draft_model", "qwen3-0.6b", "speculator.draft_model"),  # tokenizer differs from llama's
    ("speculator.num_speculative_tokens", 0, "speculator.num_speculative_tokens"),
    ("speculator.num_speculative_tokens", 17, "speculator.num_speculative_tokens"),
    ("speculator.num_speculative_tokens", "3", "speculator.num_speculative_tokens"),
    ("workload", _DELETE, "workload"),
    ("workload.prompt_tokens", -1, "workload.prompt_tokens"),
    ("workload.prompt_tokens", "long", "workload.prompt_tokens"),
    ("workload.prompt_tokens", _DELETE, "workload.prompt_tokens"),
    ("workload.output_tokens", 0, "workload.output_tokens"),
    ("workload.output_tokens", 2.5, "workload.output_tokens"),
    ("workload.temperature", 2.5, "workload.temperature"), ("workload.temperature", -0.1, "workload.temperature"),
    ("workload.temperature", "hot", "workload.temperature"), ("workload.temperature", "NaN", "workload.temperature"),
    ("workload.structure", "poetry", "workload.structure"), ("workload.structure", _DELETE, "workload.structure"),
    ("workload.concurrency", 0, "workload.concurrency"), ("workload.concurrency", _DELETE, "workload.concurrency"),
    ("workload.requests_per_second", 2.0, "workload.requests_per_second"),  # both given
    ("workload.colour", "blue", "workload.colour"),
    ("acceptance.mean_acceptance_length", 0.5, "acceptance.mean_acceptance_length"),
    ("acceptance.mean_acceptance_length", 3.5, "acceptance.mean_acceptance_length"),  # > k+1 = 3
    ("acceptance.acceptance_rate", 1.5, "acceptance.acceptance_rate"),
    ("acceptance.draft_fraction", 0.0, "acceptance.draft_fraction"),
    ("acceptance.per_position", [0.5, float("nan")], "acceptance.per_position.1"),
    ("acceptance.per_position", [0.5, 0.7], "acceptance.per_position"),
    ("acceptance.per_position", [1.5], "acceptance.per_position.0"),
    ("gpu_hour_usd", -3, "gpu_hour_usd"), ("gpu_hour_usd", "cheap", "gpu_hour_usd"),
    ("vram_gb", 0, "vram_gb"), ("gpu_memory_utilization", 1.5, "gpu_memory_utilization"),
    ("slo.tpot_ms", -1, "slo.tpot_ms"), ("slo.latency_ms", "soon", "slo.latency_ms"),
    ("load.requests_per_second", -2, "load.requests_per_second"),
    ("load", {}, "load.requests_per_second"),
    ("hours_per_month", 0, "hours_per_month"),
    ("gpus", "H100-SXM", "gpus"),  # misspelt top-level field
]


@pytest.mark.parametrize("path,value,field", CASES, ids=[f"{c[0]}={c[1]!r}"[:60] for c in CASES])
def test_bad_field_is_a_422_naming_it(client, path, value, field):
    body = json.dumps(_set(example_scenario(), path, value))  # NaN as the literal some clients send
    response = client.post("/v1/recommendations", data=body, content_type="application/json")
    assert response.status_code == 422, response.get_json()
    error = response.get_json()["error"]
    assert error["code"] == "validation_error"
    assert field in error["fields"], error
    assert field.split(".")[-1] in error["message"] or field in error["message"]


def test_rps_instead_of_concurrency_is_accepted(client):
    body = _set(_set(example_scenario(), "workload.concurrency", _DELETE), "workload.requests_per_second", 2.0)
    assert client.post("/v1/recommendations", json=body).status_code == 201


@pytest.mark.parametrize("payload,content_type", [
    ("{not json", "application/json"), ("[]", "application/json"), ("null", "application/json"),
    ("", "application/json"), ("gpu=H100", "application/x-www-form-urlencoded"), ("\x00\xff", "text/plain"),
])
def test_malformed_bodies_are_4xx_envelopes(client, payload, content_type):
    response = client.post("/v1/recommendations", data=payload, content_type=content_type)
    assert 400 <= response.status_code < 500, response.data
    assert "error" in response.get_json()


def test_nothing_is_stored_for_a_rejected_request(client):
    client.post("/v1/recommendations", json=_set(example_scenario(), "workload.temperature", 9))
    assert client.get("/v1/recommendations").get_json() == []


def test_unknown_route_and_method_use_the_envelope(client):
    assert client.get("/v1/nope").get_json()["error"]["status"] == 404
    assert client.delete("/v1/recommendations").get_json()["error"]["status"] == 405


@pytest.mark.parametrize("method,url,body,field", [
    ("post", "/v1/recommendations", {"gpu": "H100\u0000"}, "gpu"),
    ("post", "/v1/recommendations", {"workload": {"structure": "sql\u0000"}}, "workload.structure"),
    ("get", "/v1/gpus/a%00b", None, "name"),
    ("get", "/v1/recommendations?gpu=a%00b", None, "gpu"),
    ("post", "/v1/gpus", {"vendor": "acme\u0000"}, "vendor"),
    ("post", "/v1/recommendations", {"target_model": "\ud800"}, "target_model"),  # a lone surrogate
    ("put", "/v1/gpus/H100-SXM", {"vendor": "\udfff"}, "vendor"),
])
def test_unstorable_text_is_a_422_not_a_database_error(client, auth, method, url, body, field):
    """PostgreSQL text cannot hold NUL, and no database takes a lone surrogate: both backends answer the same."""
    response = getattr(client, method)(url, json=body, headers=auth)
    assert response.status_code == 422, response.get_json()
    assert field in response.get_json()["error"]["fields"]


@pytest.mark.parametrize("speculator", [{"method": "mtp"}, {"method": "mtp", "num_speculative_tokens": 1}])
def test_a_method_the_target_cannot_run_is_a_422_naming_it(client, speculator):
    """Issue 9: MTP on Llama-3.1-8B (no MTP layers) answered 'go 1.56×'."""
    response = client.post("/v1/recommendations", json=example_scenario(speculator=speculator, acceptance=None))
    assert response.status_code == 422
    assert "speculator.method" in response.get_json()["error"]["fields"]


@pytest.mark.parametrize("raw", [
    b'{"gpu": "H100\xed\xa0\x80"}',  # a lone surrogate as raw bytes (JSON's decoder passes surrogates through)
    '{"gpu": "H100\ud800"}'.encode("utf-16", "surrogatepass"),  # a UTF-16 body: not ASCII, no backslash escape
    b'{"gpu": "\xc3\xa9", "target_model": "\\ud800"}',  # non-ASCII and an escape
])
def test_unstorable_text_in_raw_bodies_is_a_422(client, raw):
    """Bodies of plain ASCII without a backslash-u escape skip the walk for unstorable strings; these must not."""
    response = client.post("/v1/recommendations", data=raw, content_type="application/json")
    assert response.status_code == 422, response.get_json()
    assert {"gpu", "target_model"} & set(response.get_json()["error"]["fields"])


@pytest.mark.parametrize("query,kw,field", [
    ("", {"data": "note=a%00b", "content_type": "application/x-www-form-urlencoded"}, "note"),
    ("", {"data": b'{"note": "a\\u0000b"}', "content_type": "application/json"}, "note"),
    ("?gpu=x&page=2&gpu=a%00b", {}, "gpu"),
    ("?a%00b=1", {}, "a\x00b"),
])
def test_a_get_carries_no_unstorable_text_anywhere(client, query, kw, field):
    """Reads skip the walk where nothing can hold NUL or a lone surrogate (no Content-Type: no form and no JSON
    body; a query of plain ASCII without a percent escape); a string that can is still found, in a form, a JSON body
    or any repeated query value of a GET."""
    response = client.get(f"/v1/recommendations/1{query}", **kw)
    assert response.status_code == 422, response.get_json()
    assert field in response.get_json()["error"]["fields"]


@pytest.mark.parametrize("value", [0.0, 1, "yes", "false", None])
def test_a_boolean_field_takes_only_json_true_or_false(client, auth, value):
    """Schemathesis (random seeds) sent ``"tie_word_embeddings": 0.0`` and got a 201: marshmallow's Boolean takes
    1, 0.0, "yes" and "off", where the OpenAPI document says boolean."""
    model = {"name": "Tiny-bool", "family": "x", "num_layers": 1, "hidden_size": 64, "num_attention_heads": 1,
             "num_kv_heads": 1, "head_dim": 64, "intermediate_size": 128, "vocab_size": 100, "param_count": 10**5,
             "tokenizer_family": "x", "tokenizer_vocab_size": 100, "source": "test"}
    response = client.post("/v1/models", headers=auth, json={**model, "tie_word_embeddings": value})
    assert response.status_code == 422 and "tie_word_embeddings" in response.get_json()["error"]["fields"]
    response = client.post("/v1/calibrations", headers=auth, json={
        "hardware": "H100-SXM", "target_model": "llama-3.1-8b-instruct", "external": True,
        "pool_earlier_runs": value})
    assert response.status_code == 422 and "pool_earlier_runs" in response.get_json()["error"]["fields"]
    assert client.post("/v1/models", headers=auth, json={**model, "tie_word_embeddings": True}).status_code == 201


@pytest.mark.parametrize("change,field", [
    ({"bf16_tflops": "3600"}, "bf16_tflops"),  # schemathesis (random seeds): a numeric string was a 201
    ({"gpu_hour_usd": "0.4"}, "gpu_hour_usd"),
    ({"gpu_hour_usd_date": "9591-89-38"}, "gpu_hour_usd_date"),  # the pattern's digits, no such day
])
def test_a_gpu_takes_json_numbers_and_calendar_dates(client, auth, change, field):
    gpu = {"name": "Strict-1", "vendor": "x", "gpu_class": "hopper", "memory_gb": 80, "hbm_bandwidth_gb_per_s": 3000,
           "bf16_tflops": 900, "gpu_hour_usd": 2.0, "gpu_hour_usd_date": "2026-02-28", "source": "test"}
    response = client.post("/v1/gpus", headers=auth, json={**gpu, **change})
    assert response.status_code == 422 and field in response.get_json()["error"]["fields"]
    assert client.post("/v1/gpus", headers=auth, json=gpu).status_code == 201


def test_a_scenario_number_given_as_a_string_is_a_422(client):
    response = client.post("/v1/recommendations", json=example_scenario(workload={
        "prompt_tokens": 512, "output_tokens": 256, "temperature": "0.5", "structure": "prose", "concurrency": 8}))
    assert response.status_code == 422 and "workload.temperature" in response.get_json()["error"]["fields"]


@pytest.mark.parametrize("query", ["created_after=0001-01-01T00%3A00%3A04%2B06%3A00",  # the year 0 in UTC
                                   "created_before=9999-12-31T23%3A59%3A59-01%3A00"])  # the year 10000
def test_an_instant_utc_cannot_hold_is_a_422_naming_it(client, query):
    """Schemathesis (random seeds): a 500 (OverflowError where the database compares instants in UTC)."""
    for path in ("/v1/recommendations", "/v1/recommendations?after_id=5", "/v1/recommendations/export"):
        response = client.get(f"{path}{'&' if '?' in path else '?'}{query}")
        assert response.status_code == 422, (path, response.get_json())
        assert query.split("=")[0] in response.get_json()["error"]["fields"]
    assert client.get("/v1/recommendations?created_after=0001-01-01T06%3A00%3A04%2B06%3A00").status_code == 200
