"""marshmallow schemas: they own the API contract and generate the OpenAPI document."""
from __future__ import annotations

import datetime
import math
import re
from typing import Any

from marshmallow import Schema, ValidationError, fields, validate, validates_schema
from webargs.fields import DelimitedList

from .costmodel import KV_CACHE_DTYPES, METHODS, STRUCTURES, WEIGHTS_DTYPES, acceptance_key

MAX_ID = 2**31 - 1  # ids are 32-bit INTEGER columns (PostgreSQL); a larger id names nothing

DRAFTER_METHODS = ("draft_model", "eagle", "eagle3")
MODEL_KINDS = ("causal_lm", "eagle_head", "eagle3_head", "mtp_head")


def _positive(maximum: float) -> validate.Range:
    return validate.Range(min=0, max=maximum, min_inclusive=False)


VLLM_VERSION = validate.Regexp(r"^\d{1,3}\.\d{1,3}(\.\d{1,4})?$")  # "0.24", "0.24.0": what a profile is keyed by


class StrictSchema(Schema):
    """Unknown fields are errors, so a misspelt field name never silently becomes a default."""


def _calendar_date(value: str) -> None:
    try:
        datetime.date.fromisoformat(value)
    except ValueError:
        raise ValidationError(f"{value!r} is not a calendar date.") from None


class Float(fields.Float):
    """A JSON number only: marshmallow's Float also takes the string "3600", which the OpenAPI document's number
    does not. (No query parameter is a float.)"""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> float:
        if isinstance(value, str):
            raise self.make_error("invalid", input=value)
        return super()._deserialize(value, attr, data, **kwargs)


class Instant(fields.DateTime):
    """An instant (ISO 8601; no offset = UTC) that UTC can hold: ``0001-01-01T00:00:04+06:00`` is in the year 0 in
    UTC, which Python's datetime cannot represent (it was a 500 where the database compares instants)."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> datetime.datetime:
        parsed = super()._deserialize(value, attr, data, **kwargs)
        try:
            return parsed.astimezone(datetime.timezone.utc) if parsed.tzinfo else parsed.replace(
                tzinfo=datetime.timezone.utc)
        except OverflowError:
            raise ValidationError(f"{value!r} is outside the years 1-9999 in UTC.") from None


class StrictBoolean(fields.Boolean):
    """JSON true or false only: marshmallow's Boolean also takes 1, 0.0, "yes" and "off", which the OpenAPI
    document's boolean does not."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> bool:
        if not isinstance(value, bool):
            raise self.make_error("invalid", input=value)
        return value


