"""Issue 10: a service that holds under abuse. Each test here failed on the service before the fix.

Races are forced, not hoped for: the threads meet at a barrier right before the step that used to race.
"""
from __future__ import annotations

import datetime as dt
import json
import re
import math
import socket
import threading
import time

import pytest
import sqlalchemy as sa

from tests.conftest import example_scenario

THREADS = 12


def _run_in_threads(app, fn, n=THREADS):
    """Run ``fn(client)`` in ``n`` threads, each with its own test client; returns their results in order."""
    results, errors = [None] * n, []

    def worker(i):
        try:
            results[i] = fn(app.test_client())
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return results


# --- races -------------------------------------------------------------------------------------------------
def test_concurrent_identical_posts_all_succeed(app, client, monkeypatch):
    from advisor.services import recommendations as service

    barrier = threading.Barrier(THREADS, timeout=30)
    predict = service.predict

    def predict_then_meet(data):
        result = predict(data)
        barrier.wait()  # every thread reaches the database at once with the same workload fingerprint
        return result

    monkeypatch.setattr(service, "predict", predict_then_meet)
    responses = _run_in_threads(app, lambda c: c.post("/v1/recommendations", json=example_scenario()))
    assert [r.status_code for r in responses] == [201] * THREADS, [r.get_json() for r in responses]
    ids = {r.get_json()["id"] for r in responses}
    workloads = {r.get_json()["workload_id"] for r in responses}
    assert len(ids) == THREADS and len(workloads) == 1
    listed = client.get("/v1/recommendations?page_size=100").get_json()
    assert {row["id"] for row in listed} == ids  # every acknowledged answer is stored


def test_a_post_with_cold_caches_needs_one_pooled_connection_at_a_time(app, database_url, tmp_path):
    """A POST whose catalog and calibration caches had expired read them through the request's ORM session, which
    kept its connection until the request ended, and its INSERT then took a second one. Under load every thread did
    so when the caches expired together (every 5 s): the pool ran dry and POSTs waited for a 503 (30 s on SQLite,
    5 s on PostgreSQL). With a pool of one connection and no overflow, the POST must still be answered."""
    from advisor import create_app
    from advisor.config import engine_options
    from advisor.extensions import db
    from advisor.services import calibrations, catalog

    options = {**engine_options(database_url, 1.0, 1), "pool_size": 1, "max_overflow": 0, "pool_timeout": 1.0}
    tight = create_app({"SQLALCHEMY_DATABASE_URI": database_url, "TESTING": True, "REDIS_URL": "",
                        "INSTANCE_PATH": str(tmp_path), "SQLALCHEMY_ENGINE_OPTIONS": options})
    catalog.forget_snapshots()
    calibrations.forget_newest()
    try:
        response = tight.test_client().post("/v1/recommendations", json=example_scenario())
        assert response.status_code == 201, response.get_json()
    finally:
        with tight.app_context():
            db.engine.dispose()


def test_concurrent_catalog_creates_one_201_the_rest_409(app, client, auth):
    from sqlalchemy.orm import Session

    barrier = threading.Barrier(THREADS, timeout=30)

    def meet(session, flush_context, instances):
        if any(getattr(obj, "name", None) == "RACE-GPU" for obj in session.new):
            barrier.wait()  # all have checked "does it exist?" and are about to insert

    gpu = {"name": "RACE-GPU", "vendor": "acme", "gpu_class": "hopper", "memory_gb": 80,
           "hbm_bandwidth_gb_per_s": 3000, "bf16_tflops": 900, "gpu_hour_usd": 2.0,
           "gpu_hour_usd_date": "2026-11-01", "source": "test"}
    sa.event.listen(Session, "before_flush", meet)
    try:
        responses = _run_in_threads(app, lambda c: c.post("/v1/gpus", json=gpu, headers=auth))
    finally:
        sa.event.remove(Session, "before_flush", meet)
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [201] + [409] * (THREADS - 1), [r.get_json() for r in responses]
    conflict = next(r for r in responses if r.status_code == 409).get_json()["error"]
    assert conflict["code"] == "conflict" and "name" in conflict["fields"]


