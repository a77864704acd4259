"""A calibration's timing fit pools the newest earlier runs of the same conditions (calibration.jobs.pooled_runs):
which runs qualify, through both sinks, and what the stored run says. Data: run 14's two calibrations of one H200
lease (benchmarks/data/h200-vllm0.24-run14{,-second}), whose own fits predict the closed loop within 13.4 and
15.1 %, and 11.3 % pooled (tests/calibration/test_gpu_data.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibration import fit, jobs

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data"
RUNS = (DATA / "h200-vllm0.24-run14", DATA / "h200-vllm0.24-run14-second")
REQUEST = {"hardware": "H200-SXM", "target_model": "llama-3.1-8b-instruct", "method": "draft_model",
           "draft_model": "llama-3.2-1b-instruct", "num_speculative_tokens": 3,
           "engine": {"load_format": "dummy"}}


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "calibration.jsonl").read_text().splitlines() if line.strip()]


def _environment(run: Path) -> dict:
    return json.loads((run / "calibration-run.json").read_text())["environment"]


def test_pool_runs_joins_later_runs_timings_under_the_first_runs_checkpoints():
    first, second = _records(RUNS[0]), _records(RUNS[1])
    pooled = fit.pool_runs([first, second], fit.POOLED_PROBES)
    timing = [r for r in second if r["probe"] in fit.POOLED_PROBES]
    assert len(pooled) == len(first) + len(timing) and len(timing) < len(second)  # no memory records of the second
    paths = {m for r in pooled for m in fit._engine_paths(r)}
    assert paths == {m for r in first for m in fit._engine_paths(r)}  # /tmp/w2/shapes/… became /tmp/w/shapes/…
    assert not [p for p in paths if p.startswith("/tmp/w2/")]
    assert fit.pool_runs([first, second]) == fit.pool_runs([first, second], None)
    assert len(fit.pool_runs([first, second])) == len(first) + len(second)


def test_pool_key_separates_what_timing_depends_on_and_not_the_host_name():
    records = [r for r in _records(RUNS[0]) if r["probe"] in fit.POOLED_PROBES]
    env = _environment(RUNS[0])
    key = fit.pool_key(REQUEST, env, records)
    assert fit.pool_key(REQUEST, {**env, "hostname": "another-node"}, records) == key
    assert fit.pool_key(REQUEST, _environment(RUNS[1]), [r for r in _records(RUNS[1])
                                                         if r["probe"] in fit.POOLED_PROBES]) == key

    def ran_with(**settings) -> list[dict]:  # the engines' recorded settings (they win over the request's)
        return [{**r, "params": {**r["params"], "engine": {**r["params"]["engine"], **settings}}} for r in records]

    for other in (fit.pool_key(REQUEST, {**env, "vllm_version": "0.25.0"}, records),
                  fit.pool_key(REQUEST, {**env, "gpu_name": "NVIDIA H100 80GB HBM3"}, records),
                  fit.pool_key(REQUEST, {**env, "cpu_model": "AMD EPYC 9654"}, records),
                  fit.pool_key({**REQUEST, "method": "ngram"}, env, records),
                  fit.pool_key({**REQUEST, "draft_model": "qwama-0.5b-instruct"}, env, records),
                  fit.pool_key(REQUEST, env, ran_with(enforce_eager=True)),
                  fit.pool_key(REQUEST, env, ran_with(quantization="fp8")),
                  fit.pool_key(REQUEST, env, ran_with(tensor_parallel_size=2)),
                  fit.pool_key(REQUEST, env, ran_with(kv_cache_dtype="fp8"))):
        assert other != key
    # where the records do not say, the request's engine settings count
    bare = [{**r, "params": {**r["params"], "engine": {"model": r["params"]["engine"]["model"]}}} for r in records]
    assert fit.pool_key({**REQUEST, "engine": {"tensor_parallel_size": 2}}, env, bare) != fit.pool_key(REQUEST, env,
                                                                                                      bare)


def _stored_run(run: Path, environment: dict | None = None, **request_changes) -> int:
    """A succeeded run holding ``run``'s records, as ``advisor calibrate`` leaves one (no fits needed here)."""
    from advisor.schemas import CalibrationRequestSchema
    from advisor.services import calibrations

    request = CalibrationRequestSchema().load({**REQUEST, **request_changes})
    stored = calibrations.create(request, external=True)
    calibrations.record(stored, {"environment": environment or _environment(run), "measurements": _records(run)})
    calibrations.record(stored, {"status": "succeeded"})
    return stored.id