class Id(fields.Integer):
    """A row id: ASCII digits only (``int()`` would take ``"٣"``), within the column's range."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(strict=False, validate=validate.Range(min=1, max=MAX_ID), **kwargs)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> int:
        if isinstance(value, str) and not re.fullmatch(r"[0-9]{1,12}", value.strip()):
            raise ValidationError(f"Not a valid id: give a positive integer up to {MAX_ID}.")
        if isinstance(value, bool) or (not isinstance(value, str) and not isinstance(value, int)):
            raise ValidationError(f"Not a valid id: give a positive integer up to {MAX_ID}.")
        return super()._deserialize(value, attr, data, **kwargs)


# JSON objects taken as given (vLLM engine arguments, environments, measurements): bounded, finite, storable.
MAX_FREE_JSON_DEPTH = 8
MAX_FREE_JSON_ITEMS = 2_000


def _free_json_problem(value: Any) -> str | None:
    """Why ``value`` cannot be stored as free-form JSON (NaN, ±Infinity, too deep, too big), else None."""
    stack, items = [(value, 0, "")], 0
    while stack:
        node, depth, path = stack.pop()
        items += 1
        if items > MAX_FREE_JSON_ITEMS:
            return f"more than {MAX_FREE_JSON_ITEMS} values"
        if depth > MAX_FREE_JSON_DEPTH:
            return f"nested deeper than {MAX_FREE_JSON_DEPTH} levels at '{path}'"
        if isinstance(node, float) and not math.isfinite(node):
            return f"'{path or 'value'}' is {node}: NaN and Infinity are not JSON numbers"
        if isinstance(node, int) and not isinstance(node, bool) and abs(node) > 2**63:
            return f"'{path or 'value'}' is an integer beyond 64 bits"
        if isinstance(node, dict):
            stack.extend((v, depth + 1, f"{path}.{k}" if path else str(k)) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, depth + 1, f"{path}.{i}" if path else str(i)) for i, v in enumerate(node))
    return None


def finite_json(value: Any) -> None:
    problem = _free_json_problem(value)
    if problem:
        raise ValidationError(problem)


def FreeDict(**kwargs: Any) -> fields.Dict:  # noqa: N802  (a field factory, named like the fields it makes)
    """A ``fields.Dict`` of free-form JSON that is finite and bounded."""
    return fields.Dict(keys=fields.String(validate=validate.Length(max=200)), validate=finite_json, **kwargs)


def schema_name_resolver(schema: type[Schema] | Schema) -> str:
    """OpenAPI component names: ``GpuSchema`` -> ``Gpu``; partial and trimmed variants get their own name."""
    cls = schema if isinstance(schema, type) else type(schema)
    name = cls.__name__.removesuffix("Schema")
    if isinstance(schema, Schema):
        if schema.partial:
            name += "Patch"
        if schema.exclude or schema.only:
            name += "Summary"
    return name


# --- scenario (the request of POST /v1/recommendations, `advisor predict`) ---------------------------------
class WorkloadSchema(StrictSchema):
    prompt_tokens = fields.Integer(required=True, strict=True, validate=validate.Range(min=1, max=2_000_000),
                                   metadata={"description": "Mean prompt length in tokens."})
    output_tokens = fields.Integer(required=True, strict=True, validate=validate.Range(min=1, max=1_000_000),
                                   metadata={"description": "Mean output length in tokens."})
    temperature = Float(load_default=0.0, validate=validate.Range(min=0.0, max=2.0),
                        metadata={"description": "Sampling temperature, 0 = greedy."})
    structure = fields.String(required=True, validate=validate.OneOf(STRUCTURES),
                              metadata={"description": "Output structure: " + ", ".join(STRUCTURES)})
    concurrency = fields.Integer(strict=True, validate=validate.Range(min=1, max=65_536), allow_none=True,
                                 metadata={"description": "Requests in flight (closed loop)."})
    requests_per_second = Float(validate=_positive(1_000_000), allow_none=True,
                                metadata={"description": "Open-loop arrival rate."})

    @validates_schema
    def _load_given(self, data: dict, **_: object) -> None:
        if data.get("concurrency") is None and data.get("requests_per_second") is None:
            raise ValidationError("Give concurrency or requests_per_second.", "concurrency")
        if data.get("concurrency") is not None and data.get("requests_per_second") is not None:
            raise ValidationError("Give concurrency or requests_per_second, not both.", "requests_per_second")


class SpeculatorSchema(StrictSchema):
    method = fields.String(required=True, validate=validate.OneOf(METHODS))
    draft_model = fields.String(validate=validate.Length(min=1, max=96), allow_none=True,
                                metadata={"description": "Catalog name of the draft model or EAGLE head."})
    num_speculative_tokens = fields.Integer(strict=True, validate=validate.Range(min=1, max=16), allow_none=True,
                                            metadata={"description": "k; absent = the advisor chooses."})

    @validates_schema
    def _drafter_matches_method(self, data: dict, **_: object) -> None:
        method, draft = data.get("method"), data.get("draft_model")
        if method in DRAFTER_METHODS and not draft:
            raise ValidationError(f"method '{method}' needs a draft_model.", "draft_model")
        if method in ("ngram", "suffix") and draft:
            raise ValidationError(f"method '{method}' drafts from the prompt; draft_model must be absent.",
                                  "draft_model")


class AcceptanceSchema(StrictSchema):
    """Measured acceptance in vLLM's words (docs/cost-model.md "Acceptance words"), at num_speculative_tokens k."""

    mean_acceptance_length = Float(
        validate=validate.Range(min=1.0, max=17.0), allow_none=True,
        metadata={"description": "vLLM's mean acceptance length AL = 1 + accepted/drafts (A/N), over the steps that "
                                 "drafted, incl. the bonus token; for n-gram/suffix not tokens per step."})
    acceptance_rate = Float(
        validate=validate.Range(min=0.0, max=1.0), allow_none=True,
        metadata={"description": "vLLM's draft acceptance rate A/D, accepted over drafted tokens (AL = 1 + k·rate)."})
    per_position = fields.List(Float(validate=validate.Range(min=0.0, max=1.0)),
                               validate=validate.Length(min=1, max=16), allow_none=True,
                               metadata={"description": "r_i = a_i/N = P(first i+1 drafts accepted), non-increasing."})
    draft_fraction = Float(
        validate=validate.Range(min=0.0, max=1.0, min_inclusive=False), allow_none=True,
        metadata={"description": "Share of decode steps that drafted (N / steps; n-gram finds no match on the "
                                 "others). Default: calibration or prior (n-gram, suffix), 1 (model drafters)."})

    @validates_schema
    def _one_form(self, data: dict, **_: object) -> None:
        given = [k for k in ("mean_acceptance_length", "acceptance_rate", "per_position") if data.get(k) is not None]
        if len(given) > 1:
            raise ValidationError(f"Give one of mean_acceptance_length, acceptance_rate, per_position "
                                  f"(got {', '.join(given)}).", given[-1])
        rates = data.get("per_position") or []
        if any(b > a + 1e-9 for a, b in zip(rates, rates[1:])):
            raise ValidationError("per_position rates must not increase with position.", "per_position")


class SloSchema(StrictSchema):
    tpot_ms = Float(validate=_positive(1e6), allow_none=True)
    ttft_ms = Float(validate=_positive(1e7), allow_none=True)
    latency_ms = Float(validate=_positive(1e8), allow_none=True)


class LoadSchema(StrictSchema):
    requests_per_second = Float(validate=_positive(1e7), allow_none=True)
    output_tokens_per_second = Float(validate=_positive(1e10), allow_none=True)

    @validates_schema
    def _one(self, data: dict, **_: object) -> None:
        if (data.get("requests_per_second") is None) == (data.get("output_tokens_per_second") is None):
            raise ValidationError("Give exactly one of requests_per_second, output_tokens_per_second.",
                                  "requests_per_second")


