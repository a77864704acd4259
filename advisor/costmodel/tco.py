"""Total cost of ownership: $ per 1M output tokens, GPUs needed for a load under an SLO, monthly cost."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from .types import Slo


def usd_per_million_tokens(gpu_hour_usd: float, gpu_count: int, throughput_tok_s: float) -> float:
    """$ / 1M tokens = $/GPU-h × GPUs / (tok/s × 3600 s/h) × 1e6."""
    if throughput_tok_s <= 0:
        return math.inf
    return gpu_hour_usd * gpu_count / (throughput_tok_s * 3600.0) * 1e6


@dataclass(frozen=True)
class OperatingPoint:
    concurrency: float
    throughput_tok_s: float
    tpot_ms: float
    latency_ms: float

    def to_dict(self) -> dict[str, float]:
        return {"concurrency": self.concurrency, "throughput_tok_s": self.throughput_tok_s, "tpot_ms": self.tpot_ms,
                "latency_ms": self.latency_ms}


def best_operating_point(concurrency: np.ndarray, throughput_tok_s: np.ndarray, tpot_ms: np.ndarray,
                         latency_ms: np.ndarray, ttft_ms: np.ndarray, max_concurrency: int,
                         slo: Slo | None) -> OperatingPoint | None:
    """Highest-throughput concurrency that fits in memory and meets every stated SLO."""
    ok = concurrency <= max(max_concurrency, 0)
    if slo is not None:
        if slo.tpot_ms is not None:
            ok &= tpot_ms <= slo.tpot_ms
        if slo.latency_ms is not None:
            ok &= latency_ms <= slo.latency_ms
        if slo.ttft_ms is not None:
            ok &= ttft_ms <= slo.ttft_ms
    if not ok.any():
        return None
    idx = int(np.argmax(np.where(ok, throughput_tok_s, -np.inf)))
    return OperatingPoint(float(concurrency[idx]), float(throughput_tok_s[idx]), float(tpot_ms[idx]),
                          float(latency_ms[idx]))


# A replica short of the load by less than this fraction counts as serving it: the workload's concurrency from an
# arrival rate is a Little's-law fixed point solved to 1e-4 sequences, so the throughput there matches
# requests/s × output tokens only to ~1e-5 (and the model itself is good to ~10 %).
REPLICA_TOLERANCE = 1e-3


def gpus_needed(load_tok_s: float, per_replica_tok_s: float, gpu_count: int) -> int:
    """Replicas = ⌈load / replica throughput⌉; each replica holds gpu_count GPUs (tensor parallel)."""
    if per_replica_tok_s <= 0:
        return 0
    return int(math.ceil(load_tok_s / per_replica_tok_s - REPLICA_TOLERANCE)) * gpu_count


@dataclass(frozen=True)
class TcoReport:
    gpu_hour_usd: float
    hours_per_month: float
    load_output_tokens_per_second: float | None
    usd_per_million_output_tokens: dict[str, float | None]
    operating_point: dict[str, dict[str, float] | None]
    gpus_needed: dict[str, int | None]
    monthly_usd: dict[str, float | None]
    monthly_savings_usd: float | None
    savings_fraction: float | None
    slo: dict[str, Any] | None = None  # the SLO the operating points meet, and where it came from

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}  # values are already JSON-able


def tco_report(gpu_hour_usd: float, gpu_count: int, hours_per_month: float,
               throughput_at_workload: dict[str, float], points: dict[str, OperatingPoint | None],
               load_tok_s: float | None, slo: dict[str, Any] | None = None) -> TcoReport:
    """Cost at the workload's concurrency, and the fleet for a stated load at the best SLO-meeting point."""
    per_m = {mode: _finite(usd_per_million_tokens(gpu_hour_usd, gpu_count, tp))
             for mode, tp in throughput_at_workload.items()}
    gpus: dict[str, int | None] = {}
    monthly: dict[str, float | None] = {}
    for mode, point in points.items():
        if point is None:
            gpus[mode], monthly[mode] = None, None
            continue
        gpus[mode] = gpus_needed(load_tok_s, point.throughput_tok_s, gpu_count) if load_tok_s else gpu_count
        monthly[mode] = gpus[mode] * hours_per_month * gpu_hour_usd  # GPUs × h/month × $/GPU-h
    savings = None
    fraction = None
    if monthly.get("baseline") is not None and monthly.get("speculative") is not None:
        savings = monthly["baseline"] - monthly["speculative"]
        fraction = savings / monthly["baseline"] if monthly["baseline"] else None
    return TcoReport(gpu_hour_usd=gpu_hour_usd, hours_per_month=hours_per_month, load_output_tokens_per_second=load_tok_s,
                     usd_per_million_output_tokens=per_m,
                     operating_point={m: (p.to_dict() if p else None) for m, p in points.items()},
                     gpus_needed=gpus, monthly_usd=monthly, monthly_savings_usd=savings, savings_fraction=fraction,
                     slo=slo)


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
