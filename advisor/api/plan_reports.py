"""HTML page of a capacity plan (outside the OpenAPI document, like the other reports)."""
from __future__ import annotations

from flask import Blueprint, Response

from ..services import plans
from .reports import html_response

blp = Blueprint("plan_reports", __name__)


@blp.get("/v1/plans/<id:plan_id>/report")
def plan_report(plan_id: int) -> Response:
    """A plan's ranking and its monthly cost per option, with and without speculation, per load level."""
    from ..reports.plan_page import plan_page

    return html_response(plan_page(plans.as_dict(plans.get(plan_id))))