class ScenarioSchema(StrictSchema):
    gpu = fields.String(required=True, validate=validate.Length(min=1, max=64),
                        metadata={"description": "Catalog GPU name, e.g. H100-SXM."})
    gpu_count = fields.Integer(load_default=1, strict=True, validate=validate.Range(min=1, max=64),
                               metadata={"description": "Tensor-parallel GPUs per replica."})
    target_model = fields.String(required=True, validate=validate.Length(min=1, max=96))
    weights_dtype = fields.String(load_default="bf16", validate=validate.OneOf(WEIGHTS_DTYPES))
    kv_cache_dtype = fields.String(validate=validate.OneOf(KV_CACHE_DTYPES), metadata={
        "description": "vLLM's --kv-cache-dtype: \"fp8\" halves the KV cache per token (more sequences fit, less "
                       "attention traffic); absent = \"auto\", the model's dtype."})
    speculator = fields.Nested(SpeculatorSchema, metadata={
        "description": "The speculation to assess. Absent: the advisor answers each candidate that fits the target "
                       "(n-gram, the catalog's heads and small drafters of its tokenizer) and returns the best, with "
                       "every candidate's verdict under answer.speculator_choice."})
    workload = fields.Nested(WorkloadSchema, required=True)
    acceptance = fields.Nested(AcceptanceSchema, allow_none=True)
    gpu_hour_usd = Float(validate=_positive(10_000), allow_none=True,
                         metadata={"description": "Your $/GPU-hour; default: the catalog's dated price."})
    vram_gb = Float(validate=_positive(100_000), allow_none=True,
                    metadata={"description": "Override the GPU's memory (GB per GPU)."})
    gpu_memory_utilization = Float(load_default=0.92,
                                   validate=validate.Range(min=0.05, max=1.0, min_inclusive=True))
    slo = fields.Nested(SloSchema, allow_none=True)
    load = fields.Nested(LoadSchema, allow_none=True,
                         metadata={"description": "Total load to size the fleet for (TCO)."})
    hours_per_month = Float(load_default=730.0, validate=_positive(744.0))
    vllm_version = fields.String(allow_none=True, validate=VLLM_VERSION,
                                 metadata={"description": "The vLLM you serve with, e.g. 0.24: its measured engine "
                                                          "profile for this GPU is used when one ships "
                                                          "(answer.engine_profile)."})

    @validates_schema
    def _acceptance_fits_k(self, data: dict, **_: object) -> None:
        k = (data.get("speculator") or {}).get("num_speculative_tokens")
        acceptance = data.get("acceptance") or {}
        if not data.get("speculator") and any(v is not None for v in acceptance.values()):
            raise ValidationError("acceptance is given, and it describes one speculator's drafts: name that "
                                  "speculator.", "speculator")
        al = acceptance.get("mean_acceptance_length")
        if k and al and al > k + 1 + 1e-9:
            raise ValidationError({"mean_acceptance_length": [f"AL {al} exceeds k+1 = {k + 1}."]}, "acceptance")


# --- answers ------------------------------------------------------------------------------------------------
def _obj(description: str) -> fields.Dict:
    return fields.Dict(metadata={"description": description})


