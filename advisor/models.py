"""Storage: SQLAlchemy 2.x models. Alembic (``migrations/``) owns the schema; keep both in step."""
from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.orm import Mapped, mapped_column, relationship

from .extensions import db


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class UtcDateTime(sa.types.TypeDecorator):
    """An instant: stored in UTC, read back with its time zone, on every backend.

    SQLite has no time zone type; SQLAlchemy writes an aware value's wall clock and drops the offset, so
    ``…+02:00`` and ``…Z`` for one instant compared differently. Values are converted to UTC on the way in
    (a naive value is taken as UTC) and marked UTC on the way out."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: sa.Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.timezone.utc)
        return value.astimezone(dt.timezone.utc)

    def process_result_value(self, value: dt.datetime | None, dialect: sa.Dialect) -> dt.datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None else value.astimezone(dt.timezone.utc)


class Timestamped:
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow, index=True)


class Gpu(Timestamped, db.Model):
    __tablename__ = "gpus"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(64), unique=True)
    vendor: Mapped[str] = mapped_column(sa.String(32))
    gpu_class: Mapped[str] = mapped_column(sa.String(32))
    memory_gb: Mapped[float]
    hbm_bandwidth_gb_per_s: Mapped[float]
    bf16_tflops: Mapped[float]
    fp8_tflops: Mapped[float | None]
    gpu_hour_usd: Mapped[float]
    gpu_hour_usd_date: Mapped[str] = mapped_column(sa.String(10))
    source: Mapped[str] = mapped_column(sa.Text)
    updated_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow, onupdate=utcnow)


class Model(Timestamped, db.Model):
    __tablename__ = "models"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(96), unique=True)
    family: Mapped[str] = mapped_column(sa.String(64))
    kind: Mapped[str] = mapped_column(sa.String(32))
    num_layers: Mapped[int]
    hidden_size: Mapped[int]
    num_attention_heads: Mapped[int]
    num_kv_heads: Mapped[int]
    head_dim: Mapped[int]
    intermediate_size: Mapped[int]
    vocab_size: Mapped[int]
    tie_word_embeddings: Mapped[bool]
    num_experts: Mapped[int | None]
    num_experts_per_token: Mapped[int | None]
    param_count: Mapped[int] = mapped_column(sa.BigInteger)
    tokenizer_family: Mapped[str] = mapped_column(sa.String(64))
    tokenizer_vocab_size: Mapped[int]
    tokenizer_hash: Mapped[str | None] = mapped_column(sa.String(128))
    hf_repo: Mapped[str | None] = mapped_column(sa.String(200))
    max_position_embeddings: Mapped[int | None]  # the context window (costmodel.ModelSpec)
    source: Mapped[str] = mapped_column(sa.Text)
    updated_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow, onupdate=utcnow)


class ApiToken(Timestamped, db.Model):
    __tablename__ = "api_tokens"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(64))
    prefix: Mapped[str] = mapped_column(sa.String(12))
    token_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)
    revoked: Mapped[bool] = mapped_column(default=False)
    last_used_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)


class Workload(Timestamped, db.Model):
    """A scenario as a client sent it (normalised); many recommendations may share one."""

    __tablename__ = "workloads"
    id: Mapped[int] = mapped_column(primary_key=True)
    fingerprint: Mapped[str] = mapped_column(sa.String(64), unique=True)
    scenario: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    recommendations: Mapped[list[Recommendation]] = relationship(back_populates="workload")


class CalibrationRun(Timestamped, db.Model):
    __tablename__ = "calibration_runs"
    id: Mapped[int] = mapped_column(primary_key=True)
    hardware: Mapped[str] = mapped_column(sa.String(96), index=True)
    target_model: Mapped[str] = mapped_column(sa.String(96))
    method: Mapped[str] = mapped_column(sa.String(32))
    draft_model: Mapped[str | None] = mapped_column(sa.String(96))
    status: Mapped[str] = mapped_column(sa.String(16), default="queued", index=True)
    progress: Mapped[float] = mapped_column(default=0.0)
    message: Mapped[str | None] = mapped_column(sa.Text)
    error: Mapped[str | None] = mapped_column(sa.Text)
    queue: Mapped[str | None] = mapped_column(sa.String(128))
    job_id: Mapped[str | None] = mapped_column(sa.String(64))
    config: Mapped[dict[str, Any]] = mapped_column(sa.JSON, default=dict)
    environment: Mapped[dict[str, Any]] = mapped_column(sa.JSON, default=dict)
    started_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    measurements: Mapped[list[ProbeMeasurement]] = relationship(
        back_populates="run", order_by="ProbeMeasurement.id", cascade="all, delete-orphan"
    )
    fits: Mapped[list[FittedParameters]] = relationship(
        back_populates="run", order_by="FittedParameters.id", cascade="all, delete-orphan"
    )


class ProbeMeasurement(Timestamped, db.Model):
    __tablename__ = "probe_measurements"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(sa.ForeignKey("calibration_runs.id", ondelete="CASCADE"), index=True)
    probe: Mapped[str] = mapped_column(sa.String(32))
    params: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    values: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    run: Mapped[CalibrationRun] = relationship(back_populates="measurements")


class FittedParameters(Timestamped, db.Model):
    __tablename__ = "fitted_parameters"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(sa.ForeignKey("calibration_runs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(sa.String(32))  # step_time | prefill | acceptance
    key: Mapped[str] = mapped_column(sa.String(200))
    params: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    residuals: Mapped[list[float]] = mapped_column(sa.JSON, default=list)
    run: Mapped[CalibrationRun] = relationship(back_populates="fits")


class Recommendation(Timestamped, db.Model):
    """An answer as it was given: never updated (enforced below)."""

    __tablename__ = "recommendations"
    id: Mapped[int] = mapped_column(primary_key=True)
    workload_id: Mapped[int] = mapped_column(sa.ForeignKey("workloads.id"), index=True)
    gpu: Mapped[str] = mapped_column(sa.String(64), index=True)
    target_model: Mapped[str] = mapped_column(sa.String(96), index=True)
    method: Mapped[str] = mapped_column(sa.String(32))
    draft_model: Mapped[str | None] = mapped_column(sa.String(96))
    decision: Mapped[str] = mapped_column(sa.String(16), index=True)
    expected_speedup: Mapped[float]
    # The list and export columns, stored so a list never parses whole answers (README: Export columns).
    gpu_count: Mapped[int | None]
    structure: Mapped[str | None] = mapped_column(sa.String(16))
    concurrency: Mapped[float | None]
    speedup_low: Mapped[float | None]
    speedup_high: Mapped[float | None]
    num_speculative_tokens: Mapped[int | None]
    tpot_ms_baseline: Mapped[float | None]
    tpot_ms_speculative: Mapped[float | None]
    usd_per_million_output_tokens_baseline: Mapped[float | None]
    usd_per_million_output_tokens_speculative: Mapped[float | None]
    # where the answer's timing came from: "calibration:<id>", "profile:<GPU × vLLM …>" or "default" (migration 0007)
    timing_source: Mapped[str | None] = mapped_column(sa.String(160))
    # The list entry of this row without its id, as JSON text written at INSERT: a list joins stored texts.
    summary: Mapped[str] = mapped_column(sa.Text, deferred=True)
    inputs: Mapped[dict[str, Any]] = mapped_column(sa.JSON, deferred=True)
    answer: Mapped[dict[str, Any]] = mapped_column(sa.JSON, deferred=True)
    cost_model_version: Mapped[str] = mapped_column(sa.String(16))
    calibration_run_id: Mapped[int | None] = mapped_column(sa.ForeignKey("calibration_runs.id"))
    workload: Mapped[Workload] = relationship(back_populates="recommendations")

    # a list page reads ids and summaries from this index alone, never the rows (migration 0005)
    __table_args__ = (sa.Index("ix_recommendations_id_summary", "id", "summary"),)


@event.listens_for(Recommendation, "before_update")
def _recommendations_are_immutable(mapper, connection, target) -> None:  # noqa: ANN001
    raise ValueError("recommendations are immutable; create a new one instead")


class Deployment(Timestamped, db.Model):
    """A live vLLM server watched through its Prometheus ``/metrics``, against the recommendation it came from."""

    __tablename__ = "deployments"
    id: Mapped[int] = mapped_column(primary_key=True)
    label: Mapped[str] = mapped_column(sa.String(128))
    metrics_url: Mapped[str] = mapped_column(sa.String(2048))
    recommendation_id: Mapped[int] = mapped_column(sa.ForeignKey("recommendations.id"), index=True)
    # pending | ok | unreachable | not_prometheus | no_spec_decode | refused
    state: Mapped[str] = mapped_column(sa.String(32), default="pending", index=True)
    state_message: Mapped[str | None] = mapped_column(sa.Text)
    state_since: Mapped[dt.datetime | None] = mapped_column(sa.DateTime(timezone=True))
    last_scrape_at: Mapped[dt.datetime | None] = mapped_column(sa.DateTime(timezone=True))
    last_success_at: Mapped[dt.datetime | None] = mapped_column(sa.DateTime(timezone=True))
    latest: Mapped[dict[str, Any]] = mapped_column(sa.JSON, default=dict)  # newest window, flags, verdict today
    recommendation: Mapped[Recommendation] = relationship()
    snapshots: Mapped[list[MetricSnapshot]] = relationship(
        back_populates="deployment", order_by="MetricSnapshot.id", cascade="all, delete-orphan", passive_deletes=True
    )


class MetricSnapshot(db.Model):
    """One scrape: the parsed figures (``values``), or why there are none (``error``)."""

    __tablename__ = "metric_snapshots"
    id: Mapped[int] = mapped_column(primary_key=True)
    deployment_id: Mapped[int] = mapped_column(sa.ForeignKey("deployments.id", ondelete="CASCADE"), index=True)
    scraped_at: Mapped[dt.datetime] = mapped_column(sa.DateTime(timezone=True), default=utcnow, index=True)
    ok: Mapped[bool] = mapped_column(default=False)
    state: Mapped[str] = mapped_column(sa.String(32))
    error: Mapped[str | None] = mapped_column(sa.Text)
    values: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON)
    size_bytes: Mapped[int | None]
    duration_ms: Mapped[float | None]
    deployment: Mapped[Deployment] = relationship(back_populates="snapshots")


class Plan(Timestamped, db.Model):
    """A capacity plan as it was answered (issue 12): never updated (enforced below)."""

    __tablename__ = "plans"
    id: Mapped[int] = mapped_column(primary_key=True)
    target_model: Mapped[str] = mapped_column(sa.String(96), index=True)
    feasible: Mapped[bool]
    best_option: Mapped[str | None] = mapped_column(sa.String(160))  # cheapest option at the first load level
    inputs: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    answer: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    cost_model_version: Mapped[str] = mapped_column(sa.String(16))


@event.listens_for(Plan, "before_update")
def _plans_are_immutable(mapper, connection, target) -> None:  # noqa: ANN001
    raise ValueError("plans are immutable; create a new one instead")
