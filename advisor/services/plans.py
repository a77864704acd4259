"""Capacity plans (issue 12): validated request -> catalog specs, prices, calibrations, acceptance -> planner ->
stored plan; lists and exports with stable columns."""
from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Select, select

from .. import costmodel
from ..costmodel.acceptance import model_from_input
from ..costmodel.plan import GpuOffer, PlanInput, PlanSlo, SpeculatorCandidate, plan_capacity
from ..costmodel.checks import check_draft
from ..errors import ApiError, field_error
from ..extensions import db
from ..models import Plan
from ..plan_schemas import MAX_CANDIDATE_GPUS
from . import calibrations, catalog

DEFAULT_K_REF = {"draft_model": 4, "eagle": 3, "eagle3": 3, "ngram": 4, "suffix": 4, "mtp": 1}


# --------------------------------------------------------------------------------------------- building the input
def _conditions(data: dict[str, Any]) -> tuple[str, str, str | None]:
    """The plan's weights and KV-cache dtypes and vLLM version: what a calibration it uses must have measured at."""
    return data.get("weights_dtype", "bf16"), data.get("kv_cache_dtype", "auto"), data.get("vllm_version")


def _timing_runs(data: dict[str, Any], gpu: costmodel.GpuSpec,
                 target: costmodel.ModelSpec) -> tuple[costmodel.Calibration, ...]:
    """The calibrations that timed ``target`` on ``gpu`` at the plan's conditions (any TP), newest first: each
    speculator is timed by one of them as a recommendation would be (``costmodel.timing_run``)."""
    return tuple(cal for cal in calibrations.plan_runs(gpu, target.name, *_conditions(data))
                 if target.name in cal.step_time)


def _offers(data: dict[str, Any], target: costmodel.ModelSpec) -> tuple[list[GpuOffer], dict[str, str]]:
    prices = data.get("gpu_hour_usd") or {}
    if data.get("gpus"):
        rows = [catalog.require_gpu(name, f"gpus.{i}") for i, name in enumerate(data["gpus"])]
    else:
        rows = [g for g in catalog.list_gpus() if g.gpu_hour_usd and g.gpu_hour_usd > 0 and g.gpu_class != "cpu"]
        if len(rows) > MAX_CANDIDATE_GPUS:  # bounded work, as for named candidates
            raise field_error("gpus", f"The catalog holds {len(rows)} GPUs with a price; name at most "
                                      f"{MAX_CANDIDATE_GPUS} candidates in gpus.")
        unknown = sorted(set(prices) - {g.name for g in rows})
        if unknown:
            raise field_error(f"gpu_hour_usd.{unknown[0]}",
                              f"'{unknown[0]}' is not a candidate GPU (catalog GPUs with a price: "
                              f"{', '.join(g.name for g in rows)}).")
    offers, sources = [], {}
    for row in rows:
        gpu = catalog.gpu_spec(row)
        runs = _timing_runs(data, gpu, target)
        profile = catalog.answer_profile(gpu, data.get("vllm_version"), runs[0] if runs else None)
        # the baseline: the newest run's fits, else the profile's, else the defaults (as a recommendation's)
        step, pre, timing = costmodel.step_params(gpu, target, "vllm", runs[0] if runs else None, profile)
        if gpu.name in prices:
            price, price_source = float(prices[gpu.name]), "input"
        else:
            price, price_source = gpu.gpu_hour_usd, f"catalog:{gpu.name} ({gpu.gpu_hour_usd_date})"
        offers.append(GpuOffer(gpu, price, price_source, step, pre, timing, profile, runs))
        sources[gpu.name] = row.source
    return offers, sources