class AnswerSchema(Schema):
    """The cost model's answer (design.md §3); docs/cost-model.md documents every sub-object."""

    decision = fields.String(metadata={"enum": ["go", "no-go", "calibrate"]})
    reasons = fields.List(fields.String(), metadata={"description": "Why, with the numbers that decided."})
    speedup = _obj("{expected, low, high, threshold, decode, interval}: end-to-end speedup and its interval "
                   "(null when the deployment cannot exist).")
    num_speculative_tokens = fields.Integer(allow_none=True, metadata={"description": "k to run (given or best)."})
    concurrency = _obj("{baseline, speculative, source, saturated, resident_baseline, resident_speculative, queued}: "
                       "requests offered, and those resident at once (KV capacity, max_num_seqs); the rest queue.")
    tpot_ms = _obj("{baseline, speculative}: time per output token.")
    ttft_ms = _obj("{baseline, speculative}: time to first token.")
    latency_ms = _obj("{baseline: {prefill, decode, total}, speculative: {…}, prefill_share}.")
    throughput_tok_s = _obj("{baseline, speculative}: output tokens/s per replica.")
    step_ms = _obj("{decode, verify, draft, cycle, verify_to_decode_ratio}.")
    acceptance = _obj("{mean_acceptance_length (vLLM AL = 1 + A/N over drafting steps), acceptance_rate (A/D), "
                      "per_position, draft_fraction, tokens_per_cycle (1 + draft_fraction·(AL − 1)), source}.")
    memory = _obj("Weights, KV bytes per token, KV space, max concurrency with/without drafter, fits (all resident at "
                  "full length), deployable (target + drafter + one sequence fit).")
    curve = fields.List(fields.Dict(), metadata={"description": "Speedup over concurrency with interval and best k."})
    break_even_concurrency = Float(allow_none=True)
    speculator_choice = _obj("{chosen, candidates: [{method, draft_model, num_speculative_tokens, decision, expected, "
                             "low, high}], rule}: present when the scenario named no speculator.")
    dynamic_sd = fields.List(fields.List(fields.Integer()),
                             metadata={"description": (
                                 "The best k per concurrency band [[lo, hi, k]] (0: off), in the form of vLLM's "
                                 "num_speculative_tokens_per_batch_size. Advice, not in the command: with such a "
                                 "table vLLM 0.24 runs another engine path, measured slower (docs/cost-model.md).")})
    methods = fields.List(fields.Dict(), metadata={"description": (
        "The scenario's method and n-gram, suffix, EAGLE-3 and EAGLE, best first, each as naming it would answer "
        "(point estimate at its best k, the workload's concurrency): {method, drafter, drafter_source (catalog:<head> "
        "for the target's catalog head, else a synthesized one), num_speculative_tokens, expected_speedup, "
        "mean_acceptance_length, acceptance_source, timing_source}.")})
    tco = _obj("$/1M output tokens, GPUs needed, monthly cost with and without, savings.")
    vllm = _obj("{speculative_config, serve_flags}: the settings to copy.")
    checks = fields.List(fields.Dict(), metadata={"description": "Draft checklist: {severity, field, message}."})
    provenance = fields.Dict(keys=fields.String(), values=fields.String(),
                             metadata={"description": "Each number's path -> input | catalog:X | "
                                                      "calibration:N | prior:source | default."})
    sources = fields.Dict(keys=fields.String(), values=fields.String(),
                          metadata={"description": "The citation behind each catalog entry and prior used."})
    cost_model_version = fields.String()
    calibration_run_id = fields.Integer(allow_none=True)
    engine_profile = fields.Dict(allow_none=True, metadata={
        "description": "{name, gpu, applied_to, vllm_version, behaviour, drafters, drafters_carried, "
                       "drafters_stand_in, drafter_methods, source}: the measured GPU × vLLM profile the timing came "
                       "from (scenario.vllm_version), or null. gpu is where it was measured; applied_to the "
                       "scenario's GPU (another one when no profile of its own ships and one of that version was "
                       "carried to it from the GPU nearest in bandwidth). drafters_carried: drafter -> the profile of "
                       "another GPU that timed it, carried to this one (the GPU's own profile did not time that "
                       "drafter). drafters_stand_in: drafter -> the timed drafter of the same method whose engine fit "
                       "prices it (no profile timed it). drafter_methods: drafter -> vLLM's speculative method."})


class EngineProfileQuerySchema(StrictSchema):
    gpu = fields.String(validate=validate.Length(min=1, max=64), metadata={
        "description": "A catalog GPU: the profile that times it (its own, or one carried to it) for each version."})
    vllm_version = fields.String(validate=VLLM_VERSION, metadata={"description": "e.g. 0.24 (major.minor counts)."})


class EngineProfileSchema(Schema):
    name = fields.String(metadata={"description": "e.g. 'H200-SXM × vLLM 0.24', or '… → A100-80GB-SXM' carried."})
    gpu = fields.String(metadata={"description": "The GPU it was measured on."})
    applied_to = fields.String(metadata={"description": "The GPU it times (another one when carried)."})
    vllm_version = fields.String()
    behaviour = fields.List(fields.String(), metadata={"description": "What that vLLM does there, in words."})
    drafters = fields.List(fields.String(), metadata={"description": "Drafters whose engines it times."})
    drafters_carried = fields.Dict(keys=fields.String(), values=fields.String(), metadata={
        "description": "Drafter -> the other GPU's profile that timed it, carried here."})
    drafters_stand_in = fields.Dict(keys=fields.String(), values=fields.String(), metadata={
        "description": "Empty here: an answer lists the drafter the profile did not time and the timed one of its "
                       "method whose fit prices it."})
    drafter_methods = fields.Dict(keys=fields.String(), values=fields.String(), metadata={
        "description": "Drafter -> vLLM's speculative method (draft_model, eagle, eagle3): a drafter no profile timed "
                       "is priced by the fit of the first drafter of its method here."})
    source = fields.String(metadata={"description": "The runs and records it was fitted from."})
    max_batch_measured = fields.Integer()
    step_time = fields.Dict(keys=fields.String(), values=fields.Float(), metadata={
        "description": "The fit: fixed_overhead_ms, bandwidth_efficiency, compute_efficiency, verify_overhead_ms, "
                       "proposer_overhead_ms, ragged_step_ms, timing_rms_rel."})
    prefill = fields.Dict(keys=fields.String(), values=fields.Float(), metadata={
        "description": "The prefill fit: fixed_overhead_ms, compute_efficiency."})


class RecommendationSchema(AnswerSchema):
    id = fields.Integer()
    created_at = fields.DateTime()
    workload_id = fields.Integer()
    scenario = fields.Nested(ScenarioSchema)


