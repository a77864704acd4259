"""/v1/health: the database and Redis, reported separately."""
from __future__ import annotations

from flask import Blueprint, current_app, jsonify
from sqlalchemy import text

from ..costmodel import COST_MODEL_VERSION
from ..extensions import db

blp = Blueprint("health", __name__)


def _database() -> str:
    try:
        db.session.execute(text("SELECT 1"))
        return "ok"
    except Exception as exc:  # noqa: BLE001  (any driver or pool error means "down")
        db.session.rollback()
        return f"error: {type(exc).__name__}"


def _redis() -> str:
    url = current_app.config.get("REDIS_URL")
    if not url:
        return "not configured"
    from ..services.calibrations import redis_connection

    try:
        redis_connection(url).ping()
        return "ok"
    except Exception as exc:  # noqa: BLE001
        return f"error: {type(exc).__name__}"


@blp.get("/v1/health")
def health():
    """200 when the database answers (``degraded`` if Redis, needed only to queue calibrations, does not);
    503 when the database does not. Each part is bounded by its time-out (SPECADVISOR_DB_TIMEOUT_S,
    SPECADVISOR_REDIS_TIMEOUT_S)."""
    database, redis = _database(), _redis()
    status = "ok" if database == "ok" and redis in ("ok", "not configured") else "degraded"
    body = {"status": status, "database": database, "database_backend": db.engine.url.get_backend_name(),
            "redis": redis, "cost_model_version": COST_MODEL_VERSION,
            "jobs": "rq" if current_app.config.get("REDIS_URL") else "background-process"}
    if database == "ok":
        return jsonify(body), 200
    return jsonify(body), 503, {"Retry-After": "5"}
