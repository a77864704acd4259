"""POST/GET /v1/recommendations: round trips through the API and the database, on SQLite and PostgreSQL."""
from __future__ import annotations

import csv
import io
import json

import pytest

from tests.conftest import example_scenario


def post(client, body, **kw):
    return client.post("/v1/recommendations", json=body, **kw)


def test_example_request_returns_a_stored_answer(app, client):
    response = post(client, example_scenario())
    assert response.status_code == 201, response.get_json()
    answer = response.get_json()
    for key in ("decision", "reasons", "speedup", "num_speculative_tokens", "tpot_ms", "ttft_ms", "latency_ms",
                "throughput_tok_s", "memory", "tco", "vllm", "provenance", "curve", "dynamic_sd"):
        assert key in answer, key
    assert answer["decision"] in ("go", "no-go", "calibrate")
    assert answer["speedup"]["low"] <= answer["speedup"]["expected"] <= answer["speedup"]["high"]
    assert answer["num_speculative_tokens"] == 2  # given in the scenario
    assert answer["provenance"]["acceptance.mean_acceptance_length"] == "input"
    assert answer["scenario"]["workload"]["concurrency"] == 8

    fetched = client.get(f"/v1/recommendations/{answer['id']}")
    assert fetched.status_code == 200
    assert fetched.get_json() == answer  # what was stored is what was answered

    from advisor.extensions import db
    from advisor.models import Recommendation

    with app.app_context():
        row = db.session.get(Recommendation, answer["id"])
        assert row.inputs["speculator"]["draft_model"] == "eagle-llama-3.1-8b"
        assert {k: answer.get(k) for k in row.answer} == row.answer  # nothing of the answer is lost
        assert row.decision == answer["decision"]


def test_without_a_speculator_the_advisor_answers_with_the_best_candidate(client):
    """No speculator named: every candidate that fits the target is answered as if named, and the answer is the
    best one's (decision, then the speedup's lower bound, then its expectation), stored with the choice, so the
    stored scenario gives the same answer when sent again."""
    body = example_scenario(gpu="H200-SXM", vllm_version="0.24",
                            workload={"prompt_tokens": 2048, "output_tokens": 512, "temperature": 0.7,
                                      "structure": "code", "concurrency": 32})
    del body["speculator"], body["acceptance"]
    response = post(client, body)
    assert response.status_code == 201, response.get_json()
    answer = response.get_json()
    choice = answer["speculator_choice"]
    candidates = {(c["method"], c.get("draft_model")) for c in choice["candidates"]}
    assert {("ngram", None), ("eagle", "eagle-llama-3.1-8b"), ("eagle3", "eagle3-llama-3.1-8b"),
            ("draft_model", "llama-3.2-1b-instruct")} <= candidates
    rank = {"go": 2, "calibrate": 1, "no-go": 0}
    best = max(choice["candidates"], key=lambda c: (rank[c["decision"]], c["low"], c["expected"]))
    assert choice["chosen"] == {k: v for k, v in best.items() if k in ("method", "draft_model")}
    assert answer["scenario"]["speculator"] == choice["chosen"]
    assert (answer["decision"], answer["speedup"]["low"]) == (best["decision"], best["low"])
    assert answer["provenance"]["speculator"].startswith("advisor: the best of")
    # the H200 x vLLM 0.24 profile: the separate draft model loses there (no CUDA graphs, no async scheduling)
    assert next(c for c in choice["candidates"] if c["method"] == "draft_model")["decision"] == "no-go"
    assert client.get(f"/v1/recommendations/{answer['id']}").get_json() == answer
    page = client.get(f"/v1/recommendations/{answer['id']}/report").get_data(as_text=True)
    assert 'id="speculator-choice"' in page and "eagle3-llama-3.1-8b" in page and "llama-3.2-1b-instruct" in page
    named = post(client, answer["scenario"]).get_json()
    assert named["speedup"] == answer["speedup"] and "speculator_choice" not in named
    for candidate in choice["candidates"]:  # each row is what naming that candidate answers
        one = post(client, {**body, "speculator": {k: v for k, v in candidate.items()
                                                   if k in ("method", "draft_model")}}).get_json()
        assert (one["decision"], one["speedup"]["low"], one["num_speculative_tokens"]) == \
            (candidate["decision"], candidate["low"], candidate["num_speculative_tokens"])


