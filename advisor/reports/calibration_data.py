"""A calibration run's measurements -> plot series (measured vs fitted) and residuals, tolerant of shapes.

Measurements are ``{"probe", "params", "values"}``; fits are ``{"kind", "key", "params", "residuals"}``.
The x axis of a probe is its first numeric parameter among ``X_KEYS`` (else any numeric parameter), the y axis
its first numeric value among ``Y_KEYS`` (else any). The fitted value at a point is, in order of preference:
``values["fitted_<y>"]``, ``values["predicted_<y>"]``, ``values["fitted"]``, or ``measured − residual`` when
a fit of the probe's kind stores one residual per measurement (residual = measured − fitted, in measurement
order).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from .formatting import fmt, is_number
from .plots import Series

X_KEYS = (
    "batch_size",
    "batch",
    "num_seqs",
    "concurrency",
    "prompt_tokens",
    "context_tokens",
    "query_tokens",
    "q",
    "num_speculative_tokens",
    "k",
    "position",
    "temperature",
)
Y_KEYS = (
    "step_time_ms",
    "time_ms",
    "prefill_ms",
    "latency_ms",
    "step_time_s",
    "prefill_s",
    "time_s",
    "mean_acceptance_length",
    "acceptance_rate",
    "acceptance_length",
    "kv_capacity_tokens",
    "num_gpu_blocks",
)
FIT_KIND_BY_PROBE = {
    "timing": "step_time",
    "step_time": "step_time",
    "prefill": "prefill",
    "acceptance": "acceptance",
}
MAX_SERIES = 10


@dataclass
class ProbePlot:
    probe: str
    x_key: str
    y_key: str
    series: list[Series]
    has_fitted: bool


def _axis_key(
    dicts: list[dict[str, Any]], preferred: tuple[str, ...], skip_prefixes: tuple[str, ...] = ()
) -> str | None:
    counts: Counter[str] = Counter(
        k for d in dicts for k, v in d.items() if is_number(v) and not k.startswith(skip_prefixes)
    )
    for key in preferred:
        if counts.get(key):
            return key
    return counts.most_common(1)[0][0] if counts else None


def _varying_keys(params: list[dict[str, Any]], x_key: str) -> list[str]:
    """Scalar parameters (other than x) that take more than one value across a probe's measurements."""
    seen: dict[str, set[str]] = {}
    for p in params:
        for key, value in p.items():
            if key != x_key and isinstance(value, (str, int, float, bool)) and len(str(value)) <= 40:
                seen.setdefault(key, set()).add(repr(value))
    return [key for key, values in seen.items() if len(values) > 1]


def _series_label(params: dict[str, Any], keys: list[str]) -> str:
    return ", ".join(f"{k}={fmt(params.get(k))}" for k in keys) or "measured"


def _fitted_value(values: dict[str, Any], y_key: str) -> float | None:
    for key in (f"fitted_{y_key}", f"predicted_{y_key}", "fitted", "predicted"):
        if is_number(values.get(key)):
            return float(values[key])
    return None


def _residual_fitted(
    points: list[dict[str, Any]], y_key: str, fits: list[dict[str, Any]], kind: str | None
) -> list[float | None]:
    """fitted = measured − residual, from a fit of this kind with one residual per (matching) measurement."""
    fitted: list[float | None] = [None] * len(points)
    for fit in fits:
        residuals = fit.get("residuals") or []
        if fit.get("kind") != kind or not residuals:
            continue
        matching = [i for i, m in enumerate(points) if fit.get("key") in (m.get("params") or {}).values()]
        indices = matching or list(range(len(points)))
        if len(indices) != len(residuals) or not all(is_number(r) for r in residuals):
            continue
        for i, residual in zip(indices, residuals):
            fitted[i] = float(points[i]["values"][y_key]) - float(residual)
    return fitted


def probe_plots(measurements: list[dict[str, Any]], fits: list[dict[str, Any]]) -> list[ProbePlot]:
    """One plot per probe that has numeric (x, y) measurements, series split by the other parameters."""
    by_probe: dict[str, list[dict[str, Any]]] = {}
    for m in measurements:
        if isinstance(m, dict):
            by_probe.setdefault(str(m.get("probe") or "probe"), []).append(m)
    plots = []
    for probe, items in by_probe.items():
        params = [m.get("params") or {} for m in items]
        x_key = _axis_key(params, X_KEYS)
        y_key = _axis_key([m.get("values") or {} for m in items], Y_KEYS, ("fitted", "predicted"))
        if x_key is None or y_key is None:
            continue
        points = [
            m
            for m in items
            if is_number((m.get("params") or {}).get(x_key)) and is_number((m.get("values") or {}).get(y_key))
        ]
        residual_fitted = _residual_fitted(points, y_key, fits, FIT_KIND_BY_PROBE.get(probe))
        label_keys = _varying_keys([m["params"] for m in points], x_key)
        series: dict[str, Series] = {}
        for m, from_residual in zip(points, residual_fitted):
            label = _series_label(m["params"], label_keys)
            if label not in series and len(series) >= MAX_SERIES:
                label = "other"
            s = series.setdefault(label, Series(label=label))
            s.x.append(float(m["params"][x_key]))
            s.measured.append(float(m["values"][y_key]))
            explicit = _fitted_value(m["values"], y_key)
            s.fitted.append(explicit if explicit is not None else from_residual)
        if series:
            has_fitted = any(v is not None for s in series.values() for v in s.fitted)
            plots.append(ProbePlot(probe, x_key, y_key, list(series.values()), has_fitted))
    return plots


def residuals_by_fit(fits: list[dict[str, Any]]) -> dict[str, list[float]]:
    return {
        f"{fit.get('kind')}: {fit.get('key')}": [float(r) for r in fit.get("residuals") or [] if is_number(r)]
        for fit in fits
        if isinstance(fit, dict)
    }


def rms(values: list[float]) -> float | None:
    return (sum(v * v for v in values) / len(values)) ** 0.5 if values else None
