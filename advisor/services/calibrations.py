"""Calibration runs: create, queue (RQ on Redis, or a background process), record, and use their fits.

The web app never imports ``calibration`` (vLLM lives there): jobs are named by their import path.
"""
from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flask import current_app
from sqlalchemy import select
from sqlalchemy.orm import Session

from .. import costmodel
from ..costmodel.memory import engine_kv_cache_dtype, engine_weights_dtype
from ..errors import ApiError
from ..extensions import db
from ..models import CalibrationRun, FittedParameters, ProbeMeasurement, utcnow
from . import catalog

log = logging.getLogger(__name__)

JOB_FUNCTION = "calibration.jobs.run_calibration"
FAILURE_CALLBACK = "calibration.jobs.on_job_failure"
JOB_TIMEOUT_MARGIN_S = 60  # RQ's limit is the probe run's plus this: time for the fit and the failure record
FINAL_STATES = ("succeeded", "failed")


def queue_name(hardware: str) -> str:
    """One RQ queue per hardware class: a GPU node's worker listens on the queue named for its GPU."""
    return "calibration-" + re.sub(r"[^A-Za-z0-9._-]+", "-", hardware).strip("-").lower()


def create(request: dict[str, Any], external: bool = False) -> CalibrationRun:
    catalog.require_gpu(request["hardware"], "hardware")  # fits need the hardware's and models' specs
    catalog.require_model(request["target_model"], "target_model")
    if request.get("draft_model"):
        catalog.require_model(request["draft_model"], "draft_model")
    run = CalibrationRun(
        hardware=request["hardware"], target_model=request["target_model"], method=request["method"],
        draft_model=request.get("draft_model"), status="running" if external else "queued",
        config=request, queue=None if external else queue_name(request["hardware"]),
        started_at=utcnow() if external else None,
    )
    db.session.add(run)
    db.session.commit()
    if not external:
        try:
            enqueue(run)
        except Exception:
            # a run nobody will ever pick up must not stay "queued": remove it, then report the cause
            db.session.rollback()
            db.session.delete(db.session.get(CalibrationRun, run.id))
            db.session.commit()
            raise
    return run


def redis_connection(url: str) -> Any:
    """A Redis client whose connect and reads time out (SPECADVISOR_REDIS_TIMEOUT_S), so a Redis that is down
    or hung is a 503 in seconds."""
    from redis import Redis

    timeout = current_app.config.get("REDIS_TIMEOUT_S", 3.0)
    return Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)


def enqueue(run: CalibrationRun) -> None:
    redis_url = current_app.config.get("REDIS_URL")
    if redis_url:
        from redis.exceptions import RedisError
        from rq import Callback, Queue

        connection = redis_connection(redis_url)
        try:
            connection.ping()
        except RedisError as exc:
            log.warning("Redis at %s unavailable: %s", redis_url, exc)
            raise ApiError(503, "The job queue (Redis) is unavailable, so the calibration was not queued; "
                                "try again shortly. /v1/health reports Redis.", "queue_unavailable") from None
        queue = Queue(run.queue, connection=connection)

        # the job kills its own probe process at the time-out (calibration.jobs.job_timeout_s reads it back from
        # the job); RQ's limit is a backstop a margin later
        try:
            job = queue.enqueue(JOB_FUNCTION, run.id,
                                job_timeout=current_app.config["CALIBRATION_JOB_TIMEOUT_S"] + JOB_TIMEOUT_MARGIN_S,
                                result_ttl=86_400, failure_ttl=7 * 86_400, on_failure=Callback(FAILURE_CALLBACK))
        except RedisError as exc:
            log.warning("Redis at %s failed while queueing: %s", redis_url, exc)
            raise ApiError(503, "The job queue (Redis) failed while queueing the calibration; nothing was "
                                "queued. Try again shortly.", "queue_unavailable") from None
        run.job_id = job.id
        run.message = f"queued on '{run.queue}'; start 'advisor worker --hardware {run.hardware}' on the node"
    else:
        # No Redis: run in a background process of the service (same interpreter, same database).
        env = {**os.environ, "DATABASE_URL": current_app.config["SQLALCHEMY_DATABASE_URI"]}
        logs = Path(current_app.config["INSTANCE_PATH"]) / "calibration-logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"run-{run.id}.log", "ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", "calibration.jobs", str(run.id)], env=env,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        run.job_id = f"pid:{proc.pid}"
        run.message = "running in a background process (no REDIS_URL configured)"
    db.session.commit()


def get(run_id: int) -> CalibrationRun:
    run = db.session.get(CalibrationRun, run_id)
    if run is None:
        raise ApiError(404, f"No calibration run with id {run_id}.")
    return run


