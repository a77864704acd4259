"""/v1/deployments through the API and the database (SQLite and PostgreSQL), scraping a local HTTP server that
serves exposition texts recorded from a real vLLM server (the live vLLM tests are in test_live_vllm.py)."""
from __future__ import annotations

import http.server
import threading
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import example_scenario

DATA = Path(__file__).with_name("data")
START = (DATA / "vllm-0.32-ngram-k3-start.txt").read_text()
AFTER = (DATA / "vllm-0.32-ngram-k3-3req.txt").read_text()
CPU_SCENARIO = {"gpu": "CPU-2core", "target_model": "smollm2-135m-instruct",
                "speculator": {"method": "ngram", "num_speculative_tokens": 3},
                "workload": {"prompt_tokens": 27, "output_tokens": 48, "temperature": 0.0, "structure": "prose",
                             "concurrency": 1}}


class Routes(http.server.BaseHTTPRequestHandler):
    routes: dict[str, tuple[int, dict[str, str], bytes]] = {}

    def do_GET(self):  # noqa: N802
        status, headers, body = self.routes.get(self.path, (404, {}, b"not found"))
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # quiet
        pass


@pytest.fixture(scope="module")
def target():
    """A local HTTP server: set ``target.routes[path] = (status, headers, body)``; ``target.url(path)``."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Routes)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.url = lambda path: f"http://127.0.0.1:{server.server_port}{path}"
    server.routes = Routes.routes
    yield server
    server.shutdown()


@pytest.fixture()
def allow_loopback(app):
    saved = app.config["MONITOR_ALLOW"]
    app.config["MONITOR_ALLOW"] = "127.0.0.1"
    yield
    app.config["MONITOR_ALLOW"] = saved


def serve(target, path: str, text: str, status: int = 200, headers: dict | None = None) -> str:
    target.routes[path] = (status, headers or {"Content-Type": "text/plain; version=0.0.4"}, text.encode())
    return target.url(path)


def own_metrics(client, deployment_id: int) -> dict[tuple[str, tuple], float]:
    """Our /metrics for one deployment: (name, other labels) -> value, read with prometheus_client's parser."""
    text = client.get("/metrics").get_data(as_text=True)
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = dict(sample.labels)
            if labels.pop("deployment", None) == str(deployment_id):
                labels.pop("label")
                out[(sample.name, tuple(sorted(labels.items())))] = sample.value
    return out


def register(client, auth, url: str, **extra) -> dict:
    response = client.post("/v1/deployments", json={"metrics_url": url, "label": "smollm2-cpu",
                                                    "scenario": CPU_SCENARIO, **extra}, headers=auth)
    assert response.status_code == 201, response.get_json()
    return response.get_json()


def test_register_scrape_drift_report(client, auth, target, allow_loopback):
    url = serve(target, "/metrics", START)
    dep = register(client, auth, url)
    assert dep["state"] == "pending" and dep["recommendation_id"] >= 1
    assert client.post(f"/v1/deployments/{dep['id']}/scrape", headers=auth).get_json()["state"] == "ok"
    serve(target, "/metrics", AFTER)
    scraped = client.post(f"/v1/deployments/{dep['id']}/scrape", headers=auth).get_json()
    assert scraped["ok"] and scraped["size_bytes"] == len(AFTER.encode())

    drift = client.get(f"/v1/deployments/{dep['id']}/drift").get_json()
    assert len(drift["windows"]) == 1 and drift["restarts"] == []
    window = drift["windows"][0]
    assert window["mean_acceptance_length"] == pytest.approx(1 + 33 / 21)
    assert drift["latest"]["mean_acceptance_length"] == pytest.approx(1 + 33 / 21)
    assert drift["expected"]["recommendation_id"] == dep["recommendation_id"]
    assert drift["snapshots"]["model_name"] == "smollm2"
    today = drift["verdict_today"]
    assert today["decision"] in ("go", "no-go", "calibrate")
    # the observed operating point (the recorded texts are served ms apart: the time-averaged batch is large)
    assert today["scenario"]["workload"]["concurrency"] == max(1, round(window["concurrency"]))
    assert today["scenario"]["workload"]["output_tokens"] == 48 and today["scenario"]["workload"]["prompt_tokens"] == 27
    assert "acceptance.per_position" not in today["sources"]  # 21 drafts: too few to replace the predicted acceptance

    one = client.get(f"/v1/deployments/{dep['id']}").get_json()
    assert one["state"] == "ok" and one["latest"]["window"]["drafts"] == 21
    assert [d["id"] for d in client.get("/v1/deployments").get_json()] == [dep["id"]]

    page = client.get(f"/v1/deployments/{dep['id']}/report")
    assert page.status_code == 200 and page.mimetype == "text/html"
    assert page.headers["Content-Security-Policy"].startswith("default-src 'none'")
    html = page.get_data(as_text=True)
    assert html.count('<svg class="plot"') == 3 and "<script" not in html
    assert 'id="realised-al">2.57<' in html

    ours = own_metrics(client, dep["id"])
    assert ours[("specadvisor_deployment_realised_acceptance_length", ())] == pytest.approx(1 + 33 / 21)
    assert ours[("specadvisor_deployment_up", (("state", "ok"),))] == 1.0
    raised = {f["flag"] for f in drift["flags"]}
    for flag in ("acceptance_below_prediction", "concurrency_above_break_even", "tpot_worse_than_baseline"):
        assert ours[("specadvisor_deployment_drift", (("flag", flag),))] == (1.0 if flag in raised else 0.0)

    assert client.delete(f"/v1/deployments/{dep['id']}", headers=auth).status_code == 204
    assert client.get(f"/v1/deployments/{dep['id']}").status_code == 404
    assert client.get(f"/v1/deployments/{dep['id']}/report").status_code == 404