def test_each_compared_method_is_priced_as_its_own_answer(client):
    """An answer's ``methods`` rows are what naming each method answers (the point estimate at the row's k): the
    catalog's EAGLE / EAGLE-3 head for the target, timed by the H200 profile's fit of its engine. main: a generic
    synthesized head at its method's priors, so a draft-model answer listed EAGLE-3 at 1.56x (below suffix
    decoding) where the EAGLE-3 answer said 2.77x, and EAGLE at 1.17x against 1.98x."""
    workload = {"prompt_tokens": 512, "output_tokens": 256, "temperature": 0.0, "structure": "code", "concurrency": 1}
    body = example_scenario(gpu="H200-SXM", vllm_version="0.24", workload=workload, acceptance=None,
                            speculator={"method": "draft_model", "draft_model": "llama-3.2-1b-instruct"})
    answer = post(client, body).get_json()
    rows = {row["method"]: row for row in answer["methods"]}
    assert rows["eagle3"]["drafter"] == "eagle3-llama-3.1-8b" and rows["eagle"]["drafter"] == "eagle-llama-3.1-8b"
    assert rows["eagle3"]["drafter_source"] == "catalog:eagle3-llama-3.1-8b"
    assert rows["eagle3"]["timing_source"] == rows["ngram"]["timing_source"] == "profile:H200-SXM × vLLM 0.24"
    for method, row in rows.items():
        speculator = {"method": method, "num_speculative_tokens": row["num_speculative_tokens"],
                      **({"draft_model": row["drafter"]} if row["drafter"] else {})}
        own = post(client, {**body, "speculator": speculator}).get_json()
        assert own["speedup"]["expected"] == pytest.approx(row["expected_speedup"], rel=1e-9), method
        assert own["acceptance"]["mean_acceptance_length"] == pytest.approx(row["mean_acceptance_length"], rel=1e-9)
    assert [r["method"] for r in answer["methods"]][:2] == ["eagle3", "eagle"]  # the heads beat copying here
    vicuna = post(client, example_scenario(target_model="vicuna-7b-v1.3", acceptance=None,
                                           speculator={"method": "ngram"})).get_json()
    heads = {r["method"]: r["drafter_source"] for r in vicuna["methods"] if r["drafter"]}
    assert heads == {"eagle": "catalog:eagle-vicuna-7b-v1.3",  # Vicuna's own head; no EAGLE-3 head for it
                     "eagle3": "default:synthesized head (vLLM needs a head trained for this target)"}


def test_acceptance_without_a_speculator_is_a_422_naming_the_speculator(client):
    body = example_scenario()
    del body["speculator"]
    response = post(client, body)
    assert response.status_code == 422
    assert "name that speculator" in response.get_json()["error"]["fields"]["speculator"][0]


def test_recommendations_are_immutable(app, client):
    rec_id = post(client, example_scenario()).get_json()["id"]
    from advisor.extensions import db
    from advisor.models import Recommendation

    with app.app_context():
        row = db.session.get(Recommendation, rec_id)
        row.decision = "go" if row.decision != "go" else "no-go"
        with pytest.raises(ValueError, match="immutable"):
            db.session.commit()
        db.session.rollback()
    assert client.put(f"/v1/recommendations/{rec_id}", json={}).status_code == 405


def test_same_workload_is_stored_once(app, client):
    a = post(client, example_scenario()).get_json()
    b = post(client, example_scenario()).get_json()
    assert a["id"] != b["id"] and a["workload_id"] == b["workload_id"]


