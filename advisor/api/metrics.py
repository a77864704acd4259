"""Prometheus metrics: request counts and latency per route, summed over every gunicorn worker.

Under gunicorn (``advisor/gunicorn_conf.py``) ``PROMETHEUS_MULTIPROC_DIR`` is set before the workers import
this module, so each worker writes its samples to files there and ``/metrics`` merges them
(prometheus_client's multiprocess mode); without it (tests, ``flask run``) the process registry is used.
"""
from __future__ import annotations

import os
import time
from typing import Any

from flask import Flask, Response, g, request
from prometheus_client import (CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, Counter, Histogram,
                               generate_latest, multiprocess)

METHODS = {"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"}
REQUESTS = Counter("specadvisor_http_requests_total", "HTTP requests by method, route and status",
                   ["method", "route", "status"])
LATENCY = Histogram("specadvisor_http_request_duration_seconds", "HTTP request latency by method and route",
                    ["method", "route"],
                    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0))


def _start() -> None:
    g.metrics_start = time.perf_counter()


_CHILDREN: dict[tuple[str, str, int], tuple[Any, Any]] = {}


def _children(method: str, route: str, status: int) -> tuple[Any, Any]:
    """The request counter's and the latency histogram's children for one request's labels, resolved once per
    (method, route, status): ``labels()`` checked and joined the label values and took a lock on every request.
    Bounded, as the label values are: the methods above, the app's rules and the statuses it sends."""
    children = _CHILDREN.get((method, route, status))
    if children is None:
        children = _CHILDREN[method, route, status] = (REQUESTS.labels(method, route, str(status)),
                                                      LATENCY.labels(method, route))
    return children


def _observe(response: Response) -> Response:
    start = g.pop("metrics_start", None)
    if start is not None:
        req = request._get_current_object()  # one look-up of the request, not one per attribute
        method = req.method if req.method in METHODS else "other"
        rule = req.url_rule
        route = rule.rule if rule is not None else "unmatched"  # the rule, not the path: bounded label values
        count, latency = _children(method, route, response.status_code)
        count.inc()
        latency.observe(time.perf_counter() - start)
    return response


def metrics() -> Response:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    else:
        registry = REGISTRY
    response = Response(generate_latest(registry))
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST  # exactly one, with its version and charset
    return response


def init_metrics(app: Flask) -> None:
    app.before_request(_start)
    app.after_request(_observe)
    app.add_url_rule("/metrics", "metrics", metrics, methods=["GET"])