def _speculators(data: dict[str, Any], target: costmodel.ModelSpec, offers: list[GpuOffer],
                 sources: dict[str, str]) -> list[SpeculatorCandidate]:
    given = data.get("speculators")
    items = given if given else catalog.speculator_candidates(target)
    structure = data["workload"]["structure"]
    # each speculator's acceptance from the newest run that measured it, on any candidate GPU
    cals = [c for o in offers for c in calibrations.plan_runs(o.gpu, target.name, *_conditions(data))]
    out = []
    for i, item in enumerate(items):
        method, name = item["method"], item.get("draft_model")
        field = f"speculators.{i}.draft_model"
        draft = None
        if method in ("ngram", "suffix"):
            if name:
                raise field_error(field, f"method '{method}' drafts from the prompt; draft_model must be absent.")
        else:
            if not name:
                raise field_error(field, f"method '{method}' needs a draft_model.")
            row = catalog.require_model(name, field)
            draft = catalog.model_spec(row)
            sources[draft.name] = row.source
            for issue in check_draft(target, draft, method):
                if issue.severity == "error":
                    raise field_error(field, issue.message)
        drafter = draft.name if draft is not None and method not in ("ngram", "suffix") else None
        k = item.get("num_speculative_tokens")
        acc_in = item.get("acceptance") or {}
        if any(acc_in.get(key) is not None for key in ("mean_acceptance_length", "acceptance_rate", "per_position")):
            given_acc = costmodel.AcceptanceInput(**{key: (tuple(v) if isinstance(v, list) else v)
                                                     for key, v in acc_in.items()})
            try:
                acc = model_from_input(given_acc, k or DEFAULT_K_REF.get(method, 3), method, structure, drafter)
            except costmodel.CostModelError as exc:
                raise field_error(f"speculators.{i}.{exc.field}", exc.message) from None
            source = "input"
        else:
            acc, source = None, ""
            for cal in cals:
                for key in (costmodel.acceptance_key(method, drafter, structure),
                            costmodel.acceptance_key(method, None, structure)):
                    if acc is None and key in cal.acceptance:
                        acc, source = cal.acceptance[key], f"calibration:{cal.run_id}"
            if acc is None:
                acc = costmodel.prior_acceptance(method, structure, target, draft)
                source = acc.source.split(";")[0]
        out.append(SpeculatorCandidate(method, draft, acc, source, k))
    return out


def plan_input(data: dict[str, Any]) -> tuple[PlanInput, dict[str, str]]:
    target_row = catalog.require_model(data["target_model"], "target_model")
    target = catalog.model_spec(target_row)
    offers, sources = _offers(data, target)
    sources[target.name] = target_row.source
    specs = _speculators(data, target, offers, sources)
    w, load, slo = data["workload"], data["load"], data["slo"]
    plan = PlanInput(
        target=target, prompt_tokens=w["prompt_tokens"], output_tokens=w["output_tokens"],
        temperature=w.get("temperature", 0.0), requests_per_second=load["requests_per_second"],
        slo=PlanSlo(float(slo.get("percentile", 90)), slo.get("ttft_ms"), slo.get("tpot_ms"), slo.get("latency_ms")),
        offers=tuple(offers), speculators=tuple(specs), growth=tuple(load.get("growth") or (1.0,)),
        tp_sizes=tuple(data["tensor_parallel_sizes"]) if data.get("tensor_parallel_sizes") else None,
        weights_dtype=data.get("weights_dtype", "bf16"), kv_cache_dtype=data.get("kv_cache_dtype", "auto"),
        length_spread=w.get("length_spread", 0.0),
        hours_per_month=data.get("hours_per_month", 730.0),
        gpu_memory_utilization=data.get("gpu_memory_utilization", 0.92),
        max_num_seqs=data.get("max_num_seqs", 256), max_num_batched_tokens=data.get("max_num_batched_tokens", 8192))
    return plan, sources


def compute(data: dict[str, Any]) -> dict[str, Any]:
    """The plan for a validated request (not stored)."""
    plan, sources = plan_input(data)
    # end the catalog reads' transaction before simulating (up to a minute): PostgreSQL ends a connection left idle
    # in a transaction (idle_in_transaction_session_timeout), and the pool gets it back meanwhile
    db.session.close()
    try:
        answer = plan_capacity(plan)
    except costmodel.CostModelError as exc:
        raise field_error(exc.field, exc.message) from None
    answer["sources"] = {"catalog": sources, "latency": "simulation: advisor/costmodel/simulate.py",
                         "workload": "input", "load": "input", "slo": "input"}
    answer["cost_model_version"] = costmodel.COST_MODEL_VERSION
    return answer


