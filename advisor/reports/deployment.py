"""The deployment page: realised AL against the predicted band, concurrency against the break-even, TPOT against the
predicted TPOTs, the flags and the verdict at today's operating point (pure: the drift dict in, HTML out)."""
from __future__ import annotations

import datetime as dt
from typing import Any

from markupsafe import Markup
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
from matplotlib.figure import Figure

from . import plots
from .formatting import fmt
from .pages import _ENV, verdict

STATE_CLASSES = {"ok": "go", "pending": "calibrate"}
WINDOW_COLUMNS = (
    ("end (UTC)", "end"), ("AL", "mean_acceptance_length"), ("drafts", "drafts"), ("accept rate", "acceptance_rate"),
    ("drafting fraction", "draft_fraction"), ("concurrency", "concurrency"), ("running", "running"),
    ("waiting", "waiting"), ("KV usage", "kv_cache_usage"), ("gen tok/s", "generation_tokens_per_s"),
    ("TPOT p50 ms", "tpot_ms.p50"), ("ITL p90 ms", "itl_ms.p90"), ("TTFT p90 ms", "ttft_ms.p90"),
    ("prompt tokens", "prompt_tokens_per_request.mean"), ("output tokens", "output_tokens_per_request.mean"),
)


def _get(data: dict[str, Any], path: str) -> Any:
    for key in path.split("."):
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _series(windows: list[dict[str, Any]], path: str) -> tuple[list[dt.datetime], list[float]]:
    xs, ys = [], []
    for w in windows:
        value = plots._num(_get(w, path))
        if value is not None:
            xs.append(dt.datetime.fromisoformat(w["end"]))
            ys.append(value)
    return xs, ys


def time_series_svg(windows: list[dict[str, Any]], lines: list[tuple[str, str, str]], y_label: str,
                    bands: list[tuple[float | None, float | None, str]] = (), salt: str = "ts",
                    title: str = "time series") -> str:
    """Window values over time (``lines``: path, label, colour) with horizontal reference lines or bands
    (``bands``: low, high, label; low == high is a line)."""
    with plots._style(salt):
        fig = Figure(figsize=plots.FULL_SIZE_IN)
        ax = fig.add_subplot()
        drawn = False
        for path, label, color in lines:
            xs, ys = _series(windows, path)
            if xs:
                ax.plot(xs, ys, marker="o", markersize=3, color=color, label=label)
                drawn = True
        if not drawn:
            plots._no_data(fig, ax, "no windows yet: two scrapes make the first")
            return plots._to_svg(fig, f"{title}: no data")
        for low, high, label in bands:
            if low is None:
                continue
            if high is None or high == low:
                ax.axhline(low, color=plots.COLOR_BAD, linestyle=":", linewidth=1.2, label=label)
            else:
                ax.axhspan(low, high, color=plots.COLOR_BAND, alpha=0.4, linewidth=0, label=label)
        locator = AutoDateLocator()
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))
        ax.set_ylabel(y_label)
        ax.legend(loc="best", fontsize=7, framealpha=0.85)
        fig.tight_layout()
        return plots._to_svg(fig, title)


def deployment_plots(drift: dict[str, Any]) -> list[tuple[str, Markup]]:
    windows, expected = drift.get("windows") or [], drift.get("expected") or {}
    salt = f"dep{_get(drift, 'deployment.id')}"
    return [
        ("Realised AL vs the predicted band", Markup(time_series_svg(
            windows, [("mean_acceptance_length", "realised AL", plots.COLOR_SPECULATIVE)], "mean acceptance length",
            [(expected.get("al_low"), expected.get("al_high"), "predicted band"),
             (expected.get("al"), None, "predicted AL")], salt=f"{salt}-al", title="realised AL over time"))),
        ("Concurrency vs break-even", Markup(time_series_svg(
            windows, [("concurrency", "time-averaged running", plots.COLOR_SPECULATIVE),
                      ("running", "running at scrape", plots.COLOR_BASELINE)], "requests",
            [(expected.get("break_even_concurrency"), None, "break-even")], salt=f"{salt}-conc",
            title="concurrency over time"))),
        ("TPOT", Markup(time_series_svg(
            windows, [("tpot_ms.mean", "TPOT mean", plots.COLOR_SPECULATIVE), ("tpot_ms.p90", "TPOT p90", "#7c3aed")],
            "ms per output token",
            [(expected.get("tpot_ms_baseline"), None, "predicted TPOT without speculation")],
            salt=f"{salt}-tpot", title="TPOT over time"))),
    ]


def _when(iso: str) -> str:
    """``2026-11-30T12:09:00.123+00:00`` -> ``2026-11-30 12:09:00`` (UTC, as stored)."""
    return iso[:19].replace("T", " ")


def deployment_page(drift: dict[str, Any]) -> str:
    deployment = drift.get("deployment") or {}
    today = drift.get("verdict_today") or {}
    text, css = verdict(today.get("decision")) if today.get("decision") else ("NO VERDICT YET", "unknown")
    windows = drift.get("windows") or []
    rows = [[_when(w["end"]), *(fmt(_get(w, path)) for _, path in WINDOW_COLUMNS[1:]),
             "; ".join(f["flag"] for f in w.get("flags", []))] for w in reversed(windows)]
    return _ENV.get_template("deployment.html").render(
        title=f"Deployment #{fmt(deployment.get('id'))} — {fmt(deployment.get('label'))}", d=deployment,
        state_class=STATE_CLASSES.get(deployment.get("state"), "no-go"), verdict_text=text, verdict_class=css,
        today=today, flags=drift.get("flags") or [], expected=drift.get("expected") or {},
        latest=drift.get("latest") or {}, plots=deployment_plots(drift), columns=[c for c, _ in WINDOW_COLUMNS],
        rows=rows, restarts=drift.get("restarts") or [], snapshots=drift.get("snapshots") or {},
    )
