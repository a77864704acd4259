"""Health, OpenAPI, metrics, CLI and tokens."""
from __future__ import annotations

import json
import logging

from advisor.auth import hash_token
from tests.conftest import example_scenario


def test_health_reports_the_backend(app, client):
    body = client.get("/v1/health").get_json()
    assert body["status"] == "ok" and body["database"] == "ok"
    assert body["database_backend"] == ("sqlite" if "sqlite" in app.config["SQLALCHEMY_DATABASE_URI"]
                                        else "postgresql")


def test_openapi_is_generated_from_the_schemas(client):
    spec = client.get("/v1/openapi.json").get_json()
    assert spec["openapi"].startswith("3.")
    for path in ("/v1/recommendations", "/v1/recommendations/{rec_id}", "/v1/recommendations/compare",
                 "/v1/gpus", "/v1/models", "/v1/models/import", "/v1/calibrations", "/v1/calibrations/{run_id}"):
        assert path in spec["paths"], path
    scenario = spec["components"]["schemas"]["Scenario"]
    assert {"gpu", "target_model", "workload"} <= set(scenario["required"])
    assert "speculator" not in scenario["required"]  # absent: the advisor tries the candidates (speculator_choice)
    assert "speculator_choice" in spec["components"]["schemas"]["Recommendation"]["properties"]
    docs = client.get("/v1/docs")
    assert "text/html" in docs.content_type and b"/v1/swagger-ui/swagger-ui-bundle.js" in docs.data
    assert client.get("/v1/swagger-ui/swagger-ui-bundle.js").status_code == 200  # served locally, no CDN


def test_metrics_endpoint(client):
    response = client.get("/metrics")
    assert response.status_code == 200 and b"python_info" in response.data


def test_tokens_are_stored_hashed_and_never_logged(app, client, token, caplog):
    from advisor.extensions import db
    from advisor.models import ApiToken

    with app.app_context():
        row = db.session.query(ApiToken).one()
        assert row.token_hash == hash_token(token) and token not in (row.token_hash, row.prefix)
    with caplog.at_level(logging.DEBUG):
        client.post("/v1/gpus", json={}, headers={"Authorization": f"Bearer {token}"})
    assert token not in caplog.text


def test_cli_predict_prints_one_answer_per_scenario_in_order(app, client, tmp_path):
    from advisor.cli import predict

    scenarios = [example_scenario(), example_scenario(gpu="H200-SXM"),
                 example_scenario(workload={"prompt_tokens": 1, "output_tokens": 1, "structure": "nope",
                                            "concurrency": 1})]
    path = tmp_path / "scenarios.json"
    path.write_text(json.dumps(scenarios))
    result = app.test_cli_runner().invoke(predict, ["--scenarios", str(path)])
    answers = json.loads(result.output)
    assert result.exit_code == 1  # the third scenario is invalid
    assert len(answers) == 3 and answers[0]["decision"] in ("go", "no-go", "calibrate")
    assert "workload.structure" in answers[2]["error"]["fields"]
    api_answer = client.post("/v1/recommendations", json=scenarios[0]).get_json()
    assert api_answer["speedup"] == answers[0]["speedup"]  # the CLI and the API speak one language


def test_cli_step_time_uses_the_catalog(app, tmp_path):
    from advisor.cli import step_time

    path = tmp_path / "q.json"
    path.write_text(json.dumps([
        {"gpu": "H100-SXM", "model": "llama-3.1-8b-instruct", "batch": 1, "query_tokens": 1, "context_tokens": 512},
        {"gpu": "H100-SXM", "model": "llama-3.1-8b-instruct", "batch": 64, "query_tokens": 6,
         "context_tokens": 512},
        {"gpu": "H999", "model": "llama-3.1-8b-instruct", "batch": 1, "query_tokens": 1, "context_tokens": 1}]))
    result = app.test_cli_runner().invoke(step_time, ["--queries", str(path)])
    rows = json.loads(result.output)
    # batch 1 decode of 16 GB of bf16 weights at 3.35 TB/s: a few milliseconds, memory-bound
    assert 4.0 < rows[0]["step_time_ms"] < 12.0 and rows[0]["source"] == "catalog"
    assert rows[1]["step_time_ms"] > rows[0]["step_time_ms"]
    assert "H999" in rows[2]["error"]