def _earlier_runs() -> dict[str, int]:
    """Four earlier runs, oldest first: one of another vLLM version, run 14's first calibration, an n-gram run, run
    14's first again (the newest)."""
    ids = {}
    ids["other_version"] = _stored_run(RUNS[0], {**_environment(RUNS[0]), "vllm_version": "0.25.0"})
    ids["first"] = _stored_run(RUNS[0])
    ids["ngram"] = _stored_run(RUNS[0], method="ngram", draft_model=None)
    ids["first_again"] = _stored_run(RUNS[0])
    return ids


def test_a_run_pools_the_newest_earlier_runs_of_its_conditions_through_the_database(app, client):
    from advisor.schemas import CalibrationRequestSchema
    from advisor.services import calibrations

    with app.app_context():
        ids = _earlier_runs()
        request = CalibrationRequestSchema().load(REQUEST)
        new = calibrations.create(request, external=True)
        sink = jobs.DbSink(new.id)
        records, env = _records(RUNS[1]), _environment(RUNS[1])
        pooled = jobs.pooled_runs(request, env, records, sink)
        assert [r.run_id for r in pooled] == [ids["first_again"], ids["first"]]  # newest first; not 0.25, not n-gram
        assert all(r["probe"] in fit.POOLED_PROBES for run in pooled for r in run.records)
        assert jobs.pooled_runs({**request, "pool_earlier_runs": False}, env, records, sink) == []
        assert jobs.pooled_runs(request, env, [r for r in records if r["probe"] == "memory"], sink) == []

        calibrations.record(new, {"environment": env, "measurements": records})
        assert jobs.finish(request, env, records, sink) == "succeeded"
        run = calibrations.get(new.id)
        assert run.message.endswith(f"timing pooled with earlier runs {ids['first_again']}, {ids['first']} "
                                    "(same conditions)")
        stored = {(f.kind, f.key): f.params for f in run.fits}
        expected = {(f["kind"], f["key"]): f["params"] for f in jobs.fit_records(
            request, fit.pool_runs([records] + [_records(RUNS[0])] * 2, fit.POOLED_PROBES), sink)}
        for (kind, key), params in stored.items():
            if kind in fit.POOLED_PROBES:
                assert params["source"] == f"calibration; timing pooled with runs {ids['first_again']}, {ids['first']}"
                assert params == {**expected[kind, key], "source": params["source"]}
        alone = {(f["kind"], f["key"]): f["params"] for f in jobs.fit_records(request, records, sink)}
        target = ("step_time", "llama-3.1-8b-instruct")
        assert stored[target]["proposer_overhead_s"] != pytest.approx(alone[target]["proposer_overhead_s"], rel=0.01)
        # the answer for this hardware and target now comes from the pooled run
        assert calibrations.calibration_for("H200-SXM", "llama-3.1-8b-instruct").run_id == new.id


def test_a_remote_node_pools_through_the_api(app, client, auth, monkeypatch):
    """``advisor calibrate --server``: the node reads the earlier runs with GET /v1/calibrations (the same choice)."""
    with app.app_context():
        ids = _earlier_runs()
    uploader = jobs.HttpSink("http://service", auth["Authorization"].split()[1], run_id=0)

    def call(method, path, body=None):
        response = client.open(path, method=method, json=body, headers=auth)
        assert response.status_code < 300, response.get_json()
        return response.get_json()

    monkeypatch.setattr(uploader, "call", call)
    request = {**REQUEST, "pool_earlier_runs": True}
    uploader.run_id = call("POST", "/v1/calibrations", {**request, "external": True})["id"]
    records, env = _records(RUNS[1]), _environment(RUNS[1])
    pooled = jobs.pooled_runs(request, env, records, uploader)
    assert [r.run_id for r in pooled] == [ids["first_again"], ids["first"]]
    assert len(pooled[0].records) == len([r for r in _records(RUNS[0]) if r["probe"] in fit.POOLED_PROBES])
