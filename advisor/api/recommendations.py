"""/v1/recommendations: create (POST), list with filters, fetch, compare, export."""
from __future__ import annotations

import csv
import io

from flask import Response, current_app, jsonify
from flask.views import MethodView
from marshmallow import fields, validate

from ..auth import token_required
from ..schemas import (CompareQuerySchema, CompareSchema, RecommendationListQuerySchema, RecommendationQuerySchema,
                       RecommendationSchema, RecommendationSummarySchema, ScenarioSchema)
from ..services import recommendations as service
from . import KEYSET_PAGE, Blueprint

blp = Blueprint("recommendations", __name__, url_prefix="/v1/recommendations",
                description="Go / no-go answers for a workload, stored and immutable.")


def json_response(body: str | bytes, status: int) -> Response:
    """A stored answer as JSON text, without a marshmallow pass: it already has the RecommendationSchema's shape
    (the schema loaded the scenario; the cost model's answer is plain JSON), and walking ~12 KB of nested dicts
    through the schema cost more than the database. The fuzz test checks the shape against the document. The body
    is one bytes object, handed to the server as it is (``direct_passthrough``: werkzeug's generator and closing
    wrapper around it cost 4 µs of a GET's ~170 in process); a HEAD still sends no body."""
    return current_app.response_class(body, status=status, mimetype="application/json", direct_passthrough=True)


class ExportQuerySchema(RecommendationQuerySchema):
    format = fields.String(load_default="csv", validate=validate.OneOf(("csv", "json")))
    limit = fields.Integer(load_default=10_000, validate=validate.Range(min=1, max=100_000))


@blp.route("")
class Recommendations(MethodView):
    @blp.arguments(RecommendationListQuerySchema, location="query")
    @blp.response(200, RecommendationSummarySchema(many=True))
    @blp.paginate()
    def get(self, filters, pagination_parameters):
        """List stored recommendations (newest first), filtered by GPU, model, method, decision, date; by page
        (with X-Pagination) or after an id (keyset)."""
        after_id = filters.pop("after_id", None)
        if after_id is not None:
            body, pagination_parameters.item_count = service.page_after(
                filters, after_id, pagination_parameters.page_size), KEYSET_PAGE
        else:
            body, pagination_parameters.item_count = service.summary_page(
                filters, pagination_parameters.first_item, pagination_parameters.page_size)
        return json_response(body, 200)

    @token_required(unless_config="OPEN_RECOMMENDATIONS")
    @blp.arguments(ScenarioSchema)
    @blp.response(201, RecommendationSchema)
    def post(self, scenario):
        """Answer a workload scenario and store the answer."""
        return json_response(service.create_with_json(scenario)[1], 201)


@blp.route("/compare")
class Compare(MethodView):
    @blp.arguments(CompareQuerySchema, location="query")
    @blp.response(200, CompareSchema)
    def get(self, args):
        """2–6 recommendations side by side."""
        return service.compare(args["ids"])


@blp.route("/export")
class Export(MethodView):
    @blp.arguments(ExportQuerySchema, location="query")
    @blp.response(200, description="CSV (text/csv) or JSON list; columns documented in the README.")
    def get(self, args):
        """Export a filtered list with stable column names, as CSV or JSON."""
        rows = service.list_all(args, limit=args["limit"])
        if args["format"] == "json":
            return jsonify(RecommendationSummarySchema(many=True).dump(rows))
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=service.EXPORT_COLUMNS, lineterminator="\n")
        writer.writeheader()
        for row in RecommendationSummarySchema(many=True).dump(rows):
            writer.writerow(row)
        return Response(out.getvalue(), mimetype="text/csv",
                        headers={"Content-Disposition": "attachment; filename=recommendations.csv"})


@blp.route("/<id:rec_id>")
class RecommendationById(MethodView):
    @blp.response(200, RecommendationSchema)
    def get(self, rec_id):
        """One stored recommendation: the scenario and the full answer."""
        return json_response(service.get_body(rec_id), 200)
