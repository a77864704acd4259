"""Deployments: register a live vLLM server, scrape its /metrics safely, derive windows and drift, re-check the verdict.

Scraping runs in ``advisor monitor --interval 60`` (a long-running process; README "Watching deployments"), or on
demand through ``POST /v1/deployments/<id>/scrape``. Every scrape is stored, failed ones too (with their state).
"""
from __future__ import annotations

import datetime as dt
import logging
import socket
import time
from typing import Any

import urllib3
from flask import current_app
from marshmallow import ValidationError
from sqlalchemy import select

from ..errors import ApiError, field_error
from ..extensions import db
from ..models import Deployment, MetricSnapshot, Recommendation, utcnow
from ..monitoring.drift import drift_flags, expectation_from_answer, operating_point_scenario
from ..monitoring.exposition import NotPrometheusError, Snapshot, parse_snapshot
from ..monitoring.targets import TargetPolicy, TargetRefused, check_addresses, check_url, literal_address
from ..monitoring.windows import derive_windows
from . import recommendations

log = logging.getLogger(__name__)

STATE_MESSAGES = {"pending": "not scraped yet", "ok": "scraping", "unreachable": "unreachable since {since}",
                  "not_prometheus": "not a vLLM Prometheus endpoint since {since}",
                  "no_spec_decode": "no spec-decode counters since {since}", "refused": "refused since {since}"}
FLAGS = ("acceptance_below_prediction", "acceptance_above_prediction", "concurrency_above_break_even",
         "tpot_worse_than_baseline")
DEFAULT_DRIFT_SNAPSHOTS = 200


class ScrapeError(Exception):
    def __init__(self, state: str, message: str) -> None:
        super().__init__(message)
        self.state = state
        self.message = message


# ------------------------------------------------------------------------------------------------ targets
def policy() -> TargetPolicy:
    return TargetPolicy.from_setting(current_app.config.get("MONITOR_ALLOW", ""),
                                     current_app.config.get("MONITOR_ALLOW_PUBLIC", True))


def _resolve(host: str, port: int) -> list:
    literal = literal_address(host)
    if literal is not None:
        return [literal]
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise TargetRefused(f"host '{host}' does not resolve ({exc})") from None
    seen = {}
    for *_, sockaddr in infos:
        address = literal_address(sockaddr[0].split("%")[0])
        if address is not None:
            seen[address] = None
    return list(seen)


def checked_target(url: str, target_policy: TargetPolicy) -> tuple[str, int, str, Any]:
    """(scheme, port, host, address to connect to) of a URL the policy allows, else ``TargetRefused``."""
    scheme, port, host = check_url(url)
    addresses = _resolve(host, port)
    check_addresses(host, addresses, target_policy)
    return scheme, port, host, addresses[0]


def fetch(url: str, target_policy: TargetPolicy, timeout_s: float, max_bytes: int) -> bytes:
    """GET ``url`` pinned to the checked address: no redirects, at most ``max_bytes``, at most ``timeout_s``."""
    try:
        scheme, port, host, address = checked_target(url, target_policy)
    except TargetRefused as exc:
        raise ScrapeError("refused", str(exc)) from None
    split = urllib3.util.parse_url(url)
    path = (split.path or "/") + (f"?{split.query}" if split.query else "")
    timeout = urllib3.Timeout(connect=timeout_s, read=timeout_s)
    common = {"port": port, "timeout": timeout, "retries": False, "maxsize": 1}
    if scheme == "https":
        pool = urllib3.HTTPSConnectionPool(str(address), server_hostname=host, assert_hostname=host, **common)
    else:
        pool = urllib3.HTTPConnectionPool(str(address), **common)
    deadline = time.monotonic() + timeout_s
    host_header = host if split.port is None else f"{host}:{port}"
    try:
        response = pool.urlopen("GET", path, headers={"Host": host_header, "Accept": "text/plain"},
                                redirect=False, preload_content=False)
        try:
            if 300 <= response.status < 400:
                raise ScrapeError("refused", f"redirects are not followed (HTTP {response.status} to "
                                             f"{response.headers.get('Location', '?')[:200]})")
            if response.status != 200:
                raise ScrapeError("unreachable", f"HTTP {response.status}")
            body = bytearray()
            for chunk in response.stream(64 * 1024):
                body += chunk
                if len(body) > max_bytes:
                    raise ScrapeError("refused", f"response larger than {max_bytes:,} bytes")
                if time.monotonic() > deadline:
                    raise ScrapeError("unreachable", f"response took longer than {timeout_s:g} s")
            return bytes(body)
        finally:
            response.release_conn()
    except ScrapeError:
        raise
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise ScrapeError("unreachable", f"{type(exc).__name__}: {str(exc)[:200]}") from None
    finally:
        pool.close()