def test_list_filters_and_paginates(client):
    post(client, example_scenario())
    post(client, example_scenario(gpu="H200-SXM"))
    post(client, example_scenario(gpu="A100-80GB-SXM"))
    everything = client.get("/v1/recommendations")
    assert everything.status_code == 200 and len(everything.get_json()) == 3
    only = client.get("/v1/recommendations?gpu=H200-SXM").get_json()
    assert [r["gpu"] for r in only] == ["H200-SXM"]
    page = client.get("/v1/recommendations?page=2&page_size=1")
    assert len(page.get_json()) == 1
    assert json.loads(page.headers["X-Pagination"])["total"] == 3
    decision = only[0]["decision"]
    assert all(r["decision"] == decision for r in client.get(f"/v1/recommendations?decision={decision}").get_json())
    assert client.get("/v1/recommendations?decision=maybe").status_code == 422
    assert client.get("/v1/recommendations?created_after=2999-01-01T00:00:00").get_json() == []


def test_keyset_pages_walk_the_list_without_a_count(client):
    gpus = ("H100-SXM", "H200-SXM", "A100-80GB-SXM", "L40S", "H100-SXM", "H200-SXM", "H100-SXM")
    for i, gpu in enumerate(gpus):
        post(client, example_scenario(gpu=gpu, workload={**example_scenario()["workload"], "prompt_tokens": 100 + i}))
    newest_first = client.get("/v1/recommendations?page_size=100").get_json()
    walked, after, pages = [], 2**31 - 1, 0
    while True:
        page = client.get(f"/v1/recommendations?page_size=3&after_id={after}&page=5")  # page is ignored
        assert page.status_code == 200 and "X-Pagination" not in page.headers
        rows = page.get_json()
        assert rows == newest_first[len(walked):len(walked) + 3]  # the same entries as the paged list
        walked += rows
        pages += 1
        if len(rows) < 3:
            break
        after = rows[-1]["id"]
    assert [r["id"] for r in walked] == [r["id"] for r in newest_first] and pages == 3
    h100 = [r["id"] for r in newest_first if r["gpu"] == "H100-SXM"]
    after_first = client.get(f"/v1/recommendations?gpu=H100-SXM&after_id={h100[0]}").get_json()
    assert [r["id"] for r in after_first] == h100[1:]  # filters apply to keyset pages too
    for bad in ("0", "-1", "2147483648", "x", "٣"):
        response = client.get(f"/v1/recommendations?after_id={bad}")
        assert response.status_code == 422 and "after_id" in json.dumps(response.get_json()), bad
    spec = client.get("/v1/openapi.json").get_json()
    names = {p["name"] for p in spec["paths"]["/v1/recommendations"]["get"]["parameters"]}
    assert {"after_id", "page", "page_size"} <= names


def test_open_loop_workloads_list_and_export(client):
    body = example_scenario()
    body["workload"] = {**body["workload"], "concurrency": None, "requests_per_second": 3.0}
    assert post(client, body).status_code == 201
    [row] = client.get("/v1/recommendations").get_json()
    assert row["concurrency"] > 0  # derived by Little's law
    assert client.get("/v1/recommendations/export?format=csv").status_code == 200


def test_compare_side_by_side(client):
    a = post(client, example_scenario()).get_json()["id"]
    b = post(client, example_scenario(gpu="H200-SXM")).get_json()["id"]
    body = client.get(f"/v1/recommendations/compare?ids={a},{b}").get_json()
    assert [r["id"] for r in body["recommendations"]] == [a, b]
    speedup_row = next(r for r in body["rows"] if r["quantity"] == "speedup (expected)")
    assert len(speedup_row["values"]) == 2 and all(v > 0 for v in speedup_row["values"])
    bad = client.get(f"/v1/recommendations/compare?ids={a}")
    assert bad.status_code == 422 and "ids" in bad.get_json()["error"]["fields"]
    assert client.get(f"/v1/recommendations/compare?ids={a},999999").status_code == 404


