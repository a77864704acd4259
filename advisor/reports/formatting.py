"""Formatting and flattening helpers shared by the page renderers (pure functions, no Flask)."""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from typing import Any

MISSING = "—"


def fmt(value: Any) -> str:
    """A human-readable cell: ``—`` for missing, yes/no, thousands separators, 2–3 significant decimals."""
    if value is None or value == "":
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return _fmt_float(value)
    if isinstance(value, (dt.datetime, dt.date)):
        return (
            value.isoformat(sep=" ", timespec="seconds")
            if isinstance(value, dt.datetime)
            else value.isoformat()
        )
    if isinstance(value, dict):
        return _fmt_dict(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(fmt(v) for v in value) + "]" if value else MISSING
    return str(value)


def _fmt_float(value: float) -> str:
    if not math.isfinite(value):
        return MISSING
    magnitude = abs(value)
    if magnitude == 0:
        return "0"
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.1f}"
    if magnitude >= 0.01:
        return f"{value:.2f}"
    return f"{value:.3g}"


def _fmt_dict(value: dict[str, Any]) -> str:
    if {"expected", "low", "high"} <= value.keys():
        return f"{fmt(value['expected'])} ({fmt(value['low'])}–{fmt(value['high'])})"
    return json.dumps(value, default=str, sort_keys=False)


_PATH_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def path_parts(path: str) -> list[str | int]:
    """``"curve[0].low"`` -> ``["curve", 0, "low"]`` (``"curve.0.low"`` is accepted too)."""
    parts: list[str | int] = []
    for name, index in _PATH_PART.findall(path):
        parts.append(int(index) if index else (int(name) if name.isdigit() else name))
    return parts


def dig(data: Any, path: str) -> Any:
    """``dig(answer, "tco.monthly_usd.baseline")``, ``dig(answer, "curve[0].low")``; None when missing."""
    for part in path_parts(path):
        if isinstance(data, dict):
            data = data.get(part if isinstance(part, str) else str(part))
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            return None
    return data


def flatten(data: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Leaves as (path, value) with the cost model's provenance notation (``curve[0].low``); lists of scalars
    stay one leaf."""
    if isinstance(data, dict):
        rows: list[tuple[str, Any]] = []
        for key, value in data.items():
            rows.extend(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return rows
    if isinstance(data, list) and any(isinstance(v, (dict, list)) for v in data):
        rows = []
        for index, value in enumerate(data):
            rows.extend(flatten(value, f"{prefix}[{index}]"))
        return rows
    return [(prefix, data)]


def pairs_text(data: Any) -> str:
    """``{"batch": 4, "q": 1}`` -> ``batch=4, q=1`` (for params/values cells)."""
    if not isinstance(data, dict) or not data:
        return fmt(data)
    return ", ".join(f"{key}={fmt(value)}" for key, value in data.items())


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def shorten(text: str, limit: int = 90) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def percent(value: Any) -> str:
    """A fraction as a percentage (``0.07`` -> ``7.0 %``)."""
    return f"{value * 100:.1f} %" if is_number(value) else MISSING