def list_runs(hardware: str | None = None, status: str | None = None) -> list[CalibrationRun]:
    query = select(CalibrationRun).order_by(CalibrationRun.id.desc())
    if hardware:
        query = query.where(CalibrationRun.hardware == hardware)
    if status:
        query = query.where(CalibrationRun.status == status)
    return list(db.session.scalars(query))


def record(run: CalibrationRun, update: dict[str, Any]) -> CalibrationRun:
    """Append measurements and fits and move the status forward (used by jobs and by remote nodes)."""
    if run.status in FINAL_STATES:
        raise ApiError(409, f"Calibration run {run.id} is already {run.status}.")
    for m in update.get("measurements", []):
        run.measurements.append(ProbeMeasurement(probe=m["probe"], params=m["params"], values=m["values"]))
    for f in update.get("fits", []):
        run.fits.append(FittedParameters(kind=f["kind"], key=f["key"], params=f["params"],
                                         residuals=f.get("residuals", [])))
    for key in ("progress", "message", "error", "environment"):
        if key in update:
            setattr(run, key, update[key])
    status = update.get("status")
    if status:
        if status == "running" and run.started_at is None:
            run.started_at = utcnow()
        if status in FINAL_STATES:
            run.finished_at = utcnow()
            if status == "succeeded":
                run.progress = 1.0
        run.status = status
    db.session.commit()
    if status == "succeeded":
        forget_newest()  # the new calibration applies to this process's next answer at once
    return run


# The recent runs per (database, hardware, target), reused for CATALOG_CACHE_S seconds by this process.
_RECENT: dict[tuple[Any, str, str], tuple[float, list[costmodel.Calibration]]] = {}
RECENT_RUNS = 20


def forget_newest() -> None:
    _RECENT.clear()


def _recent_calibrations(hardware: str, target: str) -> list[costmodel.Calibration]:
    """The newest succeeded runs on this hardware for this target (newest first), as Calibrations; cached."""
    key, now = (db.engine.url, hardware, target), time.monotonic()
    hit = _RECENT.get(key)
    if hit is not None and now - hit[0] < current_app.config.get("CATALOG_CACHE_S", 5.0):
        return hit[1]
    if len(_RECENT) >= 4096:
        _RECENT.clear()
    # a session of its own, closed (its connection back in the pool) once the runs are converted: the request's
    # session would hold a connection until the request ended, while a POST's INSERT needs one too
    with Session(db.engine) as session:
        runs = session.scalars(
            select(CalibrationRun)
            .where(CalibrationRun.hardware == hardware, CalibrationRun.target_model == target,
                   CalibrationRun.status == "succeeded")
            .order_by(CalibrationRun.id.desc())
            .limit(RECENT_RUNS)
        )
        calibrations = [to_calibration(run) for run in runs]
    _RECENT[key] = (now, calibrations)
    return calibrations


def _composed(calibrations: list[costmodel.Calibration], target: str, drafter: str | None,
              accepts: Callable[[costmodel.Calibration], bool], method: str | None = None
              ) -> costmodel.Calibration | None:
    """Acceptance from the newest run that ``accepts`` (else the newest run), timing from the run that timed the
    target with ``drafter`` (``costmodel.timing_run``): a node's timing run (random weights) and its acceptance run
    on the user's prompts are two runs."""
    if not calibrations:
        return None
    base = next((cal for cal in calibrations if accepts(cal)), calibrations[0])
    timing = costmodel.timing_run(calibrations, target, drafter, method)
    return base.with_timing(timing) if timing is not None else base


def plan_runs(gpu: costmodel.GpuSpec, target: str, weights_dtype: str, kv_cache_dtype: str = "auto",
              vllm_version: str | None = None) -> list[costmodel.Calibration]:
    """The succeeded runs on ``gpu`` for ``target`` measured at these weights and KV-cache dtypes (and this vLLM
    version, where one is asked), at any tensor-parallel size, newest first: what a capacity plan may use."""
    return [cal for cal in _recent_calibrations(gpu.name, target)
            if not costmodel.conditions_mismatch(cal, gpu, weights_dtype, kv_cache_dtype, vllm_version)]