# --- ids, pages, numbers, nesting --------------------------------------------------------------------------
@pytest.mark.parametrize("method,url,status", [
    ("get", "/v1/recommendations/2147483648", 404),
    ("get", "/v1/recommendations/99999999999999999999999999", 404),
    ("get", "/v1/recommendations/0", 404),
    ("get", "/v1/recommendations/%C2%B2", 422),  # ² is a digit to str.isdigit, not to int()
    ("get", "/v1/recommendations/%D9%A3", 422),  # ٣ (Arabic-Indic three) is one to int()
    ("get", "/v1/recommendations/-1", 422),
    ("get", "/v1/recommendations/99999999999999999999/report", 404),
    ("get", "/v1/recommendations/%C2%B2/report", 422),
    ("get", "/v1/calibrations/99999999999999999999", 404),
    ("patch", "/v1/calibrations/99999999999999999999", 404),
    ("get", "/v1/calibrations/%C2%B2/report", 422),
    ("get", "/v1/recommendations/compare?ids=1,99999999999999999999", 422),
    ("get", "/v1/recommendations/compare?ids=1,%C2%B2", 422),
    ("get", "/v1/recommendations/compare?ids=1,%D9%A3", 422),
    ("get", "/v1/recommendations/compare/report?ids=1,%C2%B2", 422),
    ("get", "/v1/recommendations/compare/report?ids=1,99999999999999999999", 422),
    ("get", "/v1/recommendations?page=99999999999999999999", 422),
    ("get", "/v1/recommendations?page=9223372036854775807&page_size=100", 422),
    ("get", "/v1/recommendations?page_size=99999999999999999999", 422),
    ("get", "/v1/recommendations?page=" + "9" * 5000, 422),
])
def test_ids_and_pages_beyond_range_are_404_or_422(client, auth, method, url, status):
    response = getattr(client, method)(url, headers=auth, json={} if method == "patch" else None)
    assert response.status_code == status, response.get_json()
    assert response.get_json()["error"]["status"] == status


HUGE_INT = "1" + "0" * 5000
DEEP = "[" * 10_000 + "]" * 10_000
DEEP_OBJECT = '{"a":' * 100 + "1" + "}" * 100  # under the parser's recursion limit, over the app's


def _routes(app):
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static" or "<path:" in rule.rule:
            continue
        url = re.sub(r"<id:\w+>", "1", rule.rule).replace("<name>", "H100-SXM")
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            yield method, url


@pytest.mark.parametrize("body", [f'{{"gpu": {HUGE_INT}}}', DEEP, DEEP_OBJECT, f"[{HUGE_INT}]"],
                         ids=["5000-digit-int", "10000-deep-array", "100-deep-object", "int-in-list"])
def test_huge_ints_and_deep_nesting_are_400_on_every_route(app, client, auth, body):
    checked = 0
    for method, url in _routes(app):
        response = client.open(url, method=method, data=body, content_type="application/json", headers=auth)
        assert response.status_code < 500, (method, url, response.data[:300])
        if method in ("POST", "PUT", "PATCH") and "import" not in url:
            assert response.status_code == 400, (method, url, response.get_json())
            assert response.get_json()["error"]["code"] == "bad_request"
            checked += 1
    assert checked >= 6


def test_a_huge_float_is_a_422_not_infinity(client):
    body = json.dumps(example_scenario()).replace('"gpu_hour_usd": 3.0', '"gpu_hour_usd": 1e400')
    response = client.post("/v1/recommendations", data=body, content_type="application/json")
    assert response.status_code == 422 and "gpu_hour_usd" in response.get_json()["error"]["fields"]


# --- no NaN or Infinity, from any input ---------------------------------------------------------------------
def _strict_json(response):
    return json.loads(response.get_data(as_text=True),
                      parse_constant=lambda c: pytest.fail(f"{c} in a response body"))


@pytest.mark.parametrize("rates", [[0.8, 0.8], [0.9, 0.9, 0.9], [1.0, 1.0], [0.5, 0.5, 0.25, 0.25], [0.0, 0.0]])
def test_flat_per_position_never_gives_nan(client, rates):
    body = example_scenario(acceptance={"per_position": rates})
    response = client.post("/v1/recommendations", json=body)
    assert response.status_code in (201, 422), response.data[:300]
    _strict_json(response)
    listed = client.get("/v1/recommendations")
    assert listed.status_code == 200
    _strict_json(listed)


def test_no_nan_or_infinity_reaches_the_database(app):
    from advisor.extensions import db
    from advisor.models import Workload

    with app.app_context():
        db.session.add(Workload(fingerprint="nan-test", scenario={"x": math.nan}))
        with pytest.raises(Exception, match="JSON compliant|Out of range float"):
            db.session.commit()
        db.session.rollback()


# --- calibration uploads ------------------------------------------------------------------------------------
GOOD_STEP = {"bandwidth_efficiency": 0.7, "compute_efficiency": 0.5, "fixed_overhead_s": 0.002}


@pytest.fixture()
def external_run(client, auth):
    response = client.post("/v1/calibrations", headers=auth, json={
        "hardware": "H100-SXM", "target_model": "llama-3.1-8b-instruct", "external": True})
    assert response.status_code == 202, response.get_json()
    return response.get_json()["id"]


