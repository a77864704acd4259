"""Calibration jobs: run the probes in a child process, stream what they measure into a sink, fit, finish.

Entry points:
- ``run_calibration(run_id)``: the RQ job (``advisor worker`` on a GPU node; needs DATABASE_URL);
- ``python -m calibration.jobs RUN_ID``: the same, as the service's background process when there is no Redis;
- ``execute(request, sink)``: shared by both and by ``advisor calibrate`` (local DB or ``--server`` upload).
A run whose probe process fails (engine OOM at start, crash, time-out) ends ``failed`` with the error and
keeps every measurement already streamed.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Iterator, NamedTuple, Protocol

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 1.0
POOL_SCAN = 20  # the newest succeeded runs of a hardware looked at for pooling (calibration.fit.POOL_RUNS are taken)


class Sink(Protocol):
    """Where a run's updates go: the database (``DbSink``) or a remote service (``HttpSink``)."""

    def record(self, update: dict[str, Any]) -> None: ...

    def specs(self, request: dict[str, Any]) -> tuple[Any, Any, Any]: ...

    def earlier_runs(self, request: dict[str, Any]) -> Iterator[EarlierRun]:
        """Succeeded runs of the request's hardware, target, method and drafter, newest first."""
        ...


class EarlierRun(NamedTuple):
    """A succeeded run whose timing records a new run's fit may pool (``calibration.fit.pool_key`` decides)."""

    run_id: int
    config: dict[str, Any]
    environment: dict[str, Any]
    records: list[dict[str, Any]]


def _same_run_kind(request: dict[str, Any], run: dict[str, Any]) -> bool:
    return all(run.get(k) == request.get(k) for k in ("hardware", "target_model", "method", "draft_model"))


class DbSink:
    """Writes into this service's database through ``advisor.services.calibrations`` (needs an app context)."""

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id

    def record(self, update: dict[str, Any]) -> None:
        from advisor.services import calibrations

        calibrations.record(calibrations.get(self.run_id), update)

    def specs(self, request: dict[str, Any]) -> tuple[Any, Any, Any]:
        from advisor.services import catalog

        gpu = catalog.gpu_spec(catalog.require_gpu(request["hardware"], "hardware"))
        target = catalog.model_spec(catalog.require_model(request["target_model"], "target_model"))
        draft = request.get("draft_model")
        return gpu, target, catalog.model_spec(catalog.require_model(draft, "draft_model")) if draft else None

    def earlier_runs(self, request: dict[str, Any]) -> Iterator[EarlierRun]:
        from advisor.services import calibrations
        from .fit import POOLED_PROBES

        for run in calibrations.list_runs(request["hardware"], "succeeded")[:POOL_SCAN]:
            if run.id != self.run_id and _same_run_kind(request, {
                    "hardware": run.hardware, "target_model": run.target_model, "method": run.method,
                    "draft_model": run.draft_model}):
                yield EarlierRun(run.id, run.config or {}, run.environment or {},
                                 [{"probe": m.probe, "params": m.params, "values": m.values} for m in run.measurements
                                  if m.probe in POOLED_PROBES])  # only timing records pool


class HttpSink:
    """Uploads to a remote service: ``PATCH /v1/calibrations/<id>`` with a token."""

    def __init__(self, server: str, token: str, run_id: int) -> None:
        self.server, self.token, self.run_id = server.rstrip("/"), token, run_id

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        request = urllib.request.Request(
            self.server + path, method=method, data=json.dumps(body).encode() if body is not None else None,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:2000]
            raise RuntimeError(f"{method} {path} -> {exc.code}: {detail}") from None

    def record(self, update: dict[str, Any]) -> None:
        self.call("PATCH", f"/v1/calibrations/{self.run_id}", update)

    def specs(self, request: dict[str, Any]) -> tuple[Any, Any, Any]:
        from advisor.costmodel import GpuSpec, ModelSpec

        gpu = GpuSpec.from_dict(self.call("GET", f"/v1/gpus/{request['hardware']}"))
        target = ModelSpec.from_dict(self.call("GET", f"/v1/models/{request['target_model']}"))
        draft = request.get("draft_model")
        return gpu, target, ModelSpec.from_dict(self.call("GET", f"/v1/models/{draft}")) if draft else None

    def earlier_runs(self, request: dict[str, Any]) -> Iterator[EarlierRun]:
        query = urllib.parse.urlencode({"hardware": request["hardware"], "status": "succeeded"})
        for row in self.call("GET", f"/v1/calibrations?{query}")[:POOL_SCAN]:
            if row["id"] != self.run_id and _same_run_kind(request, row):
                run = self.call("GET", f"/v1/calibrations/{row['id']}")
                yield EarlierRun(run["id"], run.get("config") or {}, run.get("environment") or {},
                                 run.get("measurements") or [])