# ------------------------------------------------------------------------------------------------ CRUD
def create(data: dict[str, Any]) -> Deployment:
    try:
        checked_target(data["metrics_url"], policy())
    except TargetRefused as exc:
        raise field_error("metrics_url", str(exc)) from None
    if data.get("scenario") is not None:
        rec = recommendations.get(recommendations.create(data["scenario"])["id"])
    else:
        rec = db.session.get(Recommendation, data["recommendation_id"])
        if rec is None:
            raise field_error("recommendation_id", f"No recommendation with id {data['recommendation_id']}.")
    deployment = Deployment(label=data["label"], metrics_url=data["metrics_url"], recommendation=rec,
                            state="pending", state_since=utcnow(), latest={})
    db.session.add(deployment)
    db.session.commit()
    return deployment


def get(deployment_id: int) -> Deployment:
    deployment = db.session.get(Deployment, deployment_id)
    if deployment is None:
        raise ApiError(404, f"No deployment with id {deployment_id}.")
    return deployment


def list_all() -> list[Deployment]:
    return list(db.session.scalars(select(Deployment).order_by(Deployment.id)))


def delete(deployment_id: int) -> None:
    deployment = get(deployment_id)
    db.session.execute(MetricSnapshot.__table__.delete().where(MetricSnapshot.deployment_id == deployment.id))
    db.session.delete(deployment)
    db.session.commit()


def as_dict(deployment: Deployment) -> dict[str, Any]:
    since = deployment.state_since.isoformat() if deployment.state_since else "?"
    message = STATE_MESSAGES.get(deployment.state, deployment.state).format(since=since)
    return {"id": deployment.id, "label": deployment.label, "metrics_url": deployment.metrics_url,
            "recommendation_id": deployment.recommendation_id, "created_at": deployment.created_at,
            "state": deployment.state, "status": message, "state_message": deployment.state_message,
            "state_since": deployment.state_since, "last_scrape_at": deployment.last_scrape_at,
            "last_success_at": deployment.last_success_at, "latest": deployment.latest or {}}


# ------------------------------------------------------------------------------------------------ scraping
def scrape(deployment: Deployment) -> MetricSnapshot:
    """Fetch, parse and store one snapshot (a failed one too), update the state and the latest window."""
    cfg = current_app.config
    started = time.monotonic()
    now = utcnow()
    snapshot = MetricSnapshot(deployment=deployment, scraped_at=now, ok=False)
    try:
        body = fetch(deployment.metrics_url, policy(), float(cfg.get("MONITOR_TIMEOUT_S", 5.0)),
                     int(cfg.get("MONITOR_MAX_BYTES", 8 * 1024 * 1024)))
        snapshot.size_bytes = len(body)
        try:
            parsed = parse_snapshot(body.decode("utf-8"))
        except UnicodeDecodeError:
            raise ScrapeError("not_prometheus", "response is not UTF-8 text") from None
        except NotPrometheusError as exc:
            raise ScrapeError("not_prometheus", str(exc)) from None
        snapshot.values = parsed.to_dict()
        if parsed.has_spec_decode:
            snapshot.ok, snapshot.state = True, "ok"
        else:
            snapshot.state, snapshot.error = "no_spec_decode", (
                "vLLM metrics without spec-decode counters (vllm:spec_decode_num_drafts …): is speculative decoding "
                "configured on this server?")
    except ScrapeError as exc:
        snapshot.state, snapshot.error = exc.state, exc.message
    snapshot.duration_ms = (time.monotonic() - started) * 1e3
    db.session.add(snapshot)
    if deployment.state != snapshot.state:
        deployment.state, deployment.state_since = snapshot.state, now
    deployment.state_message = snapshot.error
    deployment.last_scrape_at = now
    if snapshot.ok:
        deployment.last_success_at = now
    db.session.flush()
    deployment.latest = latest(deployment)
    db.session.commit()
    return snapshot