@pytest.mark.parametrize("update,field", [
    ({"fits": [{"kind": "step_time", "key": "llama-3.1-8b-instruct", "params": {}}]},
     "fits.0.params.bandwidth_efficiency"),
    ({"fits": [{"kind": "step_time", "key": "llama-3.1-8b-instruct",
                "params": {**GOOD_STEP, "bandwidth_efficiency": 0}}]}, "fits.0.params.bandwidth_efficiency"),
    ({"fits": [{"kind": "step_time", "key": "llama-3.1-8b-instruct",
                "params": {**GOOD_STEP, "fixed_overhead_s": "soon"}}]}, "fits.0.params.fixed_overhead_s"),
    ({"fits": [{"kind": "step_time", "key": "llama-3.1-8b-instruct",
                "params": {**GOOD_STEP, "covariance": [[1, 2], [3, 4]]}}]}, "fits.0.params.covariance"),
    ({"fits": [{"kind": "step_time", "key": "llama-3.1-8b-instruct", "params": {**GOOD_STEP, "warp": 9}}]},
     "fits.0.params.warp"),
    ({"fits": [{"kind": "step_time", "key": "llama-3.1-8b-instruct",
                "params": {**GOOD_STEP, "proposer_overhead_log_std_low": 3.0}}]},
     "fits.0.params.proposer_overhead_log_std_low"),
    ({"fits": [{"kind": "prefill", "key": "llama-3.1-8b-instruct", "params": {"compute_efficiency": -1,
                                                                             "fixed_overhead_s": 0}}]},
     "fits.0.params.compute_efficiency"),
    ({"fits": [{"kind": "prefill", "key": "llama-3.1-8b-instruct", "params": {"compute_efficiency": 6,
                                                                             "fixed_overhead_s": 0}}]},
     "fits.0.params.compute_efficiency"),
    ({"fits": [{"kind": "acceptance", "key": "ngram||prose", "params": {
        "method": "ngram", "drafter": None, "structure": "prose", "logit_intercept": 1e300,
        "logit_position_slope": 0, "logit_temperature_slope": 0}}]}, "fits.0.params.logit_intercept"),
    ({"fits": [{"kind": "acceptance", "key": "eagle||prose", "params": {
        "method": "ngram", "drafter": None, "structure": "prose", "logit_intercept": 1,
        "logit_position_slope": 0, "logit_temperature_slope": 0}}]}, "fits.0.key"),
    ({"fits": [{"kind": "acceptance", "key": "ngram||prose", "params": {
        "method": "ngram", "drafter": None, "structure": "prose", "logit_intercept": 1,
        "logit_position_slope": 0, "logit_temperature_slope": 0, "temperature_range": [2, 0]}}]},
     "fits.0.params.temperature_range"),
    ({"fits": [{"kind": "magic", "key": "x", "params": {}}]}, "fits.0.kind"),
    ({"environment": {"cpu": {"ghz": math.nan}}}, "environment"),
    ({"environment": {"x": math.inf}}, "environment"),
    ({"measurements": [{"probe": "timing", "params": {}, "values": {"step_time_s": -math.inf}}]},
     "measurements.0.values"),
    ({"measurements": [{"probe": "timing", "params": {"engine": {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {
        "i": 1}}}}}}}}}}, "values": {}}]}, "measurements.0.params"),
    ({"progress": math.nan}, "progress"),
    ({"fits": [{"kind": "step_time", "key": "llama-3.1-8b-instruct", "params": GOOD_STEP,
                "residuals": [math.inf]}]}, "fits.0.residuals.0"),
])
def test_calibration_upload_is_checked_against_the_cost_model(client, auth, external_run, update, field):
    body = json.dumps(update)  # Python writes NaN / Infinity literals, as a careless client would
    response = client.patch(f"/v1/calibrations/{external_run}", data=body, content_type="application/json",
                            headers=auth)
    assert response.status_code == 422, response.get_json()
    assert any(name.startswith(field) for name in response.get_json()["error"]["fields"]), response.get_json()


def test_engine_with_nan_is_rejected_on_create(client, auth):
    body = json.dumps({"hardware": "H100-SXM", "target_model": "llama-3.1-8b-instruct", "external": True,
                       "engine": {"max_model_len": math.inf}})
    response = client.post("/v1/calibrations", data=body, content_type="application/json", headers=auth)
    assert response.status_code == 422 and "engine" in response.get_json()["error"]["fields"]