def test_export_csv_has_the_documented_columns(client):
    from advisor.services.recommendations import EXPORT_COLUMNS

    post(client, example_scenario())
    post(client, example_scenario(gpu="L40S"))
    response = client.get("/v1/recommendations/export?format=csv&gpu=L40S")
    assert response.status_code == 200 and response.mimetype == "text/csv"
    rows = list(csv.DictReader(io.StringIO(response.get_data(as_text=True))))
    assert tuple(rows[0].keys()) == EXPORT_COLUMNS
    assert [r["gpu"] for r in rows] == ["L40S"]
    as_json = client.get("/v1/recommendations/export?format=json").get_json()
    assert len(as_json) == 2 and set(as_json[0]) == set(EXPORT_COLUMNS)


def test_lists_and_exports_say_where_the_timing_came_from(client):
    """``timing_source`` (column 21): the catalog's defaults, or the measured profile a scenario naming its vLLM
    version was timed by (its own GPU's, or carried), as the answer's provenance says; in the list, the JSON
    export and the CSV alike. An empty calibration_run_id no longer reads as "catalog and priors" for both."""
    ids = {name: post(client, example_scenario(gpu=gpu, vllm_version=version)).get_json()["id"]
           for name, gpu, version in (("default", "H100-SXM", None), ("own", "H100-SXM", "0.24"),
                                      ("carried", "L40S", "0.24.1"))}
    want = {ids["default"]: "default", ids["own"]: "profile:H100-SXM × vLLM 0.24",
            ids["carried"]: "profile:H100-SXM × vLLM 0.24 → L40S"}
    listed = {r["id"]: r["timing_source"] for r in client.get("/v1/recommendations").get_json()}
    exported = {r["id"]: r["timing_source"] for r in client.get("/v1/recommendations/export?format=json").get_json()}
    rows = csv.DictReader(io.StringIO(client.get("/v1/recommendations/export?format=csv").get_data(as_text=True)))
    assert listed == exported == {int(r["id"]): r["timing_source"] for r in rows} == want
    for rec_id, source in want.items():
        answer = client.get(f"/v1/recommendations/{rec_id}").get_json()
        assert answer["provenance"]["tpot_ms.baseline"] == source and answer["calibration_run_id"] is None


def test_unknown_recommendation_is_404_in_the_envelope(client):
    response = client.get("/v1/recommendations/424242")
    assert response.status_code == 404
    assert response.get_json()["error"]["code"] == "not_found"



def test_get_sends_the_stored_texts_as_they_are_non_ascii_too(app, client):
    """GET by id joins the stored JSON texts of the scenario and the answer without parsing them (SQLite reads them
    as their UTF-8 bytes): a text with non-ASCII characters comes back as the same characters, in POST's shape."""
    import sqlalchemy as sa

    from advisor.extensions import db
    from advisor.models import Recommendation

    rec = post(client, example_scenario()).get_json()
    table = Recommendation.__table__
    inputs = '{"gpu": "H100-SXM", "note": "café → 速い 🚀"}'
    answer = '{"decision": "go", "reasons": ["naïve ✓", "\\u00e9 escaped"]}'
    with app.app_context(), db.engine.begin() as conn:
        row = conn.execute(sa.select(table).where(table.c.id == rec["id"])).mappings().one()

        def text(name: str, value: str):  # noqa: ANN202  (stored verbatim: json keeps its text on PostgreSQL)
            literal = sa.literal(value, sa.Text())
            return sa.cast(literal, table.c[name].type) if conn.dialect.name == "postgresql" else literal

        values = {k: v for k, v in row.items() if k not in ("id", "inputs", "answer")}
        new_id = conn.execute(sa.insert(table).values(**values, inputs=text("inputs", inputs),
                                                      answer=text("answer", answer)).returning(table.c.id)).scalar_one()
    response = client.get(f"/v1/recommendations/{new_id}")
    assert response.status_code == 200
    head = json.dumps({"id": new_id, "created_at": rec["created_at"], "workload_id": rec["workload_id"],
                       "scenario": None})[:-len("null}")]
    assert response.get_data() == (head + inputs + ", " + answer[1:]).encode()
    assert response.get_json()["scenario"]["note"] == "café → 速い 🚀"


