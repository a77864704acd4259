"""specadvisor: does speculative decoding in vLLM pay off for this workload? The Flask app factory."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from flask import Flask, redirect

__all__ = ["create_app"]


def create_app(overrides: dict[str, Any] | None = None) -> Flask:
    from .config import Config
    from flask_smorest import Api

    from .errors import register_error_handlers
    from .extensions import db

    app = Flask(__name__, instance_relative_config=False)
    app.config.from_object(Config())
    app.config.update(overrides or {})
    app.json.sort_keys = False
    Path(app.config["INSTANCE_PATH"]).mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)

    db.init_app(app)
    from apispec.ext.marshmallow import MarshmallowPlugin

    from .schemas import schema_name_resolver

    # one Api per app: flask-smorest keeps the spec on the Api object
    api = Api(app, spec_kwargs={"marshmallow_plugin": MarshmallowPlugin(schema_name_resolver=schema_name_resolver)})
    register_error_handlers(app)  # after Api(): our envelope replaces flask-smorest's error format

    from .api import calibrations, catalog, deployments, health, plan_reports, plans, recommendations, reports

    for module in (recommendations, catalog, calibrations, deployments, plans):
        api.register_blueprint(module.blp)
    app.register_blueprint(health.blp)
    app.register_blueprint(reports.blp)  # HTML pages, outside the OpenAPI document
    app.register_blueprint(deployments.pages)
    app.register_blueprint(plan_reports.blp)
    _register_pages(app)

    if app.config["AUTO_MIGRATE"]:
        with app.app_context():
            from .storage import seed_catalog, upgrade

            upgrade(db.engine)
            seed_catalog()
    return app


def _register_pages(app: Flask) -> None:
    from flask import send_from_directory
    from swagger_ui_bundle import swagger_ui_path

    @app.get("/")
    def index():
        return redirect("/v1/docs")

    @app.get("/v1/swagger-ui/<path:filename>")
    def swagger_ui_asset(filename: str):
        return send_from_directory(str(swagger_ui_path), filename)
