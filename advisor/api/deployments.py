"""/v1/deployments: live vLLM servers watched against their recommendation (register, list, drift, report)."""
from __future__ import annotations

from flask import Blueprint as FlaskBlueprint
from flask import Response
from flask.views import MethodView
from . import Blueprint

from ..auth import token_required
from ..schemas import (DeploymentCreateSchema, DeploymentSchema, DriftQuerySchema, DriftSchema,
                       ScrapeResultSchema)
from ..services import deployments as service

blp = Blueprint("deployments", __name__, url_prefix="/v1/deployments",
                description="Live vLLM servers: realised acceptance and operating point from /metrics, drift "
                            "against the recommendation, the verdict at today's operating point.")
pages = FlaskBlueprint("deployment_pages", __name__)  # HTML, outside the OpenAPI document
service.register_collector()  # our /metrics: drift flags per deployment


@blp.route("")
class Deployments(MethodView):
    @blp.response(200, DeploymentSchema(many=True))
    def get(self):
        """Every registered deployment with its state and newest window."""
        return [service.as_dict(d) for d in service.list_all()]

    @token_required
    @blp.arguments(DeploymentCreateSchema)
    @blp.response(201, DeploymentSchema)
    def post(self, data):
        """Register a vLLM server's /metrics URL with the recommendation (or scenario) it was deployed from."""
        return service.as_dict(service.create(data))


@blp.route("/<id:deployment_id>")
class DeploymentById(MethodView):
    @blp.response(200, DeploymentSchema)
    def get(self, deployment_id):
        """One deployment: state ('unreachable since …'), newest window, flags."""
        return service.as_dict(service.get(deployment_id))

    @token_required
    @blp.response(204)
    def delete(self, deployment_id):
        """Stop watching; its snapshots go too."""
        service.delete(deployment_id)


@blp.route("/<id:deployment_id>/scrape")
class Scrape(MethodView):
    @token_required
    @blp.response(201, ScrapeResultSchema)
    def post(self, deployment_id):
        """Scrape now (``advisor monitor`` does this on its interval); a failed scrape is stored with its state."""
        return service.scrape(service.get(deployment_id))


@blp.route("/<id:deployment_id>/drift")
class Drift(MethodView):
    @blp.arguments(DriftQuerySchema, location="query")
    @blp.response(200, DriftSchema)
    def get(self, args, deployment_id):
        """Windows, restarts, drift flags and the verdict at the observed operating point."""
        return service.drift(service.get(deployment_id), args["limit"])


@pages.get("/v1/deployments/<id:deployment_id>/report")
def deployment_report(deployment_id: int) -> Response:
    """The drift as a page: realised AL vs the predicted band, concurrency vs break-even, TPOT, flags, verdict."""
    from ..reports.deployment import deployment_page
    from .reports import html_response

    return html_response(deployment_page(service.drift(service.get(deployment_id))))