def calibration_for(hardware: str, target: str, scenario: costmodel.Scenario | None = None,
                    gpu: costmodel.GpuSpec | None = None) -> costmodel.Calibration | None:
    """The calibration of this hardware and target that applies to ``scenario``, as the cost model's Calibration.

    A run measured at another weights dtype, tensor-parallel size, engine mode or vLLM version is skipped (never
    substituted). Among the runs that apply, acceptance comes from the newest one that measured the scenario's own
    method, drafter and structure (else the newest one), and timing from the newest one that timed the target (with
    the scenario's drafter, where one did): the two may be different runs. The cost model then takes only the fits
    keyed by what was measured."""
    calibrations = _recent_calibrations(hardware, target)
    if scenario is None or gpu is None:
        return _composed(calibrations, target, None, lambda cal: bool(cal.acceptance))
    sp = scenario.speculator
    drafter = None if sp.method in ("ngram", "suffix") else sp.draft_model
    usable = [cal for cal in calibrations if not costmodel.calibration_mismatch(cal, scenario, gpu)]
    return _composed(usable, target, drafter, lambda cal: costmodel.calibrated_acceptance(
        cal, sp.method, drafter, scenario.workload.structure) is not None, sp.method)


def measured_conditions(config: dict[str, Any], engine: dict[str, Any]) -> dict[str, Any]:
    """Weights dtype, KV-cache dtype, tensor-parallel size and engine mode a run measured under, from the engine settings its
    probes recorded (else the request's); None where not recorded (e.g. dtype 'auto' = the checkpoint's)."""
    settings = {**(config.get("engine") or {}), **(engine or {})}
    dtype = config.get("weights_dtype") or engine_weights_dtype(settings)
    eager = settings.get("enforce_eager")
    return {"weights_dtype": dtype, "kv_cache_dtype": engine_kv_cache_dtype(settings),
            "tensor_parallel_size": int(settings["tensor_parallel_size"]) if settings.get("tensor_parallel_size")
            else None,
            "engine_mode": None if eager is None else ("eager" if eager else "graphs")}


def measured_drafter(config: dict[str, Any], method: str, target: str) -> str | None:
    """The drafter an acceptance fit was really measured with. A draft-model run without its own draft checkpoint
    (``draft_model_path`` absent or 'self') had the target draft for itself: its fits belong to the target's own
    name, never to the draft model the request named."""
    if method in ("ngram", "suffix"):
        return None
    if method == "draft_model" and (config.get("draft_model_path") in (None, "", "self")):
        return target
    return config.get("draft_model")


def to_calibration(run: CalibrationRun) -> costmodel.Calibration:
    by_kind: dict[str, dict[str, Any]] = {"step_time": {}, "prefill": {}, "acceptance": {}}
    for fit in run.fits:
        params = fit.params
        if fit.kind == "acceptance":  # keyed by what was measured (method, real drafter, structure)
            method = params.get("method") or fit.key.split("|")[0]
            drafter = measured_drafter(run.config, method, run.target_model)
            structure = params.get("structure") or fit.key.split("|")[-1]
            params = {**params, "method": method, "drafter": drafter, "structure": structure}
            by_kind["acceptance"][costmodel.acceptance_key(method, drafter, structure)] = params
            continue
        by_kind.setdefault(fit.kind, {})[fit.key] = params
    temperatures = run.config.get("temperatures") or [0.0]
    engine = next((m.params.get("engine") for m in run.measurements if (m.params or {}).get("engine")), {})
    drafter = run.draft_model if run.method not in ("ngram", "suffix") else None
    step = by_kind["step_time"].get(drafter)
    if run.method == "draft_model" and step is not None and not step.get("proposer_layers"):
        # a fit stored or uploaded without the depth it was timed at: the catalog's depth of the drafter it timed
        model = catalog.find_model(drafter)
        if model is not None:
            by_kind["step_time"][drafter] = {**step, "proposer_layers": int(model.num_layers)}
    return costmodel.Calibration.from_dict({
        "run_id": run.id, "hardware": run.hardware,
        "drafter_methods": {drafter: run.method} if drafter in by_kind["step_time"] else {},
        "step_time": by_kind["step_time"], "prefill": by_kind["prefill"], "acceptance": by_kind["acceptance"],
        "max_batch_calibrated": max(run.config.get("batch_sizes") or [1]),
        "temperature_range": [min(temperatures), max(temperatures)],
        **measured_conditions(run.config, engine),
        "vllm_version": (run.environment or {}).get("vllm_version"),
    })


def catalog_specs(run: CalibrationRun) -> tuple[costmodel.GpuSpec, costmodel.ModelSpec] | None:
    """The run's hardware and target from the catalog (None when either is missing), for the report's curves."""
    gpu, model = catalog.find_gpu(run.hardware or ""), catalog.find_model(run.target_model or "")
    return (catalog.gpu_spec(gpu), catalog.model_spec(model)) if gpu and model else None
