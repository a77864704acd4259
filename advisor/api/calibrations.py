"""/v1/calibrations: probe jobs for a GPU node, their status, measurements and fits."""
from __future__ import annotations

from flask.views import MethodView
from marshmallow import fields, validate

from ..auth import token_required
from ..schemas import CalibrationRequestSchema, CalibrationRunSchema, CalibrationUploadSchema, StrictSchema
from ..services import calibrations as service
from . import Blueprint

blp = Blueprint("calibrations", __name__, url_prefix="/v1/calibrations",
                description="Calibration probes through vLLM, run on GPU nodes by RQ workers.")


class CalibrationCreateSchema(CalibrationRequestSchema):
    external = fields.Boolean(load_default=False, metadata={
        "description": "The caller runs the probes itself and uploads results with PATCH (advisor calibrate "
                       "--server); nothing is queued."})


class CalibrationListQuery(StrictSchema):
    hardware = fields.String()
    status = fields.String(validate=validate.OneOf(("queued", "running", "succeeded", "failed")))


@blp.route("")
class Calibrations(MethodView):
    @blp.arguments(CalibrationListQuery, location="query")
    @blp.response(200, CalibrationRunSchema(many=True, exclude=("measurements", "fits")))
    def get(self, args):
        """Calibration runs, newest first."""
        return service.list_runs(**args)

    @token_required
    @blp.arguments(CalibrationCreateSchema)
    @blp.response(202, CalibrationRunSchema)
    def post(self, request):
        """Queue a calibration job on the queue named for the hardware (token)."""
        external = request.pop("external")
        return service.create(request, external=external)


@blp.route("/<id:run_id>")
class CalibrationById(MethodView):
    @blp.response(200, CalibrationRunSchema)
    def get(self, run_id):
        """Status, progress, every measurement and every fit of a run."""
        return service.get(run_id)

    @token_required
    @blp.arguments(CalibrationUploadSchema)
    @blp.response(200, CalibrationRunSchema)
    def patch(self, update, run_id):
        """Append measurements and fits, move status and progress (token; used by remote nodes)."""
        return service.record(service.get(run_id), update)
