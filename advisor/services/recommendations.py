"""Recommendation service: validated scenario -> catalog specs + calibration -> cost model -> stored answer."""
from __future__ import annotations

import hashlib
import json
from typing import Any

from sqlalchemy import Select, select

from .. import costmodel
from ..errors import ApiError, field_error
from ..extensions import db
from ..models import Recommendation, Workload
from . import calibrations, catalog


def scenario_from_dict(data: dict[str, Any]) -> costmodel.Scenario:
    """A scenario dict as loaded by ``ScenarioSchema`` -> the cost model's typed Scenario."""

    def sub(cls: type, key: str) -> Any:
        value = data.get(key)
        return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in value.items()}) if value else None

    plain = {k: v for k, v in data.items() if k not in ("speculator", "workload", "acceptance", "slo", "load")}
    return costmodel.Scenario(
        **plain,
        speculator=sub(costmodel.Speculator, "speculator"),
        workload=sub(costmodel.Workload, "workload"),
        acceptance=sub(costmodel.AcceptanceInput, "acceptance"),
        slo=sub(costmodel.Slo, "slo"),
        load=sub(costmodel.TcoLoad, "load"),
    )


def predict(data: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """Compute (without storing) the answer for a validated scenario dict: ``(answer, calibration_run_id)``."""
    scenario = scenario_from_dict(data)
    gpu_row = catalog.require_gpu(scenario.gpu)
    target_row = catalog.require_model(scenario.target_model, "target_model")
    draft_row = None
    if scenario.speculator.draft_model:
        draft_row = catalog.require_model(scenario.speculator.draft_model, "speculator.draft_model")
    gpu, target = catalog.gpu_spec(gpu_row), catalog.model_spec(target_row)
    draft = catalog.model_spec(draft_row) if draft_row is not None else None
    for issue in costmodel.check_draft(target, draft, scenario.speculator.method):
        if issue.severity == "error":
            raise field_error(issue.field, issue.message)
    calibration = calibrations.calibration_for(gpu.name, target.name, scenario, gpu)
    sources = {gpu.name: gpu_row.source, target.name: target_row.source}
    if draft_row is not None:
        sources[draft_row.name] = draft_row.source
    profile = costmodel.matching_profile(catalog.engine_profiles(), gpu, scenario.vllm_version)
    try:
        prediction = costmodel.predict(scenario, gpu, target, draft, calibration=calibration,
                                       catalog_sources=sources, profile=profile)
    except costmodel.CostModelError as exc:
        raise field_error(getattr(exc, "field", None) or "_schema", getattr(exc, "message", None) or str(exc)) from None
    answer = prediction.to_dict()
    return answer, answer.get("calibration_run_id")


def create(data: dict[str, Any]) -> Recommendation:
    answer, run_id = predict(data)
    canonical = json.dumps(data, sort_keys=True, default=str)
    fingerprint = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    workload = db.session.scalar(select(Workload).where(Workload.fingerprint == fingerprint))
    if workload is None:
        workload = Workload(fingerprint=fingerprint, scenario=json.loads(canonical))
        db.session.add(workload)
    speculator = data["speculator"]
    rec = Recommendation(
        workload=workload, gpu=data["gpu"], target_model=data["target_model"], method=speculator["method"],
        draft_model=speculator.get("draft_model"), decision=answer["decision"],
        # a deployment that cannot exist has no speedup (null in the answer); the summary column stores 0
        expected_speedup=float(answer["speedup"]["expected"] or 0.0), inputs=json.loads(canonical), answer=answer,
        cost_model_version=answer.get("cost_model_version", costmodel.COST_MODEL_VERSION),
        calibration_run_id=run_id,
    )
    db.session.add(rec)
    db.session.commit()
    return rec


def get(rec_id: int) -> Recommendation:
    rec = db.session.get(Recommendation, rec_id)
    if rec is None:
        raise ApiError(404, f"No recommendation with id {rec_id}.")
    return rec


def filtered(filters: dict[str, Any]) -> Select:
    query = select(Recommendation).order_by(Recommendation.id.desc())
    for key in ("gpu", "target_model", "method", "decision"):
        if filters.get(key):
            query = query.where(getattr(Recommendation, key) == filters[key])
    if filters.get("created_after"):
        query = query.where(Recommendation.created_at >= filters["created_after"])
    if filters.get("created_before"):
        query = query.where(Recommendation.created_at <= filters["created_before"])
    return query


def list_all(filters: dict[str, Any], limit: int | None = None) -> list[Recommendation]:
    query = filtered(filters)
    if limit:
        query = query.limit(limit)
    return list(db.session.scalars(query))


def as_dict(rec: Recommendation) -> dict[str, Any]:
    """The full stored answer: the cost model's answer plus identity and the scenario it answered."""
    return {"id": rec.id, "created_at": rec.created_at, "workload_id": rec.workload_id,
            "scenario": rec.inputs, **rec.answer}


# Stable export columns (README: "Export columns"); append only, never rename.
EXPORT_COLUMNS = (
    "id", "created_at", "gpu", "gpu_count", "target_model", "method", "draft_model", "structure", "concurrency",
    "decision", "speedup_expected", "speedup_low", "speedup_high", "num_speculative_tokens",
    "tpot_ms_baseline", "tpot_ms_speculative", "usd_per_million_output_tokens_baseline",
    "usd_per_million_output_tokens_speculative", "calibration_run_id", "cost_model_version",
)


def summary(rec: Recommendation) -> dict[str, Any]:
    """One flat row per recommendation, for lists, CSV and spreadsheets."""
    answer, inputs = rec.answer, rec.inputs
    workload = inputs.get("workload", {})
    usd = (answer.get("tco") or {}).get("usd_per_million_output_tokens") or {}
    concurrency = workload.get("concurrency")
    if concurrency is None:  # open loop: the concurrency the cost model derived (Little's law)
        concurrency = (answer.get("concurrency") or {}).get("speculative")
    return {
        "id": rec.id, "created_at": rec.created_at, "gpu": rec.gpu, "gpu_count": inputs.get("gpu_count", 1),
        "target_model": rec.target_model, "method": rec.method, "draft_model": rec.draft_model,
        "structure": workload.get("structure"), "concurrency": concurrency, "decision": rec.decision,
        "speedup_expected": answer["speedup"]["expected"], "speedup_low": answer["speedup"]["low"],
        "speedup_high": answer["speedup"]["high"], "num_speculative_tokens": answer.get("num_speculative_tokens"),
        "tpot_ms_baseline": answer["tpot_ms"]["baseline"], "tpot_ms_speculative": answer["tpot_ms"]["speculative"],
        "usd_per_million_output_tokens_baseline": usd.get("baseline"),
        "usd_per_million_output_tokens_speculative": usd.get("speculative"),
        "calibration_run_id": rec.calibration_run_id, "cost_model_version": rec.cost_model_version,
    }


COMPARE_ROWS = (
    ("decision", ("decision",)), ("speedup (expected)", ("speedup", "expected")),
    ("speedup (low)", ("speedup", "low")), ("speedup (high)", ("speedup", "high")),
    ("k", ("num_speculative_tokens",)), ("TPOT baseline (ms)", ("tpot_ms", "baseline")),
    ("TPOT speculative (ms)", ("tpot_ms", "speculative")),
    ("throughput baseline (tok/s)", ("throughput_tok_s", "baseline")),
    ("throughput speculative (tok/s)", ("throughput_tok_s", "speculative")),
    ("mean acceptance length", ("acceptance", "mean_acceptance_length")),
    ("break-even concurrency", ("break_even_concurrency",)),
    ("fits in memory", ("memory", "fits")),
    ("$ / 1M output tokens baseline", ("tco", "usd_per_million_output_tokens", "baseline")),
    ("$ / 1M output tokens speculative", ("tco", "usd_per_million_output_tokens", "speculative")),
    ("monthly savings ($)", ("tco", "monthly_savings_usd")),
)


def _dig(data: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def compare(ids: list[int]) -> dict[str, Any]:
    recs = [get(i) for i in ids]
    rows = [{"quantity": label, "values": [_dig(r.answer, path) for r in recs]} for label, path in COMPARE_ROWS]
    return {"recommendations": [as_dict(r) for r in recs], "rows": rows}
