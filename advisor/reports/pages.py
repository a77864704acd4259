"""HTML pages (Jinja templates in ``advisor/templates``): a recommendation, a comparison, a calibration run.

Pure renderers: dicts in, a complete self-contained HTML document out (inline CSS and SVG, no JavaScript,
no external resources), so a page saved to disk opens offline.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from jinja2 import ChainableUndefined, Environment, PackageLoader, Undefined, select_autoescape
from markupsafe import Markup

from . import plots
from .calibration_data import ProbePlot, probe_plots, residuals_by_fit, rms
from .calibration_findings import (acceptance_series, findings, fit_findings, fit_param_rows, host_speed_series,
                                   prefill_series, step_model, step_series)
from .formatting import MISSING, dig, flatten, fmt, is_number, pairs_text, path_parts, percent, shorten

DECISIONS = {"go": "GO", "no-go": "NO-GO", "calibrate": "CALIBRATE"}
STATUS_CLASSES = {"succeeded": "go", "failed": "no-go", "running": "calibrate", "queued": "calibrate"}
# Not part of the answer's numbers (identity, the request, the provenance itself).
NOT_ANSWER_KEYS = ("id", "created_at", "workload_id", "scenario", "provenance")
HEADLINE_PAIRS = (
    ("TPOT (ms)", "tpot_ms"),
    ("TTFT (ms)", "ttft_ms"),
    ("request latency (ms)", "latency_ms.{}.total"),
    ("throughput (tok/s)", "throughput_tok_s"),
    ("$ / 1M output tokens", "tco.usd_per_million_output_tokens"),
    ("GPUs needed", "tco.gpus_needed"),
    ("monthly $", "tco.monthly_usd"),
    ("max concurrency (memory)", "memory.max_concurrency_{}"),
)

_ENV = Environment(
    loader=PackageLoader("advisor", "templates"),
    autoescape=select_autoescape(("html",)),
    trim_blocks=True,
    lstrip_blocks=True,
    undefined=ChainableUndefined,
)
_ENV.filters["fmt"] = lambda value: fmt(None if isinstance(value, Undefined) else value)
_ENV.filters["percent"] = lambda value: percent(None if isinstance(value, Undefined) else value)


@dataclass(frozen=True)
class Row:
    label: str
    values: list[str]


@dataclass(frozen=True)
class ProvenanceRow:
    path: str
    value: str
    source: str
    source_class: str
    calibration_run_id: int | None


# --- shared pieces ------------------------------------------------------------------------------------------
def verdict(decision: Any) -> tuple[str, str]:
    """(text, css class) of a decision; unknown decisions render neutral."""
    key = str(decision) if decision in DECISIONS else "unknown"
    return DECISIONS.get(key, fmt(decision).upper()), key


def title_of(rec: dict[str, Any]) -> str:
    scenario = rec.get("scenario") or {}
    speculator = scenario.get("speculator") or {}
    drafter = f" ({speculator['draft_model']})" if speculator.get("draft_model") else ""
    count = scenario.get("gpu_count") or 1
    return (
        f"{fmt(scenario.get('target_model'))} on {count}× {fmt(scenario.get('gpu'))} — "
        f"{fmt(speculator.get('method'))}{drafter}"
    )


def workload_concurrency(rec: dict[str, Any]) -> float | None:
    workload = dig(rec, "scenario.workload") or {}
    value = workload.get("concurrency")
    for path in ("concurrency.speculative", "concurrency.baseline", "concurrency", "memory.concurrency"):
        if value is None or not is_number(value):
            value = dig(rec, path)
    return float(value) if is_number(value) else None


def headline(rec: dict[str, Any]) -> str:
    parts = [
        f"expected speedup {fmt(dig(rec, 'speedup.expected'))}× "
        f"({fmt(dig(rec, 'speedup.low'))}–{fmt(dig(rec, 'speedup.high'))})"
    ]
    concurrency = workload_concurrency(rec)
    if concurrency is not None:
        parts.append(
            f"at concurrency {fmt(int(concurrency) if concurrency == int(concurrency) else concurrency)}"
        )
    elif dig(rec, "scenario.workload.requests_per_second") is not None:
        parts.append(f"at {fmt(dig(rec, 'scenario.workload.requests_per_second'))} requests/s")
    if rec.get("num_speculative_tokens") is not None:
        parts.append(f"with k = {fmt(rec['num_speculative_tokens'])}")
    return " ".join(parts)


def _pair_values(rec: dict[str, Any], path: str) -> list[str]:
    if "{}" in path:
        return [fmt(dig(rec, path.format(side))) for side in ("baseline", "speculative")]
    return [fmt(dig(rec, f"{path}.{side}")) for side in ("baseline", "speculative")]


def headline_rows(rec: dict[str, Any]) -> list[Row]:
    return [Row(label, _pair_values(rec, path)) for label, path in HEADLINE_PAIRS]


# --- provenance ---------------------------------------------------------------------------------------------
def _source_for(path: str, provenance: dict[str, str], value: Any, scenario: dict[str, Any]) -> str:
    """Exact entry, else the longest provenance path that is a prefix of this one, else input / computed."""
    if path in provenance:
        return str(provenance[path])
    parts = path_parts(path)
    by_parts = {tuple(path_parts(key)): source for key, source in provenance.items()}
    for cut in range(len(parts) - 1, 0, -1):
        if tuple(parts[:cut]) in by_parts:
            return str(by_parts[tuple(parts[:cut])])
    if value is not None and dig(scenario, path) == value:
        return "input"
    return "computed"


def _source_class(source: str) -> tuple[str, int | None]:
    kind = source.split(":", 1)[0].strip().lower() or "computed"
    run_id = None
    if kind == "calibration":
        tail = source.split(":", 1)[1].strip() if ":" in source else ""
        run_id = int(tail) if tail.isdigit() else None
    known = ("input", "catalog", "calibration", "prior", "default", "computed")
    return (kind if kind in known else "other"), run_id


def _mapping(data: dict[str, Any], key: str) -> dict[str, Any]:
    """``data[key]`` where it is a mapping (a stored answer is read as it was written), else empty."""
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def _is_numeric_leaf(value: Any) -> bool:
    return is_number(value) or (isinstance(value, list) and bool(value) and all(is_number(v) for v in value))


def provenance_rows(rec: dict[str, Any]) -> list[ProvenanceRow]:
    """Every path the cost model sourced, then every other number of the answer, with value and source."""
    provenance = _mapping(rec, "provenance")
    scenario = _mapping(rec, "scenario")
    entries: dict[str, Any] = {}
    for path in provenance:
        value = dig(rec, path)
        entries[path] = value if value is not None else dig(scenario, path)
    answer = {k: v for k, v in rec.items() if k not in NOT_ANSWER_KEYS}
    for path, value in flatten(answer):
        if path not in entries and _is_numeric_leaf(value):
            entries[path] = value
    rows = []
    for path, value in entries.items():
        source = _source_for(path, provenance, value, scenario)
        css, run_id = _source_class(source)
        rows.append(ProvenanceRow(path, shorten(fmt(value)), source, css, run_id))
    return rows


# --- recommendation page ------------------------------------------------------------------------------------
def _methods_table(methods: Any) -> tuple[list[str], list[list[str]]]:
    rows = [m for m in methods or [] if isinstance(m, dict)]
    columns: list[str] = []
    for m in rows:
        columns.extend(k for k in m if k not in columns)
    return columns, [[fmt(m.get(c)) for c in columns] for m in rows]


def compact_json(value: Any) -> str:
    """JSON with one top-level key per line and compact values (the dynamic-SD table stays on one line)."""
    if not isinstance(value, dict) or not value:
        return json.dumps(value)
    lines = [f"  {json.dumps(str(k))}: {json.dumps(v, separators=(', ', ': '))}" for k, v in value.items()]
    return "{\n" + ",\n".join(lines) + "\n}"


def _vllm(rec: dict[str, Any]) -> dict[str, Any]:
    vllm = _mapping(rec, "vllm")
    config = vllm.get("speculative_config")
    return {
        "speculative_config": compact_json(config) if config is not None else MISSING,
        "serve_flags": vllm.get("serve_flags") or MISSING,
        "dynamic_sd": [
            [fmt(v) for v in band] for band in rec.get("dynamic_sd") or [] if isinstance(band, list)
        ],
    }


def _checks(rec: dict[str, Any]) -> list[dict[str, str]]:
    return [
        {"severity": fmt(c.get("severity")), "field": fmt(c.get("field")), "message": fmt(c.get("message"))}
        for c in rec.get("checks") or []
        if isinstance(c, dict)
    ]


def recommendation_plots(rec: dict[str, Any]) -> list[tuple[str, Markup]]:
    salt = f"rec{rec.get('id', '')}"
    return [
        (
            "Speedup over concurrency",
            Markup(
                plots.speedup_curve_svg(
                    rec.get("curve"),
                    rec.get("break_even_concurrency"),
                    workload_concurrency(rec),
                    salt=f"{salt}-speedup",
                )
            ),
        ),
        (
            "Latency: prefill vs decode",
            Markup(plots.latency_split_svg(rec.get("latency_ms"), salt=f"{salt}-latency")),
        ),
        (
            "VRAM budget",
            Markup(
                plots.vram_budget_svg(
                    rec.get("memory"), dig(rec, "scenario.gpu_memory_utilization"), salt=f"{salt}-vram"
                )
            ),
        ),
        ("TCO with and without speculation", Markup(plots.tco_svg(rec.get("tco"), salt=f"{salt}-tco"))),
    ]


def _engine_profile(rec: dict[str, Any]) -> dict[str, str] | None:
    """The measured GPU × vLLM profile that timed an answer (``engine_profile``): its name, where to read it
    (``GET /v1/engine-profiles`` for that GPU and version), the drafters it carries from another profile, and those
    no profile timed, priced by a timed drafter of their method."""
    profile = _mapping(rec, "engine_profile")
    if not profile.get("name"):
        return None
    carried = _mapping(profile, "drafters_carried")
    query = urlencode({"gpu": profile.get("applied_to") or profile.get("gpu") or "",
                       "vllm_version": profile.get("vllm_version") or ""})
    stand_in = _mapping(profile, "drafters_stand_in")
    return {"name": fmt(profile["name"]), "href": f"/v1/engine-profiles?{query}",
            "carried": "; ".join(f"{fmt(name)} from {fmt(origin)}" for name, origin in carried.items()),
            "stand_in": "; ".join(f"{fmt(name)} priced by the fit of {fmt(timed)}" for name, timed in stand_in.items())}


def recommendation_page(rec: dict[str, Any]) -> str:
    text, css = verdict(rec.get("decision"))
    columns, method_rows = _methods_table(rec.get("methods"))
    choice = _mapping(rec, "speculator_choice")
    choice_columns, choice_rows = _methods_table(choice.get("candidates"))
    provenance = _mapping(rec, "provenance")
    timing = str(provenance.get("tpot_ms.baseline") or "")
    timing_run = timing.removeprefix("calibration:") if timing.startswith("calibration:") else None
    return _ENV.get_template("recommendation.html").render(
        rec=rec,
        # an acceptance run priced with another run's timing (services.calibrations.calibration_for)
        timing_run=timing_run if timing_run != str(rec.get("calibration_run_id")) else None,
        profile=_engine_profile(rec),
        title=title_of(rec),
        verdict_text=text,
        verdict_class=css,
        headline=headline(rec),
        reasons=[fmt(r) for r in rec.get("reasons") or []],
        checks=_checks(rec),
        headline_rows=headline_rows(rec),
        inputs=[(p, fmt(v)) for p, v in flatten(rec.get("scenario") or {})],
        plots=recommendation_plots(rec),
        vllm=_vllm(rec),
        method_columns=columns,
        method_rows=method_rows,
        choice_columns=choice_columns,
        choice_rows=choice_rows,
        choice_rule=fmt(choice.get("rule")) if choice else "",
        provenance=provenance_rows(rec),
        acceptance=rec.get("acceptance") or {},
    )


# --- comparison page ----------------------------------------------------------------------------------------
def comparison_page(recs: list[dict[str, Any]], rows: list[dict[str, Any]]) -> str:
    """2–6 recommendations as columns; ``rows`` as returned by ``services.recommendations.compare``."""
    columns = []
    for index, rec in enumerate(recs):
        text, css = verdict(rec.get("decision"))
        columns.append(
            {
                "id": rec.get("id"),
                "title": title_of(rec),
                "verdict_text": text,
                "verdict_class": css,
                "workload": _workload_line(rec),
                "curve": Markup(
                    plots.speedup_curve_svg(
                        rec.get("curve"),
                        rec.get("break_even_concurrency"),
                        workload_concurrency(rec),
                        small=True,
                        salt=f"cmp{index}-{rec.get('id')}",
                    )
                ),
            }
        )
    table = [
        Row(str(r.get("quantity", MISSING)), [fmt(v) for v in r.get("values") or []]) for r in rows or []
    ]
    return _ENV.get_template("comparison.html").render(
        columns=columns, rows=table, title=f"Comparison of {len(recs)} recommendations"
    )


def _workload_line(rec: dict[str, Any]) -> str:
    w = dig(rec, "scenario.workload") or {}
    load = (
        f"concurrency {fmt(w.get('concurrency'))}"
        if w.get("concurrency") is not None
        else f"{fmt(w.get('requests_per_second'))} req/s"
    )
    return (
        f"{fmt(w.get('structure'))}, {fmt(w.get('prompt_tokens'))} → {fmt(w.get('output_tokens'))} tokens, "
        f"T = {fmt(w.get('temperature'))}, {load}"
    )


# --- calibration page ---------------------------------------------------------------------------------------
RUN_DETAILS = ("hardware", "target_model", "method", "draft_model", "progress", "created_at", "started_at",
               "finished_at", "queue", "job_id")


def _fit_plots(run_id: Any, measurements: list[dict[str, Any]], fits: list[dict[str, Any]],
               specs: tuple[Any, Any] | None = None) -> list[tuple[ProbePlot, Markup]]:
    result = []
    step_fit = next((f.get("params") for f in fits if f.get("kind") == "step_time"), None)
    try:
        fitted = step_model(step_fit, *specs) if isinstance(step_fit, dict) and specs else None
    except (KeyError, TypeError, ValueError):  # a fit uploaded in another shape: points only, no curve
        fitted = None
    for probe, x_key, y_key, series in (
        ("step_time", "batch size", "step or cycle time (ms)", step_series(measurements, fitted)),
        ("prefill", "prompt length (tokens)", "prefill time (ms)", prefill_series(measurements)),
    ):
        if series:
            title = f"{probe}: {y_key} over {x_key}"
            svg = plots.calibration_fit_svg(title, x_key, y_key, series, salt=f"cal{run_id}-{probe}")
            has_fitted = any(v is not None for one in series for v in one.fitted)
            result.append((ProbePlot(probe, x_key, y_key, series, has_fitted), Markup(svg)))
    for name, series in acceptance_series(measurements).items():
        title, x_key, y_key = f"acceptance: {name}", "draft position", "acceptance rate (95 % interval)"
        svg = plots.calibration_fit_svg(title, x_key, y_key, series, salt=f"cal{run_id}-acc-{len(result)}")
        result.append((ProbePlot(f"acceptance: {name}", x_key, y_key, series, False), Markup(svg)))
    if not result:  # records in another shape than the probe runner's: one generic plot per probe
        for index, p in enumerate(probe_plots(measurements, fits)):
            title = f"{p.probe}: {p.y_key} over {p.x_key}"
            svg = plots.calibration_fit_svg(title, p.x_key, p.y_key, p.series, salt=f"cal{run_id}-{index}")
            result.append((p, Markup(svg)))
    speed = host_speed_series(measurements)
    if speed:
        x_key, y_key = "time into the run (s)", "host core speed (× its p95)"
        svg = plots.calibration_fit_svg("host speed: a busy loop once a second", x_key, y_key, speed,
                                        salt=f"cal{run_id}-host")
        result.append((ProbePlot("host_speed", x_key, y_key, speed, False), Markup(svg)))
    return result


def _fit_rows(fits: list[dict[str, Any]], residuals: dict[str, list[float]]) -> list[dict[str, Any]]:
    rows = []
    for f in fits:
        values = residuals.get(f"{f.get('kind')}: {f.get('key')}", [])
        rows.append({"kind": fmt(f.get("kind")), "key": fmt(f.get("key")),
                     "params_text": pairs_text(f.get("params")), "param_rows": fit_param_rows(f.get("params")),
                     "n": len(values), "rms": fmt(rms(values))})
    return rows


def _measurement_rows(measurements: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [{"probe": fmt(m.get("probe")), "params_text": pairs_text(m.get("params")),
             "values_text": pairs_text(m.get("values"))} for m in measurements]


def calibration_page(run: dict[str, Any], specs: tuple[Any, Any] | None = None) -> str:
    """A calibration run (``CalibrationRunSchema`` dump): status, probes, measured vs fitted, residuals.
    ``specs`` = (GpuSpec, ModelSpec) of the run's hardware and target, for the fitted step-time curves."""
    measurements = [m for m in run.get("measurements") or [] if isinstance(m, dict)]
    fits = [f for f in run.get("fits") or [] if isinstance(f, dict)]
    run_id, status = run.get("id"), str(run.get("status") or "unknown")
    residuals = residuals_by_fit(fits)
    residuals_plot = Markup(plots.residuals_svg(residuals, salt=f"cal{run_id}-residuals")) if fits else None
    title = f"Calibration run #{fmt(run_id)} — {fmt(run.get('target_model'))} on {fmt(run.get('hardware'))}"
    return _ENV.get_template("calibration.html").render(
        run=run, title=title, status=status, status_class=STATUS_CLASSES.get(status, "unknown"),
        details=[(k, fmt(run.get(k))) for k in RUN_DETAILS],
        environment=[(p, fmt(v)) for p, v in flatten(run.get("environment") or {})],
        config=[(p, fmt(v)) for p, v in flatten(run.get("config") or {})],
        measurements=_measurement_rows(measurements), fits=_fit_rows(fits, residuals),
        fit_plots=_fit_plots(run_id, measurements, fits, specs), residuals_svg=residuals_plot,
        findings=findings(measurements) + fit_findings(fits, fmt(run.get("hardware")), specs[0] if specs else None),
    )
