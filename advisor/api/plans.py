"""/v1/plans: capacity plans (create, list, fetch, export) and their report page."""
from __future__ import annotations

import csv
import io

from flask import Response, jsonify
from flask.views import MethodView
from . import Blueprint

from ..auth import token_required
from ..plan_schemas import PlanExportQuerySchema, PlanQuerySchema, PlanRequestSchema, PlanSchema, PlanSummarySchema
from ..services import plans as service
from . import SelectPage

blp = Blueprint("plans", __name__, url_prefix="/v1/plans",
                description="Capacity plans: which GPU, how many, with or without speculation, under an SLO.")


class SummaryPage(SelectPage):
    @property
    def items(self):  # noqa: ANN201
        return [service.summary(r) for r in super().items]


@blp.route("")
class Plans(MethodView):
    @blp.arguments(PlanQuerySchema, location="query")
    @blp.response(200, PlanSummarySchema(many=True))
    @blp.paginate(SummaryPage)
    def get(self, filters):
        """List stored plans, newest first."""
        return service.filtered(filters)

    @token_required(unless_config="OPEN_RECOMMENDATIONS")
    @blp.arguments(PlanRequestSchema)
    @blp.response(201, PlanSchema)
    def post(self, request):
        """Plan capacity for a workload, a load and an SLO across GPUs, with and without speculation; store it.

        A plan where no option meets the SLO is still a plan (every option says why it is infeasible)."""
        return service.as_dict(service.create(request))


@blp.route("/<id:plan_id>")
class PlanById(MethodView):
    @blp.response(200, PlanSchema)
    def get(self, plan_id):
        """One stored plan (immutable)."""
        return service.as_dict(service.get(plan_id))


@blp.route("/<id:plan_id>/export")
class PlanExport(MethodView):
    @blp.arguments(PlanExportQuerySchema, location="query")
    @blp.response(200, description="CSV (text/csv) or JSON list, one row per option × load level; stable columns "
                                   "(docs/planner.md).")
    def get(self, args, plan_id):
        """One plan's options as rows for procurement tools."""
        rows = service.export_rows(service.get(plan_id))
        if args["format"] == "json":
            return jsonify(rows)
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=service.EXPORT_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return Response(out.getvalue(), mimetype="text/csv",
                        headers={"Content-Disposition": f"attachment; filename=plan-{plan_id}.csv"})