def test_token_only_mode(app, client, auth):
    app.config["OPEN_RECOMMENDATIONS"] = False
    try:
        denied = post(client, example_scenario())
        assert denied.status_code == 401 and denied.get_json()["error"]["code"] == "unauthorized"
        assert post(client, example_scenario(), headers={"Authorization": "Bearer sa_wrong"}).status_code == 401
        assert post(client, example_scenario(), headers=auth).status_code == 201
    finally:
        app.config["OPEN_RECOMMENDATIONS"] = True


def test_a_gpu_without_a_profile_gets_its_vllm_versions_profile_carried(client):
    """An A100 scenario naming vLLM 0.24 is timed by 0.24's profile from the measured GPU nearest in bandwidth (the
    H100's), carried to the A100, and the stored answer says so, its EAGLE-3 head's fit with it; a drafter the H100
    did not time (the EAGLE head) comes from the H200's profile, carried too; another vendor's GPU gets none."""
    body = example_scenario(gpu="A100-80GB-SXM", vllm_version="0.24",
                            speculator={"method": "draft_model", "draft_model": "llama-3.2-1b-instruct",
                                        "num_speculative_tokens": 3})
    answer = post(client, body).get_json()
    profile = answer["engine_profile"]
    assert (profile["name"], profile["gpu"], profile["applied_to"]) == (
        "H100-SXM × vLLM 0.24 → A100-80GB-SXM", "H100-SXM", "A100-80GB-SXM")
    assert profile["drafters_carried"] == {"eagle-llama-3.1-8b": "H200-SXM × vLLM 0.24 → A100-80GB-SXM"}
    assert answer["provenance"]["step_ms.decode"] == "profile:H100-SXM × vLLM 0.24 → A100-80GB-SXM"
    assert any(r.startswith("timing from the measured profile H100-SXM × vLLM 0.24 → A100-80GB-SXM (measured on "
                            "H100-SXM, applied to A100-80GB-SXM") for r in answer["reasons"])
    plain = post(client, {**body, "vllm_version": None}).get_json()
    assert plain["engine_profile"] is None and answer["speedup"]["expected"] < plain["speedup"]["expected"]
    assert client.get(f"/v1/recommendations/{answer['id']}").get_json()["engine_profile"] == profile
    eagle = post(client, {**body, "speculator": {"method": "eagle", "draft_model": "eagle-llama-3.1-8b"}}).get_json()
    assert any("its engine is timed by H200-SXM × vLLM 0.24 → A100-80GB-SXM" in r for r in eagle["reasons"])
    eagle3 = post(client, {**body, "speculator": {"method": "eagle3", "draft_model": "eagle3-llama-3.1-8b"}}).get_json()
    assert eagle3["provenance"]["tpot_ms.speculative"] == "profile:H100-SXM × vLLM 0.24 → A100-80GB-SXM"
    assert post(client, {**body, "gpu": "MI300X"}).get_json()["engine_profile"] is None


def test_heads_that_do_not_divide_over_the_gpus_are_a_422_naming_the_field(client):
    body = {**example_scenario(), "target_model": "vicuna-7b-v1.3", "gpu_count": 8,
            "speculator": {"method": "draft_model", "draft_model": "vicuna-68m"}}
    body.pop("acceptance", None)
    response = post(client, body)
    assert response.status_code == 422 and "speculator.draft_model" in response.get_json()["error"]["fields"]
    assert post(client, {**body, "gpu_count": 4}).status_code == 201
    unnamed = {k: v for k, v in body.items() if k != "speculator"}  # the advisor skips the drafter it cannot shard
    chosen = post(client, unnamed).get_json()["speculator_choice"]["candidates"]
    assert "vicuna-68m" not in {c.get("draft_model") for c in chosen} and chosen
    small = {**unnamed, "target_model": "smollm2-135m-instruct", "gpu_count": 2}
    response = post(client, small)
    assert response.status_code == 422 and "gpu_count" in response.get_json()["error"]["fields"]
