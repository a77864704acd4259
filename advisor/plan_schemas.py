"""marshmallow schemas of capacity plans (``POST /v1/plans``, ``advisor plan --spec``): the API contract."""
from __future__ import annotations

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from .costmodel import KV_CACHE_DTYPES, METHODS, STRUCTURES, WEIGHTS_DTYPES
from .schemas import VLLM_VERSION, AcceptanceSchema, Float, StrictSchema, _positive

MAX_LOAD_LEVELS = 8
MAX_TOTAL_RPS = 1_000_000.0  # load × growth beyond this is not a plan (a million requests per second)
MAX_CONTEXT_TOKENS = 1_048_576
MAX_CANDIDATE_GPUS = 32  # a plan's work grows with its candidates: named ones, or the catalog's priced GPUs


class PlanWorkloadSchema(StrictSchema):
    prompt_tokens = fields.Integer(required=True, strict=True, validate=validate.Range(min=1, max=MAX_CONTEXT_TOKENS),
                                   metadata={"description": "Mean prompt length in tokens."})
    output_tokens = fields.Integer(required=True, strict=True, validate=validate.Range(min=1, max=131_072),
                                   metadata={"description": "Mean output length in tokens."})
    temperature = Float(load_default=0.0, validate=validate.Range(min=0.0, max=2.0))
    structure = fields.String(required=True, validate=validate.OneOf(STRUCTURES))
    length_spread = Float(load_default=0.0, validate=validate.Range(min=0.0, max=1.0, max_inclusive=False),
                          metadata={"description": "Lengths uniform in mean·(1 ± spread) (vLLM bench's "
                                                   "random-range-ratio); 0 = every request the mean."})


class PlanLoadSchema(StrictSchema):
    requests_per_second = Float(required=True, validate=_positive(MAX_TOTAL_RPS),
                                metadata={"description": "Expected arrival rate (Poisson), all replicas."})
    growth = fields.List(Float(validate=_positive(10_000)), load_default=[1.0],
                         validate=validate.Length(min=1, max=MAX_LOAD_LEVELS),
                         metadata={"description": "Load levels as multiples of requests_per_second, e.g. [1, 2, 5]."})

    @validates_schema
    def _bounded(self, data: dict, **_: object) -> None:
        top = data.get("requests_per_second", 0) * max(data.get("growth") or [1.0])
        if top > MAX_TOTAL_RPS:
            raise ValidationError(f"the largest load level is {top:g} requests/s; plans are bounded to "
                                  f"{MAX_TOTAL_RPS:g} requests/s", "growth")


class PlanSloSchema(StrictSchema):
    percentile = fields.Integer(load_default=90, strict=True, validate=validate.OneOf((50, 90, 99)))
    ttft_ms = Float(validate=_positive(1e7), allow_none=True)
    tpot_ms = Float(validate=_positive(1e6), allow_none=True)
    latency_ms = Float(validate=_positive(1e8), allow_none=True)

    @validates_schema
    def _one(self, data: dict, **_: object) -> None:
        if all(data.get(k) is None for k in ("ttft_ms", "tpot_ms", "latency_ms")):
            raise ValidationError("Give at least one of ttft_ms, tpot_ms, latency_ms.", "ttft_ms")


class PlanSpeculatorSchema(StrictSchema):
    method = fields.String(required=True, validate=validate.OneOf(METHODS))
    draft_model = fields.String(validate=validate.Length(min=1, max=96), allow_none=True)
    num_speculative_tokens = fields.Integer(strict=True, validate=validate.Range(min=1, max=6), allow_none=True,
                                            metadata={"description": "k; absent = the planner chooses (1..6)."})
    acceptance = fields.Nested(AcceptanceSchema, allow_none=True,
                               metadata={"description": "Measured acceptance; absent = calibration or prior."})