def test_a_valid_upload_keeps_recommendations_working(client, auth, external_run):
    response = client.patch(f"/v1/calibrations/{external_run}", headers=auth, json={
        "status": "succeeded",
        "fits": [{"kind": "step_time", "key": "llama-3.1-8b-instruct", "params": GOOD_STEP, "residuals": [0.01]},
                 # a host that prefills above its catalog row's peak (calibration.fit.PREFILL_COMPUTE_EFFICIENCY_MAX)
                 {"kind": "prefill", "key": "llama-3.1-8b-instruct",
                  "params": {"compute_efficiency": 2.1, "fixed_overhead_s": 0.01}},
                 {"kind": "acceptance", "key": "ngram||prose", "params": {
                     "method": "ngram", "drafter": None, "structure": "prose", "logit_intercept": 1.0,
                     "logit_position_slope": -0.3, "logit_temperature_slope": -0.5, "draft_fraction": 0.6}}]})
    assert response.status_code == 200, response.get_json()
    answer = client.post("/v1/recommendations", json=example_scenario())
    assert answer.status_code == 201 and answer.get_json()["calibration_run_id"] == external_run


def test_a_fit_as_calibration_writes_it_uploads(client, auth, external_run):
    """Every field of ``StepTimeParams.to_dict()`` (the σ the interval samples, a two-piece proposer σ) passes the
    upload's schema and reads back; a fit without the newer fields is the GOOD_STEP upload above."""
    from advisor.costmodel.types import StepTimeParams

    params = StepTimeParams(0.7, 0.5, 0.002, proposer_overhead_s=0.005, proposer_overhead_log_std=0.5,
                            proposer_overhead_log_std_low=0.2, verify_overhead_log_std=0.19, eager_probability=0.5,
                            eager_layer_overhead_s=1.5e-4, timing_rms_rel=0.09)
    response = client.patch(f"/v1/calibrations/{external_run}", headers=auth, json={
        "status": "succeeded", "fits": [{"kind": "step_time", "key": "llama-3.1-8b-instruct",
                                         "params": params.to_dict()}]})
    assert response.status_code == 200, response.get_json()
    run = client.get(f"/v1/calibrations/{external_run}", headers=auth).get_json()
    assert StepTimeParams.from_dict(run["fits"][0]["params"]) == params


# --- /v1/models/import --------------------------------------------------------------------------------------
LLAMA = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
         "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256}


@pytest.mark.parametrize("change", [
    {"hidden_size": "4096"}, {"hidden_size": 1e308}, {"num_hidden_layers": 10**30}, {"head_dim": "x" * 50},
    {"num_key_value_heads": "8"}, {"num_local_experts": 10**9, "num_experts_per_tok": 2},
    {"num_local_experts": 8, "num_experts_per_tok": 9}, {"moe_intermediate_size": [1]},
    {"tie_word_embeddings": "yes"}, {"model_type": {"a": 1}}, {"vocab_size": -5}, {"text_config": "x"},
    {"hidden_size": True},
])
def test_model_import_checks_types_and_bounds(client, auth, change):
    config = {**LLAMA, **change}
    start = time.perf_counter()
    response = client.post("/v1/models/import", headers=auth, content_type="multipart/form-data", data={
        "name": "imported-x", "family": "llama", "tokenizer_family": "llama3",
        "config": (__import__("io").BytesIO(json.dumps(config).encode()), "config.json")})
    assert time.perf_counter() - start < 2.0
    assert response.status_code == 422, response.get_json()
    assert "config" in response.get_json()["error"]["fields"] or response.get_json()["error"]["fields"]


# --- Redis and the database unavailable ----------------------------------------------------------------------
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_redis_down_is_a_503_and_leaves_no_queued_run(app, client, auth):
    app.config["REDIS_URL"] = f"redis://127.0.0.1:{_closed_port()}/0"
    try:
        start = time.perf_counter()
        response = client.post("/v1/calibrations", headers=auth, json={
            "hardware": "H100-SXM", "target_model": "llama-3.1-8b-instruct"})
        assert time.perf_counter() - start < 10
        assert response.status_code == 503, response.get_json()
        assert "Redis" in response.get_json()["error"]["message"]
        assert client.get("/v1/calibrations").get_json() == []  # no orphan "queued" run
        health = client.get("/v1/health")
        body = health.get_json()
        assert health.status_code == 200 and body["database"] == "ok"
        assert body["redis"].startswith("error") and body["status"] == "degraded"
    finally:
        app.config["REDIS_URL"] = ""
    assert client.get("/v1/health").get_json()["redis"] == "not configured"