def create(data: dict[str, Any]) -> Plan:
    answer = compute(data)
    inputs = json.loads(json.dumps(data, default=str))
    best = answer["best"][0]["option"] if answer["best"] else None
    row = Plan(target_model=data["target_model"], feasible=answer["feasible"], best_option=best, inputs=inputs,
               answer=answer, cost_model_version=answer["cost_model_version"])
    db.session.add(row)
    db.session.commit()
    return row


def get(plan_id: int) -> Plan:
    row = db.session.get(Plan, plan_id)
    if row is None:
        raise ApiError(404, f"No plan with id {plan_id}.")
    return row


def filtered(filters: dict[str, Any]) -> Select:
    query = select(Plan).order_by(Plan.id.desc())
    if filters.get("target_model"):
        query = query.where(Plan.target_model == filters["target_model"])
    return query


def as_dict(row: Plan) -> dict[str, Any]:
    return {"id": row.id, "created_at": row.created_at, "request": row.inputs, **row.answer}


def summary(row: Plan) -> dict[str, Any]:
    return {"id": row.id, "created_at": row.created_at, "target_model": row.target_model, "feasible": row.feasible,
            "best_option": row.best_option, "requests_per_second": row.inputs["load"]["requests_per_second"],
            "cost_model_version": row.cost_model_version}


# Stable export columns (docs/planner.md, "Export columns"): one row per option × load level; append only.
EXPORT_COLUMNS = (
    "plan_id", "created_at", "target_model", "rank", "option", "gpu", "tensor_parallel_size", "mode", "method",
    "draft_model", "num_speculative_tokens", "feasible", "infeasible_reason", "load_requests_per_second",
    "replicas", "gpus", "requests_per_second_per_replica", "concurrency_per_replica",
    "max_requests_per_second_per_replica", "gpu_hour_usd", "monthly_usd", "usd_per_million_output_tokens",
    "slo_percentile", "ttft_ms", "tpot_ms", "latency_ms", "slo_headroom", "speculation_saves_monthly_usd",
    "cost_model_version",
)


def export_rows(row: Plan) -> list[dict[str, Any]]:
    answer = row.answer
    q = answer["slo"]["percentile"]
    out = []
    for o in answer["options"]:
        spec = o.get("speculator") or {}
        base = {"plan_id": row.id, "created_at": row.created_at.isoformat(), "target_model": row.target_model,
                "rank": o["rank"], "option": o["key"], "gpu": o["gpu"], "tensor_parallel_size": o["tensor_parallel_size"],
                "mode": o["mode"], "method": spec.get("method"), "draft_model": spec.get("draft_model"),
                "num_speculative_tokens": spec.get("num_speculative_tokens"), "feasible": o["feasible"],
                "infeasible_reason": o["infeasible_reason"],
                "max_requests_per_second_per_replica": o["max_requests_per_second_per_replica"],
                "gpu_hour_usd": o["gpu_hour_usd"], "slo_percentile": q,
                "cost_model_version": row.cost_model_version}
        saves = o.get("speculation_saves_monthly_usd") or []
        for i, load in enumerate(answer["loads_requests_per_second"]):
            at = o["loads"][i] if i < len(o["loads"]) else {}
            out.append({**base, "load_requests_per_second": load, "replicas": at.get("replicas"),
                        "gpus": at.get("gpus"), "requests_per_second_per_replica": at.get("requests_per_second_per_replica"),
                        "concurrency_per_replica": at.get("concurrency_per_replica"),
                        "monthly_usd": at.get("monthly_usd"),
                        "usd_per_million_output_tokens": at.get("usd_per_million_output_tokens"),
                        "ttft_ms": at.get(f"ttft_p{q:g}_ms"), "tpot_ms": at.get(f"tpot_p{q:g}_ms"),
                        "latency_ms": at.get(f"latency_p{q:g}_ms"), "slo_headroom": at.get("slo_headroom"),
                        "speculation_saves_monthly_usd": saves[i] if i < len(saves) else None})
    return [{c: r.get(c) for c in EXPORT_COLUMNS} for r in out]