def scrape_all() -> list[tuple[int, str]]:
    """One scrape of every deployment; an error in one never stops the others."""
    out = []
    db.session.expire_all()  # a long-running monitor sees deployments added, changed or deleted meanwhile
    for deployment_id in db.session.scalars(select(Deployment.id).order_by(Deployment.id)).all():
        deployment = db.session.get(Deployment, deployment_id)
        if deployment is None:  # deleted since the list was read
            continue
        try:
            snapshot = scrape(deployment)
            out.append((deployment_id, snapshot.state))
        except Exception:  # noqa: BLE001  (a database hiccup for one row; log and go on)
            db.session.rollback()
            log.exception("scrape of deployment %s failed", deployment_id)
            out.append((deployment_id, "error"))
    return out


# ------------------------------------------------------------------------------------------------ drift
def _points(deployment: Deployment, limit: int) -> tuple[list[tuple[dt.datetime, Snapshot]], int, int]:
    rows = list(db.session.scalars(select(MetricSnapshot).where(MetricSnapshot.deployment_id == deployment.id)
                                   .order_by(MetricSnapshot.id.desc()).limit(limit)))[::-1]
    points = [(_aware(r.scraped_at), Snapshot.from_dict(r.values)) for r in rows if r.ok and r.values]
    return points, len(rows), sum(1 for r in rows if not r.ok)


def _aware(value: dt.datetime) -> dt.datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.timezone.utc)  # SQLite drops the zone


def verdict_today(scenario: dict[str, Any], window: dict[str, Any]) -> dict[str, Any]:
    """The cost model re-run at the window's operating point (concurrency, lengths, observed acceptance)."""
    from ..schemas import ScenarioSchema

    moved, sources = operating_point_scenario(scenario, window)
    try:
        answer = recommendations.predict(ScenarioSchema().load(moved)).data
    except ValidationError as exc:
        return {"error": f"the observed operating point is not a valid scenario: {exc.messages}", "scenario": moved}
    except ApiError as exc:
        return {"error": exc.message, "scenario": moved}
    return {"decision": answer["decision"], "reasons": answer["reasons"], "speedup": answer["speedup"],
            "num_speculative_tokens": answer["num_speculative_tokens"],
            "break_even_concurrency": answer["break_even_concurrency"], "tpot_ms": answer["tpot_ms"],
            "mean_acceptance_length": answer["acceptance"]["mean_acceptance_length"], "dynamic_sd": answer["dynamic_sd"],
            "scenario": moved, "sources": sources}


def latest(deployment: Deployment) -> dict[str, Any]:
    """The newest window (since the last restart), its flags and the verdict at its operating point."""
    points, _, _ = _points(deployment, 3)
    windows, restarts = derive_windows(points)
    if not windows or windows[-1]["end"] != points[-1][0].isoformat():
        return {"window": None, "flags": [], "restarted_at": restarts[-1] if restarts else None}
    rec = deployment.recommendation
    window = windows[-1]
    return {"window": window, "flags": drift_flags(window, expectation_from_answer(rec.answer, rec.id)),
            "verdict_today": verdict_today(rec.inputs, window)}