class _BlackHole:
    """A TCP server that accepts connections and never answers: a hung database."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.held = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self):
        self.sock.close()
        for conn in self.held:
            conn.close()


def test_a_hung_database_is_a_json_503_in_seconds(tmp_path):
    from advisor import create_app

    hole = _BlackHole()
    try:
        start = time.perf_counter()
        app = create_app({"SQLALCHEMY_DATABASE_URI": f"postgresql+psycopg://u@127.0.0.1:{hole.port}/db",
                          "AUTO_MIGRATE": False, "DB_TIMEOUT_S": 1.0, "INSTANCE_PATH": str(tmp_path)})
        client = app.test_client()
        for url in ("/v1/health", "/v1/recommendations", "/v1/gpus", "/v1/recommendations/1"):
            response = client.get(url)
            assert response.status_code == 503, (url, response.data[:200])
            assert response.is_json and response.headers.get("Retry-After")
        assert client.get("/v1/health").get_json()["database"].startswith("error")
        assert time.perf_counter() - start < 30  # 5 requests + a start, each bounded by the 1 s time-out
    finally:
        hole.close()


@pytest.mark.postgres
def test_a_locked_table_is_a_503_not_a_stuck_worker(app, client, database_url):
    if not database_url.startswith("postgresql"):
        pytest.skip("statement and lock time-outs are PostgreSQL settings")
    engine = sa.create_engine(database_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("LOCK TABLE recommendations IN ACCESS EXCLUSIVE MODE"))
            start = time.perf_counter()
            response = client.get("/v1/recommendations")
            elapsed = time.perf_counter() - start
        assert response.status_code == 503 and response.is_json, response.data[:200]
        assert elapsed < 8  # the pool's sessions carry lock_timeout = SPECADVISOR_DB_TIMEOUT_S (5 s)
    finally:
        engine.dispose()
    assert client.get("/v1/recommendations").status_code == 200


@pytest.mark.postgres
def test_connections_the_server_dropped_are_replaced_and_busy_ones_are_not_pinged(database_url, tmp_path):
    """No pool_pre_ping round trip on every checkout: a connection is pinged only after it sat idle, and one the
    server dropped meanwhile (a restart, an idle time-out) is replaced before a request uses it."""
    if not database_url.startswith("postgresql"):
        pytest.skip("a SQLite file has no server connection to drop")
    from advisor import create_app
    from advisor.extensions import db

    app = create_app({"SQLALCHEMY_DATABASE_URI": database_url, "TESTING": True, "REDIS_URL": "",
                      "INSTANCE_PATH": str(tmp_path), "DB_PING_IDLE_S": 0.3})
    client = app.test_client()
    with app.app_context():
        engine = db.engine
    pids, pings = set(), []
    sa.event.listen(engine, "checkout", lambda dbapi, record, proxy: pids.add(dbapi.info.backend_pid))
    ping = engine.dialect.do_ping
    engine.dialect.do_ping = lambda connection: (pings.append(1), ping(connection))[1]
    try:
        for _ in range(5):  # back-to-back: no ping
            assert client.get("/v1/recommendations").status_code == 200
        assert pings == []
        with sa.create_engine(database_url, isolation_level="AUTOCOMMIT").connect() as admin:
            admin.execute(sa.text("SELECT pg_terminate_backend(pid) FROM unnest(CAST(:pids AS int[])) AS pid"),
                          {"pids": sorted(pids)})
        time.sleep(0.4)  # idle past DB_PING_IDLE_S
        assert client.get("/v1/recommendations").status_code == 200
        assert client.get("/v1/health").get_json()["database"] == "ok"
        assert client.post("/v1/recommendations", json=example_scenario()).status_code == 201
        assert pings  # the dropped connection was found by a ping, not by a request
    finally:
        del engine.dialect.do_ping
        engine.dispose()


@pytest.mark.postgres
def test_synchronous_commit_is_a_deployment_setting(database_url, tmp_path):
    if not database_url.startswith("postgresql"):
        pytest.skip("a PostgreSQL setting")
    from advisor import create_app
    from advisor.config import engine_options
    from advisor.extensions import db

    for setting in ("on", "off"):
        app = create_app({"SQLALCHEMY_DATABASE_URI": database_url, "TESTING": True, "REDIS_URL": "",
                          "INSTANCE_PATH": str(tmp_path), "DB_SYNCHRONOUS_COMMIT": setting})
        with app.app_context():
            assert db.session.execute(sa.text("SHOW synchronous_commit")).scalar() == setting
            db.session.rollback()
            db.engine.dispose()
    with pytest.raises(ValueError, match="SYNCHRONOUS_COMMIT"):
        engine_options(database_url, 5.0, 8, "local")


# --- headers and error bodies --------------------------------------------------------------------------------
def test_405_carries_allow_and_401_carries_www_authenticate(client):
    response = client.delete("/v1/recommendations")
    assert response.status_code == 405 and set(response.headers["Allow"].replace(" ", "").split(",")) >= {
        "GET", "POST"}
    assert response.get_json()["error"]["code"] == "method_not_allowed"
    denied = client.post("/v1/gpus", json={})
    assert denied.status_code == 401 and denied.headers["WWW-Authenticate"].startswith("Bearer")


def test_json_is_nosniff_and_the_docs_have_a_csp(client):
    for url in ("/v1/health", "/v1/gpus", "/v1/nope", "/v1/openapi.json"):
        assert client.get(url).headers["X-Content-Type-Options"] == "nosniff", url
    docs = client.get("/v1/docs")
    csp = docs.headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "'sha256-" in csp and "unsafe-eval" not in csp


def test_error_bodies_are_the_documented_error_schema(client):
    spec = client.get("/v1/openapi.json").get_json()
    error = spec["components"]["schemas"]["Error"]
    assert error["required"] == ["error"]
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            if method in ("get", "post", "put", "patch", "delete"):
                assert "default" in operation["responses"], (path, method)


def test_metrics_content_type_and_per_route_counts(client):
    client.get("/v1/gpus")
    client.get("/v1/recommendations/999")
    response = client.get("/metrics")
    assert response.headers.getlist("Content-Type") == [response.headers["Content-Type"]]
    assert response.headers["Content-Type"].count("charset") == 1
    text = response.get_data(as_text=True)
    assert 'specadvisor_http_requests_total{method="GET",route="/v1/gpus",status="200"}' in text
    assert 'route="/v1/recommendations/<id:rec_id>",status="404"' in text
    assert "specadvisor_http_request_duration_seconds_bucket" in text



def _count(client, labels: str) -> float:
    match = re.search(r"specadvisor_http_requests_total\{" + re.escape(labels) + r"\} (\S+)",
                      client.get("/metrics").get_data(as_text=True))
    return float(match.group(1)) if match else 0.0


def test_metrics_count_every_request_once_per_labels(client):
    """The counter's and histogram's children are resolved once per (method, route, status) and reused: each
    request still counts once, under its own labels; a method outside the known ones is "other", a path that
    matches no rule "unmatched"."""
    cases = [(lambda: client.get("/v1/recommendations/424242"),
              'method="GET",route="/v1/recommendations/<id:rec_id>",status="404"'),
             (lambda: client.get("/v1/recommendations/%C2%B2"),  # the id converter refuses it: no rule matched
              'method="GET",route="unmatched",status="422"'),
             (lambda: client.open("/v1/gpus", method="BREW"), 'method="other",route="unmatched",status="405"'),
             (lambda: client.get("/v1/no-such-thing"), 'method="GET",route="unmatched",status="404"')]
    for send, labels in cases:
        before = _count(client, labels)
        for _ in range(3):
            send()
        assert _count(client, labels) == before + 3, labels


# --- time zones ---------------------------------------------------------------------------------------------
def test_created_after_and_before_compare_instants_with_their_offsets(client):
    rec = client.post("/v1/recommendations", json=example_scenario()).get_json()
    created = dt.datetime.fromisoformat(rec["created_at"])
    assert created.utcoffset() == dt.timedelta(0)
    before = created - dt.timedelta(seconds=1)
    after = created + dt.timedelta(seconds=1)
    for instant, expect in ((before, [rec["id"]]), (after, [])):
        as_z = instant.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        as_plus2 = instant.astimezone(dt.timezone(dt.timedelta(hours=2))).isoformat()
        as_minus7 = instant.astimezone(dt.timezone(dt.timedelta(hours=-7))).isoformat()
        for text in (as_z, as_plus2, as_minus7):
            rows = client.get("/v1/recommendations", query_string={"created_after": text}).get_json()
            assert [r["id"] for r in rows] == expect, (text, rows)
    as_plus2 = after.astimezone(dt.timezone(dt.timedelta(hours=2))).isoformat()
    rows = client.get("/v1/recommendations", query_string={"created_before": as_plus2}).get_json()
    assert [r["id"] for r in rows] == [rec["id"]]


def test_a_post_stores_its_instant_as_the_orm_does(app, client, monkeypatch):
    """A POST's INSERT runs on the driver (compiled once): it must bind its values through the column types as
    the ORM would. Before, SQLite's own adapter wrote ``…:35+00:00`` where UtcDateTime writes ``…:35.000000``, so
    a row made on a whole second fell outside ``created_after`` at that very instant."""
    from advisor.extensions import db
    from advisor.models import Recommendation, UtcDateTime
    from advisor.services import recommendations

    instant = dt.datetime(2026, 12, 2, 3, 4, 35, tzinfo=dt.timezone.utc)
    monkeypatch.setattr(recommendations, "utcnow", lambda: instant)
    rec = client.post("/v1/recommendations", json=example_scenario()).get_json()
    assert rec["created_at"] == instant.isoformat()
    with app.app_context():
        dialect = db.engine.dialect
        stored = db.session.execute(sa.select(sa.cast(Recommendation.created_at, sa.String()))
                                    .where(Recommendation.id == rec["id"])).scalar_one()
        bind = UtcDateTime().dialect_impl(dialect).bind_processor(dialect)
        if dialect.name == "sqlite":
            assert stored == bind(instant)  # 2026-12-02 03:04:35.000000
        db.session.rollback()
    for key, text in (("created_after", "2026-12-02T03:04:35Z"), ("created_before", "2026-12-02T05:04:35+02:00")):
        rows = client.get("/v1/recommendations", query_string={key: text}).get_json()
        assert [r["id"] for r in rows] == [rec["id"]], key
        assert client.get(f"/v1/recommendations?{key}={text.replace('+', '%2B')}&after_id=999999").get_json()[0][
            "id"] == rec["id"]


# --- schema versions and migrations -------------------------------------------------------------------------
def test_migrate_down_asks_for_a_target(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from advisor.cli import migrate

    url = f"sqlite:///{tmp_path / 'm.db'}"
    monkeypatch.setenv("DATABASE_URL", url)
    runner = CliRunner()
    assert runner.invoke(migrate, []).exit_code == 0
    result = runner.invoke(migrate, ["--down"])
    assert result.exit_code != 0 and "--revision" in result.output
    result = runner.invoke(migrate, ["--down", "--revision", "base"], input="n\n")
    assert result.exit_code != 0 and "Drop every" in result.output
    assert "recommendations" in sa.inspect(sa.create_engine(url)).get_table_names()  # nothing dropped
    assert runner.invoke(migrate, ["--down", "--revision", "0001"]).exit_code == 0
    assert runner.invoke(migrate, ["--down", "--revision", "base", "--yes"]).exit_code == 0
    assert "recommendations" not in sa.inspect(sa.create_engine(url)).get_table_names()


@pytest.mark.parametrize("auto_migrate", [True, False])
def test_the_app_refuses_a_schema_newer_than_its_code(tmp_path, auto_migrate):
    from advisor import create_app
    from advisor.storage import SchemaMismatch, upgrade

    url = f"sqlite:///{tmp_path / 'newer.db'}"
    engine = sa.create_engine(url)
    upgrade(engine)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '0099'"))
    with pytest.raises(SchemaMismatch, match="0099, newer than this specadvisor"):
        create_app({"SQLALCHEMY_DATABASE_URI": url, "AUTO_MIGRATE": auto_migrate, "INSTANCE_PATH": str(tmp_path)})


def test_the_app_refuses_an_older_schema_without_auto_migrate(tmp_path):
    from advisor import create_app
    from advisor.storage import SchemaMismatch, upgrade

    url = f"sqlite:///{tmp_path / 'older.db'}"
    upgrade(sa.create_engine(url), "0001")
    with pytest.raises(SchemaMismatch, match="advisor migrate"):
        create_app({"SQLALCHEMY_DATABASE_URI": url, "AUTO_MIGRATE": False, "INSTANCE_PATH": str(tmp_path)})
    app = create_app({"SQLALCHEMY_DATABASE_URI": url, "AUTO_MIGRATE": True, "INSTANCE_PATH": str(tmp_path)})
    assert app.test_client().get("/v1/health").status_code == 200


# --- the catalog's and the fits' extremes together ----------------------------------------------------------
def test_the_slowest_gpu_and_largest_model_the_schemas_admit_never_give_a_500(client, auth):
    """Schemathesis (random seeds): a GPU created at 1e-300 GB/s made every recommendation and plan on it a 500
    (OverflowError in the scalar step clock). GPUs now start at 1 GB/s and 0.001 TFLOP/s, and the smooth roofline
    scales its powers where they would overflow: at the floors, with the largest model, a fit at the sharpest
    roofline and the lowest efficiencies, and a 1M-token prompt, a recommendation and a plan each get an answer."""
    too_slow = {"name": "Crawler", "vendor": "x", "gpu_class": "hopper", "memory_gb": 10_000,
                "hbm_bandwidth_gb_per_s": 1e-300, "bf16_tflops": 900, "gpu_hour_usd": 1.0,
                "gpu_hour_usd_date": "2026-01-01", "source": "fuzz"}
    response = client.post("/v1/gpus", headers=auth, json=too_slow)
    assert response.status_code == 422 and "hbm_bandwidth_gb_per_s" in response.get_json()["error"]["fields"]
    assert client.post("/v1/gpus", headers=auth, json={**too_slow, "hbm_bandwidth_gb_per_s": 1.0,
                                                       "bf16_tflops": 0.001}).status_code == 201
    big = {"name": "Colossus", "family": "x", "num_layers": 1000, "hidden_size": 1_000_000, "num_attention_heads": 4096,
           "num_kv_heads": 4096, "head_dim": 4096, "intermediate_size": 10_000_000, "vocab_size": 10_000_000,
           "param_count": 10**13, "tokenizer_family": "x", "tokenizer_vocab_size": 10_000_000, "source": "fuzz"}
    assert client.post("/v1/models", headers=auth, json=big).status_code == 201
    run = client.post("/v1/calibrations", headers=auth, json={"hardware": "Crawler", "target_model": "Colossus",
                                                               "external": True}).get_json()["id"]
    step = {"bandwidth_efficiency": 0.001, "compute_efficiency": 0.001, "fixed_overhead_s": 10.0,
            "roofline_sharpness": 50.0}
    response = client.patch(f"/v1/calibrations/{run}", headers=auth, json={
        "status": "succeeded", "fits": [{"kind": "step_time", "key": "Colossus", "params": step},
                                        {"kind": "prefill", "key": "Colossus",
                                         "params": {"compute_efficiency": 0.001, "fixed_overhead_s": 10.0}}]})
    assert response.status_code == 200, response.get_json()
    for prompt_tokens in (1, 1_048_576):
        scenario = {"gpu": "Crawler", "target_model": "Colossus", "speculator": {"method": "ngram"},
                    "workload": {"prompt_tokens": prompt_tokens, "output_tokens": 16, "temperature": 0.0,
                                 "structure": "code", "concurrency": 1}}
        response = client.post("/v1/recommendations", json=scenario)
        assert response.status_code == 201, response.get_json()
        assert response.get_json()["decision"] == "no-go"  # 20 TB of weights in 10 TB
        plan = {"target_model": "Colossus", "gpus": ["Crawler"], "gpu_hour_usd": {},
                "workload": {"prompt_tokens": prompt_tokens, "output_tokens": 16, "structure": "code"},
                "load": {"requests_per_second": 0.001}, "slo": {"latency_ms": 1e8},
                "speculators": [{"method": "ngram"}]}
        response = client.post("/v1/plans", json=plan)
        assert response.status_code == 201, response.get_json()
        assert not response.get_json()["feasible"]


def test_a_gpu_row_stored_below_the_floors_gets_a_422_not_a_500(app, client):
    """A row a token holder stored before the floors: its step times overflow a float."""
    from advisor.extensions import db
    from advisor.models import Gpu

    with app.app_context():
        db.session.add(Gpu(name="Legacy-crawler", vendor="x", gpu_class="hopper", memory_gb=80,
                           hbm_bandwidth_gb_per_s=1e-300, bf16_tflops=900.0, gpu_hour_usd=1.0,
                           gpu_hour_usd_date="2026-01-01", source="before the floors"))
        db.session.commit()
    response = client.post("/v1/recommendations", json=example_scenario(gpu="Legacy-crawler"))
    assert response.status_code == 422 and response.get_json()["error"]["fields"]
    plan = {"target_model": "llama-3.1-8b-instruct", "gpus": ["Legacy-crawler"], "gpu_hour_usd": {},
            "workload": {"prompt_tokens": 512, "output_tokens": 256, "structure": "prose"},
            "load": {"requests_per_second": 5}, "slo": {"latency_ms": 1e5}}
    assert client.post("/v1/plans", json=plan).status_code < 500


def test_a_plan_does_not_hold_a_transaction_open_while_it_simulates(app, database_url, tmp_path):
    """Schemathesis (random seeds) on PostgreSQL: a plan's request read the catalog in its session's transaction and
    kept it open through a minute of simulation; the server ended the connection at
    ``idle_in_transaction_session_timeout`` (10 × ``SPECADVISOR_DB_TIMEOUT_S``) and the INSERT got a 500. Here the
    idle time-out is 1 s and the plan simulates for about 3 s (long requests, eight load levels, every priced GPU)."""
    from advisor import create_app
    from advisor.config import engine_options
    from advisor.extensions import db
    from advisor.services import catalog

    if not database_url.startswith("postgresql"):
        pytest.skip("idle_in_transaction_session_timeout is a PostgreSQL setting")
    quick = create_app({"SQLALCHEMY_DATABASE_URI": database_url, "TESTING": True, "REDIS_URL": "",
                        "INSTANCE_PATH": str(tmp_path), "SQLALCHEMY_ENGINE_OPTIONS": engine_options(database_url, 0.1, 2)})
    catalog.forget_snapshots()
    plan = {"target_model": "llama-3.1-8b-instruct", "slo": {"percentile": 99, "latency_ms": 1_200_000},
            "load": {"requests_per_second": 1, "growth": [1, 2, 4, 8, 16, 32, 64, 128]},
            "workload": {"prompt_tokens": 8_000, "output_tokens": 16_000, "structure": "rag"}}
    try:
        started = time.perf_counter()
        response = quick.test_client().post("/v1/plans", json=plan)
        assert response.status_code == 201, response.get_json()
        assert time.perf_counter() - started > 1.0  # longer than the idle time-out
    finally:
        with quick.app_context():
            db.engine.dispose()