class PlanRequestSchema(StrictSchema):
    target_model = fields.String(required=True, validate=validate.Length(min=1, max=96))
    weights_dtype = fields.String(load_default="bf16", validate=validate.OneOf(WEIGHTS_DTYPES))
    kv_cache_dtype = fields.String(validate=validate.OneOf(KV_CACHE_DTYPES), metadata={
        "description": "vLLM's --kv-cache-dtype: \"fp8\" halves the KV cache per token (more sequences fit, less "
                       "attention traffic); absent = \"auto\", the model's dtype."})
    workload = fields.Nested(PlanWorkloadSchema, required=True)
    load = fields.Nested(PlanLoadSchema, required=True)
    slo = fields.Nested(PlanSloSchema, required=True)
    gpus = fields.List(fields.String(validate=validate.Length(min=1, max=64)), allow_none=True,
                       validate=validate.Length(min=1, max=MAX_CANDIDATE_GPUS),
                       metadata={"description": "Candidate GPUs (catalog names); default: every catalog GPU with a "
                                                f"price (CPU stand-ins excluded), if there are at most "
                                                f"{MAX_CANDIDATE_GPUS}."})
    gpu_hour_usd = fields.Dict(keys=fields.String(validate=validate.Length(min=1, max=64)),
                               values=Float(required=True, validate=_positive(10_000)), allow_none=True,
                               metadata={"description": "Your $/GPU-hour per GPU name; default: the catalog's "
                                                        "dated price."})
    speculators = fields.List(fields.Nested(PlanSpeculatorSchema), allow_none=True,
                              validate=validate.Length(min=1, max=8),
                              metadata={"description": "Candidate speculators; default: n-gram and the catalog "
                                                       "drafters that share the target's tokenizer."})
    tensor_parallel_sizes = fields.List(fields.Integer(strict=True, validate=validate.OneOf((1, 2, 4, 8))),
                                        allow_none=True, validate=validate.Length(min=1, max=4),
                                        metadata={"description": "Default: the smallest that fits and two doublings "
                                                                 "(up to 8)."})
    hours_per_month = Float(load_default=730.0, validate=_positive(744.0))
    vllm_version = fields.String(allow_none=True, validate=VLLM_VERSION,
                                 metadata={"description": "The vLLM you serve with, e.g. 0.24: a GPU without a "
                                                          "calibration of the target is timed by that version's "
                                                          "measured engine profile when one ships (sources.step_time)."})
    gpu_memory_utilization = Float(load_default=0.92, validate=validate.Range(min=0.05, max=1.0))
    max_num_seqs = fields.Integer(load_default=256, strict=True, validate=validate.Range(min=1, max=4096))
    max_num_batched_tokens = fields.Integer(load_default=8192, strict=True,
                                            validate=validate.Range(min=16, max=1_048_576))

    @validates_schema
    def _prices_name_candidates(self, data: dict, **_: object) -> None:
        gpus, prices = data.get("gpus"), data.get("gpu_hour_usd") or {}
        if gpus is not None:
            if len(set(gpus)) != len(gpus):
                raise ValidationError("Each GPU once.", "gpus")
            extra = sorted(set(prices) - set(gpus))
            if extra:
                raise ValidationError({extra[0]: [f"'{extra[0]}' is not among the candidate gpus."]},
                                      "gpu_hour_usd")


class PlanSchema(Schema):
    """A stored plan: the request and the ranked answer (docs/planner.md describes every field)."""

    id = fields.Integer()
    created_at = fields.DateTime()
    request = fields.Nested(PlanRequestSchema)
    options = fields.List(fields.Dict(), metadata={"description": "GPU × TP × mode, ranked by monthly cost."})
    best = fields.List(fields.Dict(), metadata={"description": "Cheapest feasible option per load level, with and "
                                                               "without speculation."})
    feasible = fields.Boolean(metadata={"description": "False when no option meets the SLO (each says why)."})
    loads_requests_per_second = fields.List(Float())
    slo = fields.Dict()
    simulation = fields.Dict(metadata={"description": "How the latency percentiles were simulated."})
    sources = fields.Dict(metadata={"description": "Where the numbers came from (input, catalog, calibration, "
                                                   "prior, default, simulation)."})
    cost_model_version = fields.String()


class PlanSummarySchema(Schema):
    id = fields.Integer()
    created_at = fields.DateTime()
    target_model = fields.String()
    feasible = fields.Boolean()
    best_option = fields.String(allow_none=True)
    requests_per_second = Float()
    cost_model_version = fields.String()


class PlanQuerySchema(StrictSchema):
    target_model = fields.String(validate=validate.Length(min=1, max=96))


class PlanExportQuerySchema(StrictSchema):
    format = fields.String(load_default="csv", validate=validate.OneOf(("csv", "json")))
