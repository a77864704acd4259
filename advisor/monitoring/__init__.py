"""Watching live vLLM deployments: pure functions (no Flask, no DB, no I/O).

- ``exposition``: vLLM's Prometheus ``/metrics`` text -> a compact ``Snapshot`` (prometheus_client's parser);
- ``windows``: consecutive snapshots -> per-window figures from counter differences (restarts start a new window);
- ``drift``: a window against the recommendation it was deployed from -> drift flags with plain reasons, and the
  scenario at the observed operating point (for re-running the cost model);
- ``targets``: which scrape URLs the service may fetch (allow-list, private and metadata addresses).
"""
from __future__ import annotations

from .drift import Expectation, drift_flags, expectation_from_answer, operating_point_scenario
from .exposition import NotPrometheusError, Snapshot, parse_snapshot
from .targets import TargetRefused, TargetPolicy, check_addresses, check_url
from .windows import derive_windows, histogram_quantile

__all__ = [
    "Expectation", "NotPrometheusError", "Snapshot", "TargetPolicy", "TargetRefused", "check_addresses",
    "check_url", "derive_windows", "drift_flags", "expectation_from_answer", "histogram_quantile",
    "operating_point_scenario", "parse_snapshot",
]