class RecommendationSummarySchema(Schema):
    """One row of a list or export: the stored summary columns (README: Export columns)."""

    id = fields.Integer()
    created_at = fields.DateTime()
    gpu = fields.String()
    gpu_count = fields.Integer()
    target_model = fields.String()
    method = fields.String()
    draft_model = fields.String(allow_none=True)
    structure = fields.String()
    concurrency = Float(allow_none=True)
    decision = fields.String()
    speedup_expected = Float()
    speedup_low = Float()
    speedup_high = Float()
    num_speculative_tokens = fields.Integer(allow_none=True)
    tpot_ms_baseline = Float()
    tpot_ms_speculative = Float()
    usd_per_million_output_tokens_baseline = Float(allow_none=True)
    usd_per_million_output_tokens_speculative = Float(allow_none=True)
    calibration_run_id = fields.Integer(allow_none=True)
    cost_model_version = fields.String()
    timing_source = fields.String(allow_none=True, metadata={
        "description": "Where the timing came from: calibration:<id>, profile:<GPU × vLLM version> (a measured "
                       "engine profile, '→ GPU' when carried to another) or default (the catalog)."})

    def dump(self, obj: Any, *, many: bool | None = None) -> Any:
        """Rows of the summary columns are already typed by the database: a dict per row, with the time in ISO
        8601 as ``fields.DateTime`` writes it (a list of 100 in ~0.1 ms instead of ~2 ms through the fields)."""
        many = self.many if many is None else many
        rows = [_summary_row(row, self.fields) for row in (obj if many else [obj])]
        return rows if many else rows[0]


def _summary_row(row: Any, names: dict[str, Any]) -> dict[str, Any]:
    out = row._asdict() if hasattr(row, "_asdict") else dict(row)  # a Row of exactly these columns, or a dict
    out = {name: out.get(name) for name in names}
    created = out.get("created_at")
    if created is not None and not isinstance(created, str):
        out["created_at"] = created.isoformat()
    return out


class RecommendationQuerySchema(StrictSchema):
    gpu = fields.String()
    target_model = fields.String()
    method = fields.String(validate=validate.OneOf(METHODS))
    decision = fields.String(validate=validate.OneOf(("go", "no-go", "calibrate")))
    created_after = Instant()
    created_before = Instant()


class RecommendationListQuerySchema(RecommendationQuerySchema):
    after_id = Id(metadata={"description": (
        "Keyset pagination: the rows older than this id, newest first, up to page_size of them. The next page: "
        "after_id = the last id of this page. Read from the index without OFFSET or a count, so a page costs the "
        "same however long the list and however deep the page; `page` is ignored and no X-Pagination header is "
        "sent.")})


class CompareQuerySchema(StrictSchema):
    ids = DelimitedList(Id(), required=True, validate=validate.Length(min=2, max=6),
                               metadata={"description": "2–6 recommendation ids, comma separated."})


class CompareSchema(Schema):
    recommendations = fields.List(fields.Nested(RecommendationSchema))
    rows = fields.List(fields.Dict(), metadata={"description": "One row per compared quantity."})