def execute(request: dict[str, Any], sink: Sink, timeout_s: float | None = None) -> str:
    """Probe (child process), stream into ``sink``, fit, and return the final status."""
    records: list[dict[str, Any]] = []
    environment: dict[str, Any] = {}
    done: dict[str, Any] | None = None
    last_progress = 0.0
    sink.record({"status": "running", "message": "starting the probe process"})
    with tempfile.TemporaryFile(mode="w+") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "calibration.runner", json.dumps(request)],
                                stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True)
        timer = threading.Timer(timeout_s, _kill, (proc,)) if timeout_s else None
        if timer:
            timer.start()
        try:
            for line in proc.stdout:  # type: ignore[union-attr]
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue
                kind = event.get("event")
                if kind == "environment":
                    environment = event["environment"]
                    sink.record({"environment": environment})
                elif kind == "measurement":
                    records.append(event["record"])
                    sink.record({"measurements": [event["record"]]})
                elif kind == "progress" and time.monotonic() - last_progress >= PROGRESS_EVERY_S:
                    last_progress = time.monotonic()
                    sink.record({"progress": round(0.95 * float(event["progress"]), 4), "message": event["message"]})
                elif kind == "done":
                    done = event
            returncode = proc.wait()
        finally:
            if timer:
                timer.cancel()
            if proc.poll() is None:
                _kill(proc)
        stderr.seek(0)
        stderr_tail = stderr.read()[-3000:]
    if done is None or done.get("status") != "succeeded":
        if done is not None:
            error = done.get("error") or "probe run failed"
        elif timeout_s and returncode in (-signal.SIGKILL, -signal.SIGTERM):
            error = f"timed out after {timeout_s:.0f} s"
        else:
            error = f"the probe process died (exit code {returncode})"
        sink.record({"status": "failed", "error": f"{error}\n--- probe log (tail) ---\n{stderr_tail}",
                     "message": f"failed after {len(records)} measurements"})
        return "failed"
    return finish(request, environment, records, sink)


def finish(request: dict[str, Any], environment: dict[str, Any], records: list[dict[str, Any]], sink: Sink) -> str:
    """A probe run that succeeded: fit its records (timings pooled with earlier runs', :func:`pooled_runs`), store
    the fits and end the run; a fit that fails ends it ``failed`` with its measurements kept."""
    from .fit import POOLED_PROBES, pool_runs

    pooled = pooled_runs(request, environment, records, sink)  # their timing records only
    try:
        fits = fit_records(request, pool_runs([records, *(run.records for run in pooled)]), sink)
    except Exception as exc:  # noqa: BLE001  (a fit that fails still leaves the measurements)
        log.exception("fitting failed")
        sink.record({"status": "failed", "error": f"fitting failed: {type(exc).__name__}: {exc}"})
        return "failed"
    ids = ", ".join(str(run.run_id) for run in pooled)
    if pooled:
        fits = [{**f, "params": {**f["params"], "source": f"calibration; timing pooled with runs {ids}"}}
                if f["kind"] in POOLED_PROBES else f for f in fits]
    timed = any(r.get("probe") in POOLED_PROBES for r in records)
    sink.record({"fits": fits, "status": "succeeded",
                 "message": f"{len(records)} measurements, {len(fits)} fits"
                            + (f"; timing pooled with earlier runs {ids} (same conditions)" if pooled else "")
                            + ("" if timed else "; no timing probes: answers take their timing from the newest run "
                                                "that timed this target")})
    return "succeeded"


