"""/v1/health and /metrics."""
from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from ..extensions import db
from ..costmodel import COST_MODEL_VERSION

blp = Blueprint("health", __name__)


@blp.get("/v1/health")
def health():
    """Liveness and the database's state (200 when the database answers, 503 otherwise)."""
    try:
        db.session.execute(text("SELECT 1"))
        database = "ok"
    except Exception as exc:  # noqa: BLE001  (any driver error means "down")
        database = f"error: {type(exc).__name__}"
    body = {"status": "ok" if database == "ok" else "degraded", "database": database,
            "database_backend": db.engine.url.get_backend_name(), "cost_model_version": COST_MODEL_VERSION,
            "jobs": "rq" if current_app.config.get("REDIS_URL") else "background-process"}
    return jsonify(body), 200 if database == "ok" else 503


@blp.get("/metrics")
def metrics():
    return Response(generate_latest(), mimetype=CONTENT_TYPE_LATEST)