# --- catalog ------------------------------------------------------------------------------------------------
class GpuSchema(StrictSchema):
    id = fields.Integer(dump_only=True)
    name = fields.String(required=True, validate=validate.Regexp(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"))
    vendor = fields.String(required=True, validate=validate.Length(min=1, max=32))
    gpu_class = fields.String(required=True, validate=validate.Length(min=1, max=32),
                              metadata={"description": "Class for default efficiencies, e.g. hopper, ampere."})
    memory_gb = Float(required=True, validate=_positive(10_000))
    # floors well below any accelerator that serves an LLM (a 2-core CPU: 33 GB/s, 0.47 TFLOP/s); below them a step
    # time leaves the range of a float
    hbm_bandwidth_gb_per_s = Float(required=True, validate=validate.Range(min=1.0, max=1e6),
                                   metadata={"description": "At least 1 GB/s."})
    bf16_tflops = Float(required=True, validate=validate.Range(min=0.001, max=1e6),
                        metadata={"description": "Dense; at least 0.001."})
    fp8_tflops = Float(validate=validate.Range(min=0.001, max=1e6), allow_none=True, load_default=None)
    gpu_hour_usd = Float(required=True, validate=_positive(10_000))
    gpu_hour_usd_date = fields.String(required=True, validate=[validate.Regexp(r"^\d{4}-\d{2}-\d{2}$",
                                      error="Use an ISO date, YYYY-MM-DD."), _calendar_date],
                                      metadata={"description": "When that price was seen (YYYY-MM-DD)."})
    source = fields.String(required=True, validate=validate.Length(min=1, max=2000))
    created_at = fields.DateTime(dump_only=True)
    updated_at = fields.DateTime(dump_only=True)


class ModelSchema(StrictSchema):
    id = fields.Integer(dump_only=True)
    name = fields.String(required=True, validate=validate.Regexp(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$"))
    family = fields.String(required=True, validate=validate.Length(min=1, max=64))
    kind = fields.String(load_default="causal_lm", validate=validate.OneOf(MODEL_KINDS))
    num_layers = fields.Integer(required=True, strict=True, validate=validate.Range(min=1, max=1000))
    hidden_size = fields.Integer(required=True, strict=True, validate=validate.Range(min=1, max=1_000_000))
    num_attention_heads = fields.Integer(required=True, strict=True, validate=validate.Range(min=1, max=4096))
    num_kv_heads = fields.Integer(required=True, strict=True, validate=validate.Range(min=1, max=4096))
    head_dim = fields.Integer(required=True, strict=True, validate=validate.Range(min=1, max=4096))
    intermediate_size = fields.Integer(required=True, strict=True, validate=validate.Range(min=1, max=10_000_000))
    vocab_size = fields.Integer(required=True, strict=True, validate=validate.Range(min=1, max=10_000_000))
    tie_word_embeddings = StrictBoolean(load_default=False)
    num_experts = fields.Integer(strict=True, validate=validate.Range(min=1, max=4096), allow_none=True,
                                 load_default=None)
    num_experts_per_token = fields.Integer(strict=True, validate=validate.Range(min=1, max=4096), allow_none=True,
                                           load_default=None)
    param_count = fields.Integer(required=True, strict=True, validate=validate.Range(min=1, max=10**13))
    tokenizer_family = fields.String(required=True, validate=validate.Length(min=1, max=64))
    tokenizer_vocab_size = fields.Integer(required=True, strict=True, validate=validate.Range(min=1, max=10_000_000))
    tokenizer_hash = fields.String(validate=validate.Length(max=128), allow_none=True, load_default=None)
    hf_repo = fields.String(validate=validate.Length(max=200), allow_none=True, load_default=None)
    max_position_embeddings = fields.Integer(
        strict=True, validate=validate.Range(min=1, max=100_000_000), allow_none=True, load_default=None,
        metadata={"description": "Context window in tokens (config.json's max_position_embeddings): vLLM's default "
                                 "--max-model-len and the longest request it serves; null = unknown, not checked."})
    source = fields.String(required=True, validate=validate.Length(min=1, max=2000))
    created_at = fields.DateTime(dump_only=True)
    updated_at = fields.DateTime(dump_only=True)

    @validates_schema
    def _heads(self, data: dict, **_: object) -> None:
        heads, kv = data.get("num_attention_heads"), data.get("num_kv_heads")
        if heads and kv and heads % kv:
            raise ValidationError(f"num_attention_heads ({heads}) must be a multiple of num_kv_heads ({kv}).",
                                  "num_kv_heads")


class ModelImportSchema(StrictSchema):
    """Form fields sent with a Hugging Face ``config.json`` upload."""

    name = fields.String(required=True, validate=validate.Regexp(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$"))
    family = fields.String(validate=validate.Length(min=1, max=64))
    kind = fields.String(load_default="causal_lm", validate=validate.OneOf(MODEL_KINDS))
    tokenizer_family = fields.String(validate=validate.Length(min=1, max=64))
    tokenizer_hash = fields.String(validate=validate.Length(max=128))
    hf_repo = fields.String(validate=validate.Length(max=200))
    source = fields.String(validate=validate.Length(max=2000))


class ModelImportFilesSchema(Schema):
    config = fields.Raw(required=True, metadata={"type": "string", "format": "binary",
                                                 "description": "The model's Hugging Face config.json."})


# --- calibrations -------------------------------------------------------------------------------------------
class CalibrationRequestSchema(StrictSchema):
    hardware = fields.String(required=True, validate=validate.Length(min=1, max=96),
                             metadata={"description": "GPU catalog name or node class; the queue is named for it."})
    target_model = fields.String(required=True, validate=validate.Length(min=1, max=96))
    model_path = fields.String(validate=validate.Length(min=1, max=500), allow_none=True,
                               metadata={"description": "Local path or HF id of the target on the node."})
    method = fields.String(load_default="ngram", validate=validate.OneOf(METHODS))
    draft_model = fields.String(validate=validate.Length(min=1, max=96), allow_none=True)
    draft_model_path = fields.String(validate=validate.Length(min=1, max=500), allow_none=True)
    num_speculative_tokens = fields.Integer(load_default=4, strict=True, validate=validate.Range(min=1, max=16))
    structures = fields.List(fields.String(validate=validate.OneOf(STRUCTURES)), load_default=list(STRUCTURES))
    temperatures = fields.List(Float(validate=validate.Range(min=0, max=2)), load_default=[0.0, 0.7, 1.0],
                               validate=validate.Length(min=1, max=8))
    batch_sizes = fields.List(fields.Integer(strict=True, validate=validate.Range(min=1, max=1024)),
                              load_default=[1, 2, 4, 8], validate=validate.Length(min=1, max=12))
    prompts_per_structure = fields.Integer(load_default=12, strict=True, validate=validate.Range(min=1, max=200))
    max_tokens = fields.Integer(load_default=128, strict=True, validate=validate.Range(min=2, max=4096))
    probes = fields.List(fields.String(validate=validate.OneOf(("timing", "prefill", "acceptance", "memory"))),
                         load_default=["timing", "prefill", "acceptance", "memory"])
    engine = FreeDict(load_default=dict, metadata={"description": "Extra vLLM engine arguments."})
    pool_earlier_runs = StrictBoolean(load_default=True, metadata={
        "description": "Fit the timing probes together with those of up to 3 earlier succeeded runs of the same "
                       "hardware, target, method, drafter, engine dtypes, tensor-parallel size, mode and software "
                       "(each engine start samples one host-bound state; docs/calibration.md). false: this run's "
                       "records alone."})


class MeasurementSchema(StrictSchema):
    id = fields.Integer(dump_only=True)
    probe = fields.String(required=True, validate=validate.Length(min=1, max=32))
    params = FreeDict(required=True)
    values = FreeDict(required=True)
    created_at = fields.DateTime(dump_only=True)


# --- fit parameters: what the cost model reads (costmodel.types), within what a fit can produce -------------
def _number(low: float, high: float, **kwargs: Any) -> Float:
    return Float(validate=validate.Range(min=low, max=high), **kwargs)


def _covariance(size: int) -> fields.List:
    row = fields.List(_number(-1e6, 1e6), validate=validate.Length(equal=size))
    return fields.List(row, validate=validate.Length(equal=size), allow_none=True)


class StepTimeFitSchema(StrictSchema):
    """``StepTimeParams``; bounds a little wider than calibration.fit.BOUNDS."""

    bandwidth_efficiency = _number(0.001, 1.5, required=True)
    compute_efficiency = _number(0.001, 1.5, required=True)
    fixed_overhead_s = _number(0.0, 10.0, required=True)
    covariance = _covariance(3)
    source = fields.String(validate=validate.Length(max=200))
    per_layer_overhead_s = _number(0.0, 1.0)
    roofline_sharpness = _number(0.5, 50.0)
    verify_overhead_s = _number(0.0, 10.0)
    proposer_overhead_s = _number(0.0, 10.0)
    proposer_layers = fields.Integer(strict=True, validate=validate.Range(min=0, max=1000))
    per_sequence_overhead_s = _number(0.0, 1.0)
    rejection_sampling_s_per_seq = _number(0.0, 1.0)
    rejection_sampling_s_per_draft = _number(0.0, 1.0)
    draft_sampling_s_per_token = _number(0.0, 1.0)
    verify_overhead_log_std = _number(0.0, 2.0)
    proposer_overhead_log_std = _number(0.0, 2.0)
    proposer_overhead_log_std_low = _number(0.0, 2.0, allow_none=True)  # None: symmetric
    per_sequence_overhead_log_std = _number(0.0, 2.0)
    eager_layer_overhead_s = _number(0.0, 1.0)
    eager_probability = _number(0.0, 1.0)
    ragged_step_s = _number(0.0, 10.0)
    copy_sync_step_s = _number(0.0, 1.0)
    timing_rms_rel = _number(0.0, 2.0)


class PrefillFitSchema(StrictSchema):
    """``PrefillParams``; above 1 where a host computes more than its catalog row's peak (calibration.fit)."""

    compute_efficiency = _number(0.001, 5.0, required=True)
    fixed_overhead_s = _number(0.0, 10.0, required=True)
    covariance = _covariance(2)
    source = fields.String(validate=validate.Length(max=200))


class AcceptanceFitSchema(StrictSchema):
    """``AcceptanceModel``: per-position conditional acceptance sigmoid(a + b·i + c·T)."""

    method = fields.String(required=True, validate=validate.OneOf(METHODS))
    drafter = fields.String(allow_none=True, validate=validate.Length(max=96))
    structure = fields.String(required=True, validate=validate.OneOf(STRUCTURES))
    logit_intercept = _number(-100.0, 100.0, required=True)
    logit_position_slope = _number(-100.0, 100.0, required=True)
    logit_temperature_slope = _number(-100.0, 100.0, required=True)
    covariance = _covariance(3)
    temperature_range = fields.List(_number(0.0, 2.0), validate=validate.Length(equal=2))
    draft_fraction = Float(validate=validate.Range(min=0.0, max=1.0, min_inclusive=False))
    source = fields.String(validate=validate.Length(max=200))
    draft_fraction_logit = _number(-100.0, 100.0, allow_none=True)
    draft_fraction_temperature_slope = _number(-100.0, 100.0)
    draft_fraction_output_slope = _number(-100.0, 100.0)
    draft_fraction_output_tokens_up_to = _number(1.0, 1e7, allow_none=True)
    logit_output_slope = _number(-100.0, 100.0)
    logit_output_ref_tokens = _number(1.0, 1e7, allow_none=True)

    @validates_schema
    def _range_ordered(self, data: dict, **_: object) -> None:
        low_high = data.get("temperature_range")
        if low_high and low_high[0] > low_high[1]:
            raise ValidationError("temperature_range must be [low, high] with low <= high.", "temperature_range")


FIT_PARAMS = {"step_time": StepTimeFitSchema, "prefill": PrefillFitSchema, "acceptance": AcceptanceFitSchema}


class FitSchema(StrictSchema):
    id = fields.Integer(dump_only=True)
    kind = fields.String(required=True, validate=validate.OneOf(tuple(FIT_PARAMS)))
    key = fields.String(required=True, validate=validate.Length(min=1, max=200))
    params = fields.Dict(required=True, metadata={
        "description": "step_time: StepTimeParams; prefill: PrefillParams; acceptance: AcceptanceModel "
                       "(docs/cost-model.md). Checked against the cost model's fields and bounds."})
    residuals = fields.List(Float(), load_default=list, validate=validate.Length(max=100_000))
    created_at = fields.DateTime(dump_only=True)

    @validates_schema
    def _params_fit_the_cost_model(self, data: dict, **_: object) -> None:
        kind, params = data.get("kind"), data.get("params")
        if kind not in FIT_PARAMS or params is None:
            return
        try:
            loaded = FIT_PARAMS[kind]().load(params)
        except ValidationError as exc:
            raise ValidationError(exc.messages, "params") from None
        if kind == "acceptance":
            expected = acceptance_key(loaded["method"], loaded.get("drafter"), loaded["structure"])
            if data.get("key") != expected:
                raise ValidationError(f"An acceptance fit's key must be '{expected}' (method|drafter|structure).",
                                      "key")


class CalibrationRunSchema(Schema):
    id = fields.Integer()
    hardware = fields.String()
    target_model = fields.String()
    method = fields.String()
    draft_model = fields.String(allow_none=True)
    status = fields.String(metadata={"description": "queued | running | succeeded | failed"})
    progress = Float()
    message = fields.String(allow_none=True)
    error = fields.String(allow_none=True)
    queue = fields.String(allow_none=True)
    job_id = fields.String(allow_none=True)
    config = fields.Dict()
    environment = fields.Dict()
    created_at = fields.DateTime()
    started_at = fields.DateTime(allow_none=True)
    finished_at = fields.DateTime(allow_none=True)
    measurements = fields.List(fields.Nested(MeasurementSchema))
    fits = fields.List(fields.Nested(FitSchema))


class CalibrationUploadSchema(StrictSchema):
    """What ``advisor calibrate --server`` sends when a node ran the probes itself."""

    status = fields.String(validate=validate.OneOf(("running", "succeeded", "failed")))
    progress = Float(validate=validate.Range(min=0, max=1))
    message = fields.String(allow_none=True, validate=validate.Length(max=20_000))
    error = fields.String(allow_none=True, validate=validate.Length(max=200_000))
    environment = FreeDict()
    measurements = fields.List(fields.Nested(MeasurementSchema), load_default=list,
                               validate=validate.Length(max=10_000))
    fits = fields.List(fields.Nested(FitSchema), load_default=list, validate=validate.Length(max=1_000))


# --- deployments (issue 11: watch live vLLM servers) --------------------------------------------------------
class DeploymentCreateSchema(StrictSchema):
    metrics_url = fields.String(required=True, validate=validate.Length(min=1, max=2048),
                                metadata={"description": "The vLLM server's Prometheus endpoint, e.g. "
                                                         "http://10.0.0.5:8000/metrics (SPECADVISOR_MONITOR_ALLOW "
                                                         "lists private hosts and CIDRs that may be scraped)."})
    label = fields.String(required=True, validate=validate.Length(min=1, max=128))
    recommendation_id = fields.Integer(strict=True, validate=validate.Range(min=1), allow_none=True,
                                       metadata={"description": "The recommendation it was deployed from."})
    scenario = fields.Nested(ScenarioSchema, allow_none=True,
                             metadata={"description": "Or a scenario: it is answered and stored first."})

    @validates_schema
    def _one_source(self, data: dict, **_: object) -> None:
        given = [k for k in ("recommendation_id", "scenario") if data.get(k) is not None]
        if len(given) != 1:
            raise ValidationError("Give recommendation_id or scenario (exactly one).", "recommendation_id")


class DeploymentSchema(Schema):
    id = fields.Integer()
    label = fields.String()
    metrics_url = fields.String()
    recommendation_id = fields.Integer()
    created_at = fields.DateTime()
    state = fields.String(metadata={"description": "pending | ok | unreachable | not_prometheus | no_spec_decode "
                                                   "| refused"})
    status = fields.String(metadata={"description": "The state in words, e.g. 'unreachable since …'."})
    state_message = fields.String(allow_none=True)
    state_since = fields.DateTime(allow_none=True)
    last_scrape_at = fields.DateTime(allow_none=True)
    last_success_at = fields.DateTime(allow_none=True)
    latest = fields.Dict(metadata={"description": "Newest window, its drift flags, the verdict at its operating point."})


class DriftQuerySchema(StrictSchema):
    limit = fields.Integer(load_default=200, validate=validate.Range(min=2, max=5000),
                           metadata={"description": "How many of the newest snapshots to derive windows from."})


class ScrapeResultSchema(Schema):
    id = fields.Integer()
    scraped_at = fields.DateTime()
    ok = fields.Boolean()
    state = fields.String()
    error = fields.String(allow_none=True)
    size_bytes = fields.Integer(allow_none=True)
    duration_ms = Float(allow_none=True)


class DriftSchema(Schema):
    deployment = fields.Nested(DeploymentSchema)
    expected = _obj("What the recommendation predicted: AL and its band, break-even, TPOT, k.")
    windows = fields.List(fields.Dict(), metadata={"description": "Per scrape interval: realised AL, per-position "
                                                                 "acceptance, drafting fraction, concurrency, KV "
                                                                 "usage, tokens/s, TPOT/ITL/TTFT percentiles, "
                                                                 "lengths, flags."})
    restarts = fields.List(fields.String(), metadata={"description": "Scrape times where counters went back."})
    flags = fields.List(fields.Dict(), metadata={"description": "Drift flags of the newest window."})
    latest = fields.Dict(allow_none=True)
    verdict_today = fields.Dict(allow_none=True)
    snapshots = fields.Dict()
    sources = fields.Dict()