def pooled_runs(request: dict[str, Any], environment: dict[str, Any], records: list[dict[str, Any]],
                sink: Sink) -> list[EarlierRun]:
    """The newest earlier runs (``POOL_RUNS`` at most) whose timings this run's fit pools: succeeded, of the same
    :func:`calibration.fit.pool_key` (hardware, target, method, drafter, engine dtypes, TP, mode, software and
    hardware), unless the request says ``pool_earlier_runs: false``. One calibration samples one host-bound state
    per engine start; pooled runs average them (docs/calibration.md). Where the earlier runs cannot be read, the
    run fits alone."""
    from .fit import POOL_RUNS, POOLED_PROBES, pool_key

    def timing(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in rows if r.get("probe") in POOLED_PROBES]

    own = timing(records)
    if not own or not request.get("pool_earlier_runs", True):  # a run without timing probes keeps its own fits
        return []
    key, found = pool_key(request, environment, own), []
    try:
        for run in sink.earlier_runs(request):
            if (earlier := timing(run.records)) and pool_key(run.config, run.environment, earlier) == key:
                found.append(run._replace(records=earlier))
                if len(found) == POOL_RUNS:
                    break
    except Exception:  # noqa: BLE001  (pooling is an improvement; a run stands on its own records)
        log.exception("reading earlier calibration runs failed; fitting this run alone")
        return []
    return found


def fit_records(request: dict[str, Any], records: list[dict[str, Any]], sink: Sink) -> list[dict[str, Any]]:
    from .fit import fit_run, run_weights_dtype

    gpu, target, draft = sink.specs(request)
    drafter = request.get("draft_model") if request.get("method") != "ngram" else None
    models = None
    if draft is not None:  # the drafter's checkpoint as the engines named it (a path given, or a catalog shape)
        engines = [(r.get("params") or {}).get("engine", {}) for r in records]
        targets = {e.get("model") for e in engines}
        models = {spec["model"]: draft for e in engines if (spec := e.get("speculative_config") or {})
                  and spec.get("method") == request.get("method") and spec.get("model") not in targets | {None}}
    dtype = request.get("weights_dtype") or run_weights_dtype(records, request.get("engine"))
    return fit_run(records, gpu, target, draft, request.get("method", "ngram"), drafter, dtype, models=models)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the runner and vLLM's engine-core children
    except (ProcessLookupError, PermissionError):
        pass


def _app():
    from advisor import create_app

    return create_app()


def run_calibration(run_id: int) -> str:
    """The RQ job: run calibration ``run_id`` against the database of DATABASE_URL."""
    app = _app()
    with app.app_context():
        from advisor.services import calibrations

        run = calibrations.get(run_id)
        return execute(dict(run.config), DbSink(run_id), timeout_s=job_timeout_s(app))


def job_timeout_s(app) -> float:  # noqa: ANN001
    """The probe run's limit: the RQ job's own time-out, which the app that enqueued it set to its limit plus a
    margin (``JOB_TIMEOUT_MARGIN_S``), less that margin; this worker's config outside a job. One source: a limit
    set on the API side is the one the probes stop at, whatever the worker's own config says."""
    from rq import get_current_job

    from advisor.services.calibrations import JOB_TIMEOUT_MARGIN_S

    job = get_current_job()
    if job is not None and job.timeout and job.timeout > 0:
        return max(1.0, float(job.timeout) - JOB_TIMEOUT_MARGIN_S)
    return float(app.config["CALIBRATION_JOB_TIMEOUT_S"])


def on_job_failure(job, connection, exc_type, exc_value, tb) -> None:  # noqa: ANN001  (RQ's signature)
    """RQ failure callback (job time-out, worker killed): a run never stays 'running' forever."""
    app = _app()
    with app.app_context():
        from advisor.services import calibrations

        run = calibrations.get(int(job.args[0]))
        if run.status not in calibrations.FINAL_STATES:
            calibrations.record(run, {"status": "failed",
                                      "error": f"job failed: {getattr(exc_type, '__name__', exc_type)}: {exc_value}"})


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    status = run_calibration(int(sys.argv[1]))
    raise SystemExit(0 if status == "succeeded" else 1)
