"""HTML report routes through the service (SQLite and PostgreSQL): round trips, errors, calibration pages."""

from __future__ import annotations

import re

import pytest

from tests.conftest import example_scenario
from tests.reports.sample import sample_calibration_update
from tests.reports.test_renderers import assert_offline, svg_count

H200 = example_scenario(gpu="H200-SXM")
NGRAM = example_scenario(speculator={"method": "ngram", "num_speculative_tokens": 4}, acceptance=None)


def post(client, body) -> dict:
    response = client.post("/v1/recommendations", json=body)
    assert response.status_code == 201, response.get_json()
    return response.get_json()


def get_html(client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, response.data[:500]
    assert response.mimetype == "text/html"
    assert "default-src 'none'" in response.headers["Content-Security-Policy"]
    html = response.get_data(as_text=True)
    assert_offline(html)
    return html


def test_report_round_trip(client):
    answer = post(client, example_scenario())
    html = get_html(client, f"/v1/recommendations/{answer['id']}/report")
    decision = answer["decision"]
    assert f'id="decision" data-decision="{decision}">{decision.upper()}<' in html
    assert f'class="card verdict {decision}"' in html
    for reason in answer["reasons"]:
        assert reason.replace("'", "&#39;") in html
    assert svg_count(html) == 4
    provenance = html.split('<table id="provenance">')[1].split("</table>")[0]
    rows = re.findall(r"<tr><td><code>([^<]+)</code>", provenance)
    assert set(answer["provenance"]) <= set(rows)  # every path the cost model sourced has a row
    assert "<code>speedup.expected</code>" in provenance
    assert '<pre id="speculative-config">' in html and '<pre id="serve-flags">vllm serve ' in html
    assert "<code>workload.concurrency</code>" in html.split('<table id="inputs">')[1]


def test_report_of_unknown_recommendation_is_a_404_envelope(client):
    response = client.get("/v1/recommendations/999999/report")
    assert response.status_code == 404
    assert response.get_json()["error"]["code"] == "not_found"


def test_comparison_report(client):
    ids = [post(client, body)["id"] for body in (example_scenario(), H200, NGRAM)]
    html = get_html(client, f"/v1/recommendations/compare/report?ids={','.join(map(str, ids))}")
    for rec_id in ids:
        assert f'href="/v1/recommendations/{rec_id}/report"' in html
    assert "H200-SXM" in html and "ngram" in html
    assert "<td>speedup (expected)</td>" in html and "<td>break-even concurrency</td>" in html
    assert svg_count(html) == 3  # one small speedup curve per column
    assert html.count('<span class="pill ') == 3


@pytest.mark.parametrize(
    "query", ["", "?ids=", "?ids=1", "?ids=1,x", "?ids=1,2,3,4,5,6,7", "?ids=-1,2", "?ids=1.5,2"]
)
def test_comparison_report_rejects_bad_ids(client, query):
    response = client.get(f"/v1/recommendations/compare/report{query}")
    assert response.status_code == 422
    error = response.get_json()["error"]
    assert error["code"] == "validation_error" and "ids" in error["fields"]


def test_comparison_report_of_unknown_id_is_a_404_envelope(client):
    rec_id = post(client, example_scenario())["id"]
    response = client.get(f"/v1/recommendations/compare/report?ids={rec_id},999999")
    assert response.status_code == 404 and response.get_json()["error"]["code"] == "not_found"


def _calibration_run(app, **update) -> int:
    from advisor.services import calibrations

    with app.app_context():
        run = calibrations.create(
            {
                "hardware": "H100-SXM",
                "target_model": "llama-3.1-8b-instruct",
                "method": "eagle",
                "draft_model": "eagle-llama-3.1-8b",
                "batch_sizes": [1, 2, 4, 8],
            },
            external=True,
        )
        calibrations.record(run, {**sample_calibration_update(), **update})
        return run.id


def test_calibration_report(app, client):
    run_id = _calibration_run(app)
    html = get_html(client, f"/v1/calibrations/{run_id}/report")
    assert 'id="status">SUCCEEDED<' in html
    measurements = html.split('<table id="measurements">')[1].split("</table>")[0]
    assert measurements.count("<tr><td") == 12
    assert "batch_size=8" in measurements and "step_time_ms=" in measurements
    assert svg_count(html) == 3  # timing vs fit, acceptance vs fit, residuals
    fits = html.split('<table id="fits">')[1]
    assert '<code>bandwidth_efficiency</code></td><td class="num">80.0 %</td>' in fits  # a table with units


def test_calibration_report_of_a_failed_run_shows_the_error(app, client):
    run_id = _calibration_run(
        app, status="failed", error="torch.OutOfMemoryError: CUDA out of memory", fits=[]
    )
    html = get_html(client, f"/v1/calibrations/{run_id}/report")
    assert 'id="status">FAILED<' in html and "CUDA out of memory" in html and "no fits stored" in html


def test_calibration_report_of_unknown_run_is_a_404_envelope(client):
    response = client.get("/v1/calibrations/999999/report")
    assert response.status_code == 404 and response.get_json()["error"]["code"] == "not_found"


def test_write_report(app, client, tmp_path):
    from advisor.errors import ApiError
    from advisor.reports import write_report

    answer = post(client, example_scenario())
    out = tmp_path / "reports" / "example.html"
    with app.app_context():
        write_report(answer["id"], out)
        with pytest.raises(ApiError):
            write_report(999999, tmp_path / "missing.html")
    html = out.read_text(encoding="utf-8")
    assert_offline(html)
    assert svg_count(html) == 4 and answer["decision"].upper() in html


def test_cli_report_command(app, client, tmp_path, database_url, monkeypatch):
    from click.testing import CliRunner

    from advisor.cli import main

    if "report" not in main.commands:
        pytest.skip("`advisor report` is not wired into advisor/cli.py yet (snippet in docs/reports.md)")
    rec_id = post(client, example_scenario())["id"]
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("SPECADVISOR_INSTANCE", str(tmp_path))
    out = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["report", str(rec_id), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert svg_count(out.read_text(encoding="utf-8")) == 4
    missing = CliRunner().invoke(main, ["report", "999999", "--out", str(tmp_path / "x.html")])
    assert missing.exit_code != 0 and "999999" in missing.output


def test_report_of_an_open_loop_workload(client):
    scenario = example_scenario()
    scenario["workload"] = {**scenario["workload"], "concurrency": None, "requests_per_second": 2.0}
    answer = post(client, scenario)
    html = get_html(client, f"/v1/recommendations/{answer['id']}/report")
    assert svg_count(html) == 4 and "<code>workload.requests_per_second</code>" in html


def test_calibration_report_of_the_h200_run(app, client):
    from tests.reports.test_calibration_findings import h200_measurements

    run_id = _calibration_run(app, measurements=h200_measurements(), fits=[])
    html = get_html(client, f"/v1/calibrations/{run_id}/report")
    assert "No numeric measurements to plot yet" not in html
    found = html.split('<ul id="findings">')[1].split("</ul>")[0]
    assert "A verify step at k=5 (q=6) costs 1.35× a decode step at B=8 (7.07 ms vs 5.24 ms)." in found
    assert "One ngram cycle (k=3) at B=1 takes 6.33 ms, 1.28× a decode step" in found
    assert "tokens per engine step grew 241× from B=1 to B=256" in found
    plots_html = html.split('id="fit-plots"')[1].split("</div>")[0]
    assert svg_count(plots_html) == 2  # step/cycle time over batch, prefill over prompt length
    assert "verify k=3 (q=4)" in plots_html and "prompt length (tokens)" in plots_html


def test_calibration_report_draws_the_stored_step_time_fit(app, client):
    from advisor.costmodel.steptime import default_step_time_params
    from advisor.services import catalog
    from tests.reports.test_calibration_findings import h200_measurements

    with app.app_context():
        params = default_step_time_params(catalog.gpu_spec(catalog.get_gpu("H100-SXM"))).to_dict()
    fit = {"kind": "step_time", "key": "llama-3.1-8b-instruct", "params": params, "residuals": []}
    run_id = _calibration_run(app, measurements=h200_measurements(), fits=[fit])
    html = get_html(client, f"/v1/calibrations/{run_id}/report")
    plots_html = html.split('id="fit-plots"')[1].split("</div>")[0]
    assert "(no fitted values stored for these points)" not in plots_html.split("</figure>")[0]
    # and without a stored fit the same plot says so
    bare_id = _calibration_run(app, measurements=h200_measurements(), fits=[])
    bare = get_html(client, f"/v1/calibrations/{bare_id}/report").split('id="fit-plots"')[1]
    assert "(no fitted values stored for these points)" in bare.split("</figure>")[0]


def test_calibration_report_of_the_cpu_run_plots_acceptance_per_position(app, client):
    import json
    from pathlib import Path

    path = Path(__file__).parents[1] / "calibration" / "data" / "probe_run_smollm2_cpu.jsonl"
    measurements = [json.loads(line) for line in path.read_text().splitlines()]
    run_id = _calibration_run(app, measurements=measurements, fits=[])
    html = get_html(client, f"/v1/calibrations/{run_id}/report")
    plots_html = html.split('id="fit-plots"')[1].split("</div>")[0]
    assert svg_count(plots_html) == 7  # step time, prefill, acceptance for 2 engines × their temperatures
    assert "acceptance: ngram-k4, T=0.7" in plots_html and "draft position" in plots_html
    assert "A verify step at k=4 (q=5) costs 2.12× a decode step at B=8" in html


def test_calibration_report_with_a_step_fit_of_another_shape_still_renders(app, client):
    from tests.reports.test_calibration_findings import h200_measurements

    fit = {"kind": "step_time", "key": "llama-3.1-8b-instruct", "params": {"alpha": 1}, "residuals": []}
    run_id = _calibration_run(app, measurements=h200_measurements(), fits=[fit])
    html = get_html(client, f"/v1/calibrations/{run_id}/report")
    assert "(no fitted values stored for these points)" in html.split('id="fit-plots"')[1].split("</figure>")[0]


def test_calibration_report_says_how_far_the_host_cores_speed_moved(app, client):
    """A GPU run's host_speed record (the plan on the lent H200, 2026-12-04) reaches the run's page as a sentence,
    and a plot of its 229 readings, which do not flood the measurements table."""
    import gzip
    import json

    from tests.conftest import REPO

    path = REPO / "benchmarks/data/h200-vllm0.24-host-speed/calibration/calibration.jsonl.gz"
    record = next(r for r in map(json.loads, gzip.open(path).read().decode().splitlines()) if r["probe"] == "host_speed")
    run_id = _calibration_run(app, measurements=[record])
    html = get_html(client, f"/v1/calibrations/{run_id}/report")
    assert "The host&#39;s cores ran 1.59× apart in speed over the run" in html or \
        "The host's cores ran 1.59× apart in speed over the run" in html
    row = html.split('<table id="measurements">')[1].split("</table>")[0]
    assert "host_speed" in row and len(row) < 4000, len(row)
    assert "host_speed" in html.split("<figcaption>")[-1][:40] and svg_count(html) == 2  # + the residuals


def test_report_names_the_measured_profile_that_timed_the_answer(client):
    """An answer timed by a shipped profile (no calibration run) says so on its page, links to the profile that
    times its GPU, and lists the drafters carried from another GPU's profile and those priced by a stand-in; one
    without says catalog and priors."""
    body = example_scenario(gpu="H100-SXM", vllm_version="0.24",
                            speculator={"method": "eagle3", "draft_model": "eagle3-llama-3.1-8b"})
    answer = post(client, body)
    html = get_html(client, f"/v1/recommendations/{answer['id']}/report")
    meta = html.split('<div class="meta">')[1].split("</div>")[0]
    assert ('no calibration run; timing from the measured profile <a id="engine-profile" '
            'href="/v1/engine-profiles?gpu=H100-SXM&amp;vllm_version=0.24">H100-SXM × vLLM 0.24</a>') in meta
    assert "(drafters carried: eagle-llama-3.1-8b from H200-SXM × vLLM 0.24 → H100-SXM)" in meta
    (profile,) = client.get("/v1/engine-profiles?gpu=H100-SXM&vllm_version=0.24").get_json()
    assert profile["name"] == answer["engine_profile"]["name"]
    untimed = post(client, {**body, "gpu": "H200-SXM", "target_model": "qwen3-32b",
                            "speculator": {"method": "draft_model", "draft_model": "qwen3-0.6b"}})
    html = get_html(client, f"/v1/recommendations/{untimed['id']}/report")
    assert "(qwen3-0.6b priced by the fit of llama-3.2-1b-instruct)" in html.split('<div class="meta">')[1]
    assert untimed["engine_profile"]["drafters_stand_in"] == {"qwen3-0.6b": "llama-3.2-1b-instruct"}
    plain = post(client, {**body, "vllm_version": None})
    html = get_html(client, f"/v1/recommendations/{plain['id']}/report")
    assert "no calibration run (catalog and priors)" in html and 'id="engine-profile"' not in html
