"""Per-window figures from the differences between consecutive snapshots (never from raw totals).

A counter that goes down, or a changed ``process_start_time_seconds``, means the server restarted: no window spans
the restart, the snapshot after it starts a new one (design.md §2 for the acceptance quantities).
"""
from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from typing import Any

from .exposition import Histogram, Snapshot

QUANTILES = (0.5, 0.9, 0.99)
RESTART_START_TIME_TOLERANCE_S = 1.0


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus' ``histogram_quantile``: linear interpolation inside the bucket holding rank q·count; the
    +Inf bucket answers the highest finite bound. None without observations."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower_bound
            if count == lower_count:
                return upper
            return lower_bound + (upper - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = upper, count
    return lower_bound


def histogram_delta(before: Histogram, after: Histogram) -> Histogram:
    """Observations between two scrapes (bucket bounds matched by value; a bound missing before counts from 0)."""
    old = dict(before.buckets)
    return Histogram(tuple((le, n - old.get(le, 0.0)) for le, n in after.buckets),
                     after.sum - before.sum, after.count - before.count)


def is_restart(before: Snapshot, after: Snapshot) -> bool:
    """Any counter, per-position counter or histogram count went down, or the process start time changed."""
    for key, value in after.counters.items():
        if key in before.counters and value < before.counters[key]:
            return True
    if any(a < b for a, b in zip(after.per_position, before.per_position)):
        return True
    for key, histogram in after.histograms.items():
        if key in before.histograms and histogram.count < before.histograms[key].count:
            return True
    t0, t1 = before.gauges.get("process_start_time_s"), after.gauges.get("process_start_time_s")
    return t0 is not None and t1 is not None and abs(t1 - t0) > RESTART_START_TIME_TOLERANCE_S


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


def _summary(histogram: Histogram | None, scale: float = 1.0) -> dict[str, float | None] | None:
    """mean and p50/p90/p99 of a window's observations, times ``scale`` (s -> ms)."""
    if histogram is None or histogram.count <= 0:
        return None
    out: dict[str, float | None] = {"count": histogram.count, "mean": histogram.sum / histogram.count * scale}
    for q in QUANTILES:
        value = histogram_quantile(q, histogram.buckets)
        out[f"p{round(q * 100)}"] = value * scale if value is not None else None
    return out


def window(start: dt.datetime, end: dt.datetime, before: Snapshot, after: Snapshot) -> dict[str, Any]:
    """The figures of one window [start, end] from the two snapshots that bound it (no restart in between)."""
    duration_s = (end - start).total_seconds()
    d = {k: after.counters[k] - before.counters[k] for k in after.counters if k in before.counters}
    hist = {k: histogram_delta(before.histograms[k], h) for k, h in after.histograms.items() if k in before.histograms}
    drafts, accepted = d.get("drafts"), d.get("accepted_tokens")
    per_position = None
    if drafts and after.per_position:
        old = before.per_position + (0.0,) * (len(after.per_position) - len(before.per_position))
        per_position = [(a - b) / drafts for a, b in zip(after.per_position, old)]
    # Sequence-steps S: each emits 1 token, plus the accepted drafts (design.md §2); a request's first token comes
    # from its prefill step, one per TTFT observation. Drafting fraction = drafts / decode sequence-steps.
    first_tokens = hist["ttft_s"].count if "ttft_s" in hist else d.get("requests_finished")
    decode_steps = None
    if d.get("generation_tokens") is not None and accepted is not None and first_tokens is not None:
        decode_steps = d["generation_tokens"] - accepted - first_tokens
    draft_fraction = _ratio(drafts, decode_steps) if drafts is not None else None
    # Time-averaged decode batch: every inter-token interval is observed when its token is emitted, so the ITL
    # sum over a window is the request-seconds spent decoding inside it (Little's law; unbiased by requests that
    # started before the window, unlike sums of whole-request times).
    itl = hist.get("itl_s")
    mean_running = itl.sum / duration_s if itl is not None and duration_s > 0 else None
    running = after.gauges.get("running")
    prompt_len, output_len = hist.get("prompt_len"), hist.get("output_len")
    return {
        "start": start.isoformat(), "end": end.isoformat(), "duration_s": duration_s,
        "drafts": drafts, "draft_tokens": d.get("draft_tokens"), "accepted_tokens": accepted,
        "generation_tokens": d.get("generation_tokens"), "prompt_tokens": d.get("prompt_tokens"),
        "requests_finished": d.get("requests_finished"), "preemptions": d.get("preemptions"),
        # AL = 1 + A/N (incl. the bonus token), rho = A/D, r_i = a_i/N: design.md §2
        "mean_acceptance_length": 1.0 + accepted / drafts if drafts and accepted is not None else None,
        "acceptance_rate": _ratio(accepted, d.get("draft_tokens")),
        "per_position": per_position,
        "mean_draft_tokens": _ratio(d.get("draft_tokens"), drafts),
        "draft_fraction": min(draft_fraction, 1.0) if draft_fraction is not None else None,
        "running": running, "waiting": after.gauges.get("waiting"),
        "kv_cache_usage": after.gauges.get("kv_cache_usage"),
        "mean_running": mean_running,
        "concurrency": mean_running if mean_running is not None else running,
        "generation_tokens_per_s": _ratio(d.get("generation_tokens"), duration_s),
        "prompt_tokens_per_s": _ratio(d.get("prompt_tokens"), duration_s),
        "requests_per_s": _ratio(d.get("requests_finished"), duration_s),
        "tpot_ms": _summary(hist.get("tpot_s"), 1e3), "itl_ms": _summary(itl, 1e3),
        "ttft_ms": _summary(hist.get("ttft_s"), 1e3), "e2e_ms": _summary(hist.get("e2e_s"), 1e3),
        "prompt_tokens_per_request": _summary(prompt_len), "output_tokens_per_request": _summary(output_len),
    }


def derive_windows(points: Sequence[tuple[dt.datetime, Snapshot]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Snapshots in time order -> (windows between consecutive snapshots, times of detected restarts)."""
    windows: list[dict[str, Any]] = []
    restarts: list[str] = []
    for (t0, before), (t1, after) in zip(points, points[1:]):
        if is_restart(before, after):
            restarts.append(t1.isoformat())
            continue
        if t1 > t0:
            windows.append(window(t0, t1, before, after))
    return windows, restarts