def test_restart_in_the_api(app, client, auth, target, allow_loopback):
    url = serve(target, "/restart", AFTER)
    dep = register(client, auth, url)
    client.post(f"/v1/deployments/{dep['id']}/scrape", headers=auth)
    serve(target, "/restart", START)  # the counters went back: the server restarted
    client.post(f"/v1/deployments/{dep['id']}/scrape", headers=auth)
    drift = client.get(f"/v1/deployments/{dep['id']}/drift").get_json()
    assert drift["windows"] == [] and len(drift["restarts"]) == 1 and drift["latest"] is None
    serve(target, "/restart", AFTER)
    with app.app_context():  # what `advisor monitor` runs on every interval
        from advisor.services.deployments import scrape_all

        assert scrape_all() == [(dep["id"], "ok")]
    drift = client.get(f"/v1/deployments/{dep['id']}/drift").get_json()
    assert len(drift["windows"]) == 1 and drift["windows"][0]["drafts"] == 21


def test_bad_targets_give_a_state_not_a_crash(app, client, auth, target, allow_loopback):
    no_spec = "\n".join(line for line in AFTER.splitlines() if "spec_decode" not in line)
    cases = {
        "not_prometheus": serve(target, "/html", "<html><body>login</body></html>", headers={"Content-Type": "text/html"}),
        "no_spec_decode": serve(target, "/nospec", no_spec),
        "refused": serve(target, "/redirect", "", status=302, headers={"Location": "http://169.254.169.254/"}),
        "unreachable": target.url("/missing"),  # 404
    }
    for state, url in cases.items():
        dep = register(client, auth, url, label=state)
        snap = client.post(f"/v1/deployments/{dep['id']}/scrape", headers=auth)
        assert snap.status_code == 201 and snap.get_json()["state"] == state, (state, snap.get_json())
        body = client.get(f"/v1/deployments/{dep['id']}").get_json()
        assert body["state"] == state and body["state_message"]
        drift = client.get(f"/v1/deployments/{dep['id']}/drift").get_json()
        assert drift["snapshots"]["failed"] == 1 and drift["windows"] == []  # the failed scrape is kept
        assert client.get(f"/v1/deployments/{dep['id']}/report").status_code == 200
    closed = register(client, auth, "http://127.0.0.1:9/metrics", label="closed port")
    client.post(f"/v1/deployments/{closed['id']}/scrape", headers=auth)
    body = client.get(f"/v1/deployments/{closed['id']}").get_json()
    assert body["state"] == "unreachable" and body["status"].startswith("unreachable since ")
    saved = app.config["MONITOR_MAX_BYTES"]
    app.config["MONITOR_MAX_BYTES"] = 1000
    try:
        big = register(client, auth, serve(target, "/big", AFTER), label="big")
        snap = client.post(f"/v1/deployments/{big['id']}/scrape", headers=auth).get_json()
        assert snap["state"] == "refused" and "larger than 1,000 bytes" in snap["error"]
    finally:
        app.config["MONITOR_MAX_BYTES"] = saved
    assert own_metrics(client, closed["id"])[("specadvisor_deployment_up", (("state", "unreachable"),))] == 0.0


@pytest.mark.parametrize("url, field", [
    ("http://169.254.169.254/latest/meta-data/", "metrics_url"),
    ("http://10.0.0.7:8000/metrics", "metrics_url"),
    ("http://127.0.0.1:8000/metrics", "metrics_url"),  # loopback is private: not on the (empty) list
    ("file:///etc/passwd", "metrics_url"),
])
def test_unsafe_urls_are_422(client, auth, url, field):
    response = client.post("/v1/deployments", json={"metrics_url": url, "label": "x", "scenario": CPU_SCENARIO},
                           headers=auth)
    assert response.status_code == 422
    assert field in response.get_json()["error"]["fields"]


def test_registration_input_errors(client, auth, target, allow_loopback):
    url = target.url("/metrics")
    assert client.post("/v1/deployments", json={"metrics_url": url, "label": "x", "scenario": CPU_SCENARIO}
                       ).status_code == 401
    cases = [({"metrics_url": url, "label": "x"}, "recommendation_id"),
             ({"metrics_url": url, "label": "x", "recommendation_id": 999999}, "recommendation_id"),
             ({"metrics_url": url, "label": "x", "recommendation_id": 1, "scenario": CPU_SCENARIO},
              "recommendation_id"),
             ({"metrics_url": url, "label": "", "scenario": CPU_SCENARIO}, "label"),
             ({"metrics_url": url, "label": "x", "scenario": {**CPU_SCENARIO, "gpu": 3}}, "scenario.gpu")]
    for body, field in cases:
        response = client.post("/v1/deployments", json=body, headers=auth)
        assert response.status_code == 422, (body, response.get_json())
        assert field in response.get_json()["error"]["fields"], response.get_json()
    rec = client.post("/v1/recommendations", json=example_scenario()).get_json()
    dep = register(client, auth, url, recommendation_id=rec["id"], scenario=None)
    assert dep["recommendation_id"] == rec["id"]
    assert client.get("/v1/deployments/12345/drift").status_code == 404
    assert client.get(f"/v1/deployments/{dep['id']}/drift?limit=1").status_code == 422
