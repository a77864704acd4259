"""HTML pages: recommendation reports, comparisons, calibration runs (outside the OpenAPI document).

Views stay thin: a service call, a renderer, an HTML response. Unknown ids are 404 envelopes (the services
raise ``ApiError``); bad query strings are 422 envelopes.
"""

from __future__ import annotations

from flask import Blueprint, Response, request

from ..errors import field_error
from ..schemas import MAX_ID
from ..services import calibrations, recommendations

blp = Blueprint("reports", __name__)

MIN_COMPARE, MAX_COMPARE = 2, 6
# Pages are self-contained: nothing may load from anywhere (inline CSS and SVG only, no scripts).
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'self'"
)


def html_response(page: str) -> Response:
    response = Response(page, mimetype="text/html")
    response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


def parse_ids(raw: str | None) -> list[int]:
    """``"1, 2,3"`` -> ``[1, 2, 3]``; 2–6 positive integers or a 422 on field ``ids``."""
    parts = [part.strip() for part in (raw or "").split(",") if part.strip()]
    if not all(part.isascii() and part.isdigit() and len(part) <= 10 and 1 <= int(part) <= MAX_ID
               for part in parts):
        raise field_error("ids", "Give recommendation ids as positive integers, comma separated (ids=1,2,3).")
    if not MIN_COMPARE <= len(parts) <= MAX_COMPARE:
        raise field_error("ids", f"Give {MIN_COMPARE}–{MAX_COMPARE} recommendation ids, got {len(parts)}.")
    return [int(part) for part in parts]


@blp.get("/v1/recommendations/<id:rec_id>/report")
def recommendation_report(rec_id: int) -> Response:
    """One recommendation as a page: verdict, inputs, plots, vLLM settings, provenance."""
    from ..reports import pages

    return html_response(pages.recommendation_page(recommendations.as_dict(recommendations.get(rec_id))))


@blp.get("/v1/recommendations/compare/report")
def comparison_report() -> Response:
    """2–6 recommendations side by side: ``?ids=1,2,3``."""
    from ..reports import pages

    compared = recommendations.compare(parse_ids(request.args.get("ids")))
    return html_response(pages.comparison_page(compared["recommendations"], compared["rows"]))


@blp.get("/v1/calibrations/<id:run_id>/report")
def calibration_report(run_id: int) -> Response:
    """A calibration run: status, probes, measured points against fitted curves, residuals."""
    from ..reports import calibration_dict, pages

    run = calibrations.get(run_id)
    return html_response(pages.calibration_page(calibration_dict(run), calibrations.catalog_specs(run)))
