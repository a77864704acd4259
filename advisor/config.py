"""Configuration from the environment; every setting is listed in the README's configuration table."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def _bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def default_instance_path() -> Path:
    return Path(os.environ.get("SPECADVISOR_INSTANCE", Path.cwd() / "instance")).resolve()


class Config:
    """Read once per app; tests pass overrides to ``create_app``."""

    def __init__(self) -> None:
        instance = default_instance_path()
        self.INSTANCE_PATH = str(instance)
        self.SQLALCHEMY_DATABASE_URI = _normalise_db_url(
            os.environ.get("DATABASE_URL") or f"sqlite:///{instance / 'specadvisor.db'}"
        )
        # Seconds before a database that does not answer (connect, statement, lock, pool checkout) is a 503.
        self.DB_TIMEOUT_S = float(os.environ.get("SPECADVISOR_DB_TIMEOUT_S", "5"))
        self.DB_POOL_SIZE = int(os.environ.get("SPECADVISOR_DB_POOL_SIZE", "8"))
        # A pooled server connection idle this long is pinged before use (a busy one is not: no round trip).
        self.DB_PING_IDLE_S = float(os.environ.get("SPECADVISOR_DB_PING_IDLE_S", "2"))
        # PostgreSQL synchronous_commit for the service's sessions: "on" (default) waits for the WAL flush at each
        # commit; "off" acknowledges first, and a crash of the database server (not of the service) can lose the
        # commits of its last ~0.6 s (3 × wal_writer_delay), never corrupt it (README: Configuration).
        self.DB_SYNCHRONOUS_COMMIT = os.environ.get("SPECADVISOR_PG_SYNCHRONOUS_COMMIT", "on")
        # Refuse to start against a schema this code was not written for (off only in migration commands).
        self.CHECK_SCHEMA = True
        # Apply Alembic migrations and seed the catalogs when the app starts.
        self.AUTO_MIGRATE = _bool("SPECADVISOR_AUTO_MIGRATE", True)
        # POST /v1/recommendations open to anyone (True) or token-only (False).
        self.OPEN_RECOMMENDATIONS = _bool("SPECADVISOR_OPEN_RECOMMENDATIONS", True)
        # RQ on Redis for calibration jobs; empty = run jobs in a background process of the service.
        self.REDIS_URL = os.environ.get("REDIS_URL", "")
        self.CALIBRATION_JOB_TIMEOUT_S = int(os.environ.get("SPECADVISOR_JOB_TIMEOUT_S", "3600"))
        # Seconds a worker reuses catalog rows and the newest calibration it read (changes made elsewhere show
        # up within this long; changes through the same process at once). 0 reads them on every request.
        self.CATALOG_CACHE_S = float(os.environ.get("SPECADVISOR_CATALOG_CACHE_S", "5"))
        self.REDIS_TIMEOUT_S = float(os.environ.get("SPECADVISOR_REDIS_TIMEOUT_S", "3"))
        self.MAX_CONTENT_LENGTH = 2 * 1024 * 1024
        # Deployment monitoring: scrape targets on this list (host names, addresses, CIDRs) may be private; public
        # targets are allowed unless SPECADVISOR_MONITOR_ALLOW_PUBLIC=0; each scrape is capped in time and size.
        self.MONITOR_ALLOW = os.environ.get("SPECADVISOR_MONITOR_ALLOW", "")
        self.MONITOR_ALLOW_PUBLIC = _bool("SPECADVISOR_MONITOR_ALLOW_PUBLIC", True)
        self.MONITOR_TIMEOUT_S = float(os.environ.get("SPECADVISOR_MONITOR_TIMEOUT_S", "5"))
        self.MONITOR_MAX_BYTES = int(os.environ.get("SPECADVISOR_MONITOR_MAX_BYTES", str(8 * 1024 * 1024)))
        self.API_TITLE = "specadvisor"
        self.API_VERSION = "v1"
        self.OPENAPI_VERSION = "3.0.3"
        self.OPENAPI_URL_PREFIX = "/v1"
        self.OPENAPI_JSON_PATH = "openapi.json"
        self.OPENAPI_SWAGGER_UI_PATH = "docs"
        # Served from the swagger-ui-bundle package: the docs page works offline.
        self.OPENAPI_SWAGGER_UI_URL = os.environ.get("SPECADVISOR_SWAGGER_UI_URL", "/v1/swagger-ui/")
        self.JSON_SORT_KEYS = False


def _normalise_db_url(url: str) -> str:
    """Accept the common ``postgres://`` / ``postgresql://`` spellings and use the psycopg 3 driver."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://"):]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    return url


def engine_options(url: str, timeout_s: float, pool_size: int, synchronous_commit: str = "on") -> dict:
    """SQLAlchemy engine options with time-outs, so a hung database is a 503 in seconds, not a stuck worker."""
    options: dict = {"json_serializer": _json_dumps_finite}
    if url.startswith("sqlite"):  # a local file: no connection to go stale, so no ping before each checkout
        # the busy time-out: how long a writer waits for SQLite's lock before "database is locked" (a 503)
        options["connect_args"] = {"timeout": timeout_s}
        return options
    ms = int(timeout_s * 1000)
    # a server may have dropped a pooled connection (restart, idle time-out): ping_when_idle() pings one that sat
    # idle before it is used (not pool_pre_ping, which costs a round trip on every checkout)
    options.update(pool_size=pool_size, max_overflow=2 * pool_size, pool_timeout=timeout_s, pool_recycle=1800)
    if synchronous_commit not in ("on", "off"):
        raise ValueError(f"SPECADVISOR_PG_SYNCHRONOUS_COMMIT must be on or off, not {synchronous_commit!r}")
    if url.startswith("postgresql"):
        options["connect_args"] = {
            "connect_timeout": max(1, round(timeout_s)),
            "options": f"-c statement_timeout={ms} -c lock_timeout={ms} -c idle_in_transaction_session_timeout={10 * ms}"
                       f" -c synchronous_commit={synchronous_commit}",
            # TCP keepalives notice a peer that vanished mid-query
            "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 2,
        }
    return options


def ping_when_idle(engine: Any, idle_s: float) -> None:
    """Ping a pooled connection at checkout when it sat idle in the pool for ``idle_s`` or longer, and replace
    it if the ping fails (SQLAlchemy's documented pessimistic disconnect handling, with a custom ping: a
    ``DisconnectionError`` raised at checkout makes the pool connect afresh). A server restart or an idle
    time-out drops connections that sat idle; under load each connection is back within milliseconds and is
    used without the extra round trip that ``pool_pre_ping`` spends on every checkout. A connection dropped
    while busy fails its request once (a 503); SQLAlchemy then replaces every connection of the pool."""
    from sqlalchemy import event, exc

    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_connection: Any, record: Any) -> None:
        record.info["checked_in_at"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        since = record.info.pop("checked_in_at", None)
        if since is None or time.monotonic() - since < idle_s:
            return  # new, or back in use at once
        try:
            engine.dialect.do_ping(dbapi_connection)
        except engine.dialect.loaded_dbapi.Error as error:
            raise exc.DisconnectionError(str(error)) from error


def _json_dumps_finite(value: object) -> str:
    """JSON columns: NaN and Infinity are not JSON; refuse them at the last step before the database."""
    import json

    return json.dumps(value, allow_nan=False)
