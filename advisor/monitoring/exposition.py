"""vLLM's Prometheus exposition text -> a compact, JSON-storable ``Snapshot`` of the figures we watch.

Parsed with ``prometheus_client.parser`` (never by hand). Names are matched across the vLLM releases we support
(0.24–0.33, V1 engine): counters are exposed with ``_total`` (the parser strips it from the family name; untyped
families keep it, so we strip it too), ``_created`` samples are ignored, per-position acceptance is the counter
``vllm:spec_decode_num_accepted_tokens_per_pos{position="i"}``. Samples of several engines (data parallel) and
label sets are summed; KV usage is averaged over engines.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

# canonical key -> vLLM metric family names, first found wins (newest name first).
COUNTERS: dict[str, tuple[str, ...]] = {
    "drafts": ("vllm:spec_decode_num_drafts",),
    "draft_tokens": ("vllm:spec_decode_num_draft_tokens",),
    "accepted_tokens": ("vllm:spec_decode_num_accepted_tokens",),
    "generation_tokens": ("vllm:generation_tokens",),
    "prompt_tokens": ("vllm:prompt_tokens",),
    "requests_finished": ("vllm:request_success",),
    "preemptions": ("vllm:num_preemptions",),
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
GAUGES: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    # 0.24+: kv_cache_usage_perc; gpu_cache_usage_perc before (both a fraction in [0, 1] despite the name)
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "process_start_time_s": ("process_start_time_seconds",),
}
AVERAGED_GAUGES = ("kv_cache_usage",)
HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft_s": ("vllm:time_to_first_token_seconds",),
    # per-request mean time per output token; older releases only had the per-step histogram under this name
    "tpot_s": ("vllm:request_time_per_output_token_seconds", "vllm:time_per_output_token_seconds"),
    "itl_s": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "e2e_s": ("vllm:e2e_request_latency_seconds",),
    "prompt_len": ("vllm:request_prompt_tokens",),
    "output_len": ("vllm:request_generation_tokens",),
}
SPEC_KEYS = ("drafts", "draft_tokens", "accepted_tokens")


class NotPrometheusError(ValueError):
    """The text is not Prometheus exposition format, or holds no vLLM metrics."""


@dataclass(frozen=True)
class Histogram:
    """Cumulative buckets ``[(upper bound, count), …]`` ending at +Inf, plus the sum and count of observations."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float

    def to_dict(self) -> dict[str, Any]:
        return {"buckets": [[_json_bound(le), n] for le, n in self.buckets], "sum": self.sum, "count": self.count}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Histogram:
        return cls(tuple((float(le), float(n)) for le, n in data["buckets"]), float(data["sum"]), float(data["count"]))


def _json_bound(le: float) -> float | str:
    return "+Inf" if math.isinf(le) else le


@dataclass(frozen=True)
class Snapshot:
    """The figures of one scrape: cumulative counters, per-position accepted counts, gauges, histograms.

    ``names`` records which vLLM metric each canonical key was read from (versions differ); ``model_name`` is
    the served model's label where vLLM gives it.
    """

    counters: dict[str, float] = field(default_factory=dict)
    per_position: tuple[float, ...] = ()
    gauges: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)
    model_name: str | None = None

    @property
    def has_spec_decode(self) -> bool:
        return all(key in self.counters for key in SPEC_KEYS)

    def to_dict(self) -> dict[str, Any]:
        return {"counters": dict(self.counters), "per_position": list(self.per_position), "gauges": dict(self.gauges),
                "histograms": {k: h.to_dict() for k, h in self.histograms.items()}, "names": dict(self.names),
                "model_name": self.model_name}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Snapshot:
        return cls(counters={k: float(v) for k, v in (data.get("counters") or {}).items()},
                   per_position=tuple(float(v) for v in data.get("per_position") or ()),
                   gauges={k: float(v) for k, v in (data.get("gauges") or {}).items()},
                   histograms={k: Histogram.from_dict(v) for k, v in (data.get("histograms") or {}).items()},
                   names=dict(data.get("names") or {}), model_name=data.get("model_name"))


def _family_name(name: str) -> str:
    return name[: -len("_total")] if name.endswith("_total") else name


def parse_snapshot(text: str) -> Snapshot:
    """Parse a ``/metrics`` body; raises ``NotPrometheusError`` when it is not exposition text with vLLM metrics."""
    samples: dict[str, list[tuple[str, dict[str, str], float]]] = {}
    try:
        for family in text_string_to_metric_families(text):
            name = _family_name(family.name)
            if name.endswith("_created"):
                continue
            samples.setdefault(name, []).extend((s.name, dict(s.labels), float(s.value)) for s in family.samples)
    except (ValueError, TypeError, IndexError) as exc:
        raise NotPrometheusError(f"not Prometheus exposition text: {str(exc)[:120]}") from None
    if not samples:
        raise NotPrometheusError("no metrics in the response")
    if not any(name.startswith("vllm:") for name in samples):
        raise NotPrometheusError("Prometheus metrics, but none of vLLM's (no 'vllm:' names)")

    names: dict[str, str] = {}
    model_name = None

    def pick(key: str, candidates: tuple[str, ...]) -> list[tuple[str, dict[str, str], float]] | None:
        nonlocal model_name
        for candidate in candidates:
            if candidate in samples:
                names[key] = candidate
                rows = samples[candidate]
                model_name = model_name or next((lab.get("model_name") for _, lab, _ in rows if lab.get("model_name")),
                                                None)
                return rows
        return None

    counters = {}
    for key, candidates in COUNTERS.items():
        rows = pick(key, candidates)
        if rows is not None:
            counters[key] = sum(v for n, _, v in rows if not n.endswith("_created"))
    by_position: dict[int, float] = {}
    for sample_name, labels, value in samples.get(PER_POSITION, []):
        if sample_name.endswith("_created") or not str(labels.get("position", "")).isdigit():
            continue
        pos = int(labels["position"])
        by_position[pos] = by_position.get(pos, 0.0) + value
    if by_position:
        names["per_position"] = PER_POSITION
    per_position = tuple(by_position.get(i, 0.0) for i in range(max(by_position) + 1)) if by_position else ()

    gauges = {}
    for key, candidates in GAUGES.items():
        rows = pick(key, candidates)
        if rows:
            values = [v for _, _, v in rows]
            gauges[key] = sum(values) / len(values) if key in AVERAGED_GAUGES else sum(values)
    if "process_start_time_s" in gauges:  # one process: not a sum over label sets
        gauges["process_start_time_s"] = samples[names["process_start_time_s"]][0][2]

    histograms = {}
    for key, candidates in HISTOGRAMS.items():
        rows = pick(key, candidates)
        if rows:
            histogram = _histogram(names[key], rows)
            if histogram is not None:
                histograms[key] = histogram
    return Snapshot(counters, per_position, gauges, histograms, names, model_name)


def _histogram(name: str, rows: list[tuple[str, dict[str, str], float]]) -> Histogram | None:
    buckets: dict[float, float] = {}
    total = count = 0.0
    for sample_name, labels, value in rows:
        if sample_name == f"{name}_bucket" and "le" in labels:
            le = float(labels["le"])
            buckets[le] = buckets.get(le, 0.0) + value
        elif sample_name == f"{name}_sum":
            total += value
        elif sample_name == f"{name}_count":
            count += value
    if not buckets:
        return None
    return Histogram(tuple(sorted(buckets.items())), total, count)