def drift(deployment: Deployment, limit: int = DEFAULT_DRIFT_SNAPSHOTS) -> dict[str, Any]:
    """Windows over the newest ``limit`` snapshots, each with its flags; the expectation; the verdict today."""
    rec = deployment.recommendation
    expected = expectation_from_answer(rec.answer, rec.id)
    points, total, failed = _points(deployment, limit)
    windows, restarts = derive_windows(points)
    for window in windows:
        window["flags"] = drift_flags(window, expected)
    now = deployment.latest or {}
    return {"deployment": as_dict(deployment), "expected": expected.to_dict(), "windows": windows,
            "restarts": restarts, "flags": now.get("flags", []), "latest": now.get("window"),
            "verdict_today": now.get("verdict_today"),
            "snapshots": {"read": total, "failed": failed, "model_name": points[-1][1].model_name if points else None,
                          "vllm_names": points[-1][1].names if points else {}},
            "sources": {"windows": "observed: differences of the deployment's vLLM counters between scrapes",
                        "expected": f"recommendation:{rec.id}", "expected.al_low": expected.al_band_source,
                        "verdict_today": "cost model at the observed operating point (verdict_today.sources)"}}


# ------------------------------------------------------------------------------------------------ our metrics
class DeploymentCollector:
    """Prometheus metrics of our own from the stored deployments (read at scrape time, any worker or process)."""

    def collect(self):  # noqa: ANN201
        from flask import has_app_context
        from prometheus_client.core import GaugeMetricFamily

        if not has_app_context():
            return
        labels = ["deployment", "label"]
        up = GaugeMetricFamily("specadvisor_deployment_up", "1 when the last scrape of the deployment succeeded",
                               labels=labels + ["state"])
        flag = GaugeMetricFamily("specadvisor_deployment_drift", "1 when the newest window raises this drift flag",
                                 labels=labels + ["flag"])
        realised = GaugeMetricFamily("specadvisor_deployment_realised_acceptance_length",
                                     "AL = 1 + accepted/drafts over the newest window", labels=labels)
        predicted = GaugeMetricFamily("specadvisor_deployment_predicted_acceptance_length",
                                      "AL the recommendation predicted", labels=labels)
        concurrency = GaugeMetricFamily("specadvisor_deployment_concurrency",
                                        "time-averaged running requests over the newest window", labels=labels)
        break_even = GaugeMetricFamily("specadvisor_deployment_break_even_concurrency",
                                       "concurrency above which the recommendation's speculation stops paying",
                                       labels=labels)
        last = GaugeMetricFamily("specadvisor_deployment_last_scrape_timestamp_seconds", "time of the last scrape",
                                 labels=labels)
        try:
            deployments = list_all()
        except Exception:  # noqa: BLE001  (the database being down must not break /metrics)
            db.session.rollback()
            return
        for d in deployments:
            ident = [str(d.id), d.label]
            up.add_metric(ident + [d.state], 1.0 if d.state == "ok" else 0.0)
            raised = {f["flag"] for f in (d.latest or {}).get("flags", [])}
            for name in FLAGS:
                flag.add_metric(ident + [name], 1.0 if name in raised else 0.0)
            window = (d.latest or {}).get("window") or {}
            if window.get("mean_acceptance_length") is not None:
                realised.add_metric(ident, window["mean_acceptance_length"])
            if window.get("concurrency") is not None:
                concurrency.add_metric(ident, window["concurrency"])
            answer = d.recommendation.answer
            if (answer.get("acceptance") or {}).get("mean_acceptance_length") is not None:
                predicted.add_metric(ident, answer["acceptance"]["mean_acceptance_length"])
            if answer.get("break_even_concurrency") is not None:
                break_even.add_metric(ident, answer["break_even_concurrency"])
            if d.last_scrape_at is not None:
                last.add_metric(ident, _aware(d.last_scrape_at).timestamp())
        yield from (up, flag, realised, predicted, concurrency, break_even, last)


_COLLECTOR: DeploymentCollector | None = None


def register_collector() -> None:
    """Add the collector to prometheus_client's default registry (served by ``/metrics``) once per process."""
    global _COLLECTOR
    if _COLLECTOR is None:
        from prometheus_client import REGISTRY

        _COLLECTOR = DeploymentCollector()
        REGISTRY.register(_COLLECTOR)
