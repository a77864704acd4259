"""/v1/gpus, /v1/models and /v1/engine-profiles: the catalogs; reads are open, writes need a token."""
from __future__ import annotations

from flask.views import MethodView
from marshmallow import fields, validate

from ..auth import token_required
from ..models import Gpu, Model
from ..schemas import (MODEL_KINDS, EngineProfileQuerySchema, EngineProfileSchema, GpuSchema, ModelImportFilesSchema,
                       ModelImportSchema, ModelSchema, StrictSchema)
from ..services import catalog as service
from . import Blueprint

blp = Blueprint("catalog", __name__, url_prefix="/v1", description="GPU and model catalogs.")


class ModelQuerySchema(StrictSchema):
    kind = fields.String(validate=validate.OneOf(MODEL_KINDS))
    family = fields.String()


@blp.route("/gpus")
class Gpus(MethodView):
    @blp.response(200, GpuSchema(many=True))
    def get(self):
        """All GPUs with memory, bandwidth, dense TFLOP/s and a dated $/GPU-hour."""
        return service.list_gpus()

    @token_required
    @blp.arguments(GpuSchema)
    @blp.response(201, GpuSchema)
    def post(self, values):
        """Add a GPU (token)."""
        return service.create(Gpu, values)


@blp.route("/gpus/<name>")
class GpuByName(MethodView):
    @blp.response(200, GpuSchema)
    def get(self, name):
        return service.get_gpu(name)

    @token_required
    @blp.arguments(GpuSchema(partial=True))
    @blp.response(200, GpuSchema)
    def put(self, values, name):
        """Change a GPU's fields (token); e.g. a new dated price."""
        return service.update(service.get_gpu(name), values)


@blp.route("/models")
class Models(MethodView):
    @blp.arguments(ModelQuerySchema, location="query")
    @blp.response(200, ModelSchema(many=True))
    def get(self, args):
        """All models: architecture, parameter count, tokenizer identity, family."""
        return service.list_models(**args)

    @token_required
    @blp.arguments(ModelSchema)
    @blp.response(201, ModelSchema)
    def post(self, values):
        """Add a model (token)."""
        return service.create(Model, values)


@blp.route("/models/import")
class ModelImport(MethodView):
    @token_required
    @blp.arguments(ModelImportSchema, location="form")
    @blp.arguments(ModelImportFilesSchema, location="files")
    @blp.response(201, ModelSchema)
    def post(self, form, files):
        """Add a model from its Hugging Face ``config.json`` (multipart field ``config``) (token)."""
        values = service.model_from_hf_config(files["config"].read(), form)
        return service.create(Model, ModelSchema().load(ModelSchema().dump(values)))


@blp.route("/models/<name>")
class ModelByName(MethodView):
    @blp.response(200, ModelSchema)
    def get(self, name):
        return service.get_model(name)

    @token_required
    @blp.arguments(ModelSchema(partial=True))
    @blp.response(200, ModelSchema)
    def put(self, values, name):
        """Change a model's fields (token)."""
        return service.update(service.get_model(name), values)


@blp.route("/engine-profiles")
class EngineProfiles(MethodView):
    @blp.arguments(EngineProfileQuerySchema, location="query")
    @blp.response(200, EngineProfileSchema(many=True))
    def get(self, args):
        """The measured GPU × vLLM engine profiles that ship; with ``gpu``, the one that times that GPU for each
        version (its own, or the nearest measured GPU's carried to it), as a scenario naming that version gets it."""
        return service.list_engine_profiles(**args)
