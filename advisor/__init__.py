"""specadvisor: does speculative decoding in vLLM pay off for this workload? The Flask app factory."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # Flask is imported where an app is made: the cost model (advisor.costmodel) and the GPU
    from flask import Flask  # probes that use it run where Flask is not installed

__all__ = ["create_app"]

log = logging.getLogger(__name__)


def create_app(overrides: dict[str, Any] | None = None) -> Flask:
    from flask_smorest import Api

    from .config import Config, engine_options
    from .errors import ErrorSchema, JSONProvider, register_error_handlers
    from .extensions import db
    from .web import App

    app = App(__name__, instance_relative_config=False)
    app.json = JSONProvider(app)  # bounded parsing (a 400 for abuse), no NaN or Infinity in any answer
    app.config.from_object(Config())
    app.config.update(overrides or {})
    app.config.setdefault("SQLALCHEMY_ENGINE_OPTIONS", engine_options(
        app.config["SQLALCHEMY_DATABASE_URI"], app.config["DB_TIMEOUT_S"], app.config["DB_POOL_SIZE"],
        app.config["DB_SYNCHRONOUS_COMMIT"]))
    Path(app.config["INSTANCE_PATH"]).mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)

    db.init_app(app)
    from apispec.ext.marshmallow import MarshmallowPlugin

    from .api import ID_SCHEMA, IdConverter
    from .schemas import schema_name_resolver

    class SpecAdvisorApi(Api):
        ERROR_SCHEMA = ErrorSchema  # the documented error body is the one the service sends

        def _register_pagination_header(self) -> None:
            # the header's value is a JSON text; documented as a string (an object schema means "k,v,k,v")
            self.spec.components.header("PAGINATION", {
                "description": "Pagination metadata, a JSON object: total, total_pages, first_page, last_page, "
                               "page, previous_page, next_page.", "schema": {"type": "string"}}, lazy=True)

    # one Api per app: flask-smorest keeps the spec on the Api object
    api = SpecAdvisorApi(app, spec_kwargs={
        "marshmallow_plugin": MarshmallowPlugin(schema_name_resolver=schema_name_resolver)})
    app.url_map.converters["id"] = IdConverter
    api.register_converter(IdConverter, lambda _converter: dict(ID_SCHEMA))
    register_error_handlers(app)  # after Api(): our envelope replaces flask-smorest's error format

    from .api import calibrations, catalog, deployments, health, plan_reports, plans, recommendations, reports
    from .api.metrics import init_metrics

    for module in (recommendations, catalog, calibrations, deployments, plans):
        api.register_blueprint(module.blp)
    app.register_blueprint(health.blp)
    app.register_blueprint(reports.blp)  # HTML pages, outside the OpenAPI document
    app.register_blueprint(deployments.pages)
    app.register_blueprint(plan_reports.blp)
    _register_pages(app)
    init_metrics(app)

    with app.app_context():
        _prepare_database(app)
    return app


def _prepare_database(app: Flask) -> None:
    """SQLite pragmas; migrations and seeding (auto-migrate), or refusing a schema this code does not know."""
    from sqlalchemy import event
    from sqlalchemy.exc import OperationalError

    from .config import ping_when_idle
    from .extensions import db
    from .storage import check_schema, seed_catalog, upgrade

    engine = db.engine
    if engine.dialect.name != "sqlite":  # a SQLite file has no connection that a server could drop
        ping_when_idle(engine, app.config["DB_PING_IDLE_S"])
    else:
        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection, _record) -> None:  # noqa: ANN001
            cursor = dbapi_connection.cursor()
            # WAL: readers never wait for the writer; workers and threads share the file
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

    if app.config["AUTO_MIGRATE"]:
        upgrade(engine)
        added = seed_catalog()
        log.info("database at the current schema; catalog seeded (%d GPUs, %d models added)",
                 added["gpus"], added["models"])
    elif app.config["CHECK_SCHEMA"]:
        try:
            check_schema(engine)
        except OperationalError as exc:  # down at start: serve anyway, /v1/health and every route say 503
            log.warning("database unreachable at start (%s); not checking its schema now",
                        str(exc).splitlines()[0][:200])


def _register_pages(app: Flask) -> None:
    from flask import redirect, send_from_directory
    from swagger_ui_bundle import swagger_ui_path

    @app.get("/")
    def index():
        return redirect("/v1/docs")

    @app.get("/v1/swagger-ui/<path:filename>")
    def swagger_ui_asset(filename: str):
        return send_from_directory(str(swagger_ui_path), filename)
