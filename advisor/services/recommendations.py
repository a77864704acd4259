"""Recommendation service: validated scenario -> catalog specs + calibration -> cost model -> stored answer."""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import threading
from typing import Any, Iterator, NamedTuple

import sqlalchemy as sa
from sqlalchemy import Select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import undefer

from .. import costmodel
from ..errors import ApiError, field_error
from ..extensions import db
from ..models import Recommendation, Workload, utcnow
from . import calibrations, catalog


def scenario_from_dict(data: dict[str, Any]) -> costmodel.Scenario:
    """A scenario dict as loaded by ``ScenarioSchema`` -> the cost model's typed Scenario."""

    def sub(cls: type, key: str) -> Any:
        value = data.get(key)
        return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in value.items()}) if value else None

    plain = {k: v for k, v in data.items() if k not in ("speculator", "workload", "acceptance", "slo", "load")}
    return costmodel.Scenario(
        **plain,
        speculator=sub(costmodel.Speculator, "speculator"),
        workload=sub(costmodel.Workload, "workload"),
        acceptance=sub(costmodel.AcceptanceInput, "acceptance"),
        slo=sub(costmodel.Slo, "slo"),
        load=sub(costmodel.TcoLoad, "load"),
    )


# json.dumps(data, sort_keys=True, default=str), with its encoder built once rather than at each call
_CANONICAL_JSON = json.JSONEncoder(sort_keys=True, default=str)


class Answer(NamedTuple):
    data: dict[str, Any]  # the cost model's answer
    calibration_run_id: int | None
    text: str  # ``data`` as strict JSON text (no NaN or ±Infinity), encoded once by the cost model


_DECISION_RANK = {"go": 2, "calibrate": 1, "no-go": 0}


def predict(data: dict[str, Any]) -> Answer:
    """Compute (without storing) the answer for a validated scenario dict. Without a speculator the advisor tries
    the candidates that fit the target (:func:`best_speculator`), and ``data`` gets the one it chose."""
    if not data.get("speculator"):
        return best_speculator(data)
    scenario = scenario_from_dict(data)
    gpu_row = catalog.require_gpu(scenario.gpu)
    target_row = catalog.require_model(scenario.target_model, "target_model")
    draft_row = None
    if scenario.speculator.draft_model:
        draft_row = catalog.require_model(scenario.speculator.draft_model, "speculator.draft_model")
    gpu, target = catalog.gpu_spec(gpu_row), catalog.model_spec(target_row)
    draft = catalog.model_spec(draft_row) if draft_row is not None else None
    method = scenario.speculator.method
    for issue in costmodel.check_tensor_parallel(target, scenario.gpu_count, draft, method) + costmodel.check_draft(
            target, draft, method):
        if issue.severity == "error":
            raise field_error(issue.field, issue.message)
    calibration = calibrations.calibration_for(gpu.name, target.name, scenario, gpu)
    sources = {gpu.name: gpu_row.source, target.name: target_row.source}
    if draft_row is not None:
        sources[draft_row.name] = draft_row.source
    profile = catalog.answer_profile(gpu, scenario.vllm_version, calibration)
    try:
        prediction = costmodel.predict(scenario, gpu, target, draft, calibration=calibration,
                                       catalog_sources=sources, profile=profile,
                                       heads=catalog.compared_heads(target))
    except costmodel.CostModelError as exc:
        raise field_error(getattr(exc, "field", None) or "_schema", getattr(exc, "message", None) or str(exc)) from None
    answer = prediction.to_dict()
    return Answer(answer, answer.get("calibration_run_id"), prediction.json_text)


def best_speculator(data: dict[str, Any]) -> Answer:
    """A scenario that names no speculator: each candidate of :func:`catalog.speculator_candidates` (n-gram, the
    target's heads, small drafters of its tokenizer) answered as if named, at the k the advisor picks; the answer is
    the best one's -- by decision (go, calibrate, no-go), then the speedup's lower bound, then its expectation --
    with every candidate's verdict under ``speculator_choice``. ``data["speculator"]`` is set to the choice, so the
    stored scenario reproduces the answer when sent again."""
    target = catalog.model_spec(catalog.require_model(data["target_model"], "target_model"))
    for issue in costmodel.check_tensor_parallel(target, data.get("gpu_count", 1)):
        raise field_error(issue.field, issue.message)  # no candidate can run: say why, not "none fits"
    tried: list[tuple[dict[str, Any], Answer]] = []
    for candidate in catalog.speculator_candidates(target):
        try:
            tried.append((candidate, predict({**data, "speculator": candidate})))
        except ApiError:  # a candidate this deployment cannot run: the others still answer
            continue
    if not tried:
        raise field_error("speculator", "no speculator in the catalog fits this target: name one")

    def rank(item: tuple[dict[str, Any], Answer]) -> tuple[int, float, float]:
        speedup = item[1].data.get("speedup") or {}
        return (_DECISION_RANK.get(item[1].data.get("decision"), 0), speedup.get("low") or 0.0,
                speedup.get("expected") or 0.0)

    chosen, best = max(tried, key=rank)  # max keeps the first of equals: the candidates' order breaks ties
    data["speculator"] = chosen
    rows = [{**candidate, "num_speculative_tokens": answer.data.get("num_speculative_tokens"),
             "decision": answer.data.get("decision"),
             **{k: (answer.data.get("speedup") or {}).get(k) for k in ("expected", "low", "high")}}
            for candidate, answer in tried]
    answer = {**best.data,
              "speculator_choice": {"chosen": chosen, "candidates": rows,
                                    "rule": "decision (go, calibrate, no-go), then the speedup's lower bound, then "
                                            "its expectation"},
              "provenance": {**best.data.get("provenance", {}),
                             "speculator": f"advisor: the best of {len(rows)} candidates (speculator_choice)"}}
    return Answer(answer, best.calibration_run_id, costmodel.finite_json(answer))


def summary_columns(scenario: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """The list and export columns of one answer, stored beside it (README: Export columns)."""
    workload = scenario.get("workload") or {}
    speedup, tpot = answer.get("speedup") or {}, answer.get("tpot_ms") or {}
    usd = (answer.get("tco") or {}).get("usd_per_million_output_tokens") or {}
    concurrency = workload.get("concurrency")
    if concurrency is None:  # open loop: the concurrency the cost model derived (Little's law)
        concurrency = (answer.get("concurrency") or {}).get("speculative")
    return {"gpu_count": scenario.get("gpu_count", 1), "structure": workload.get("structure"),
            "concurrency": concurrency, "speedup_low": speedup.get("low"), "speedup_high": speedup.get("high"),
            "num_speculative_tokens": answer.get("num_speculative_tokens"),
            "tpot_ms_baseline": tpot.get("baseline"), "tpot_ms_speculative": tpot.get("speculative"),
            "usd_per_million_output_tokens_baseline": usd.get("baseline"),
            "usd_per_million_output_tokens_speculative": usd.get("speculative"),
            "timing_source": (answer.get("provenance") or {}).get("tpot_ms.baseline")}


def create(data: dict[str, Any]) -> dict[str, Any]:
    """Answer a validated scenario and store it; returns the stored answer (``as_dict``'s shape)."""
    return create_with_json(data)[0]


def create_with_json(data: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    """Answer a validated scenario and store it: ``(stored answer, the same as JSON, UTF-8)``.

    The answer is encoded once, by the cost model: that text is what the database stores and what the response
    sends (encoding refuses NaN and ±Infinity, which JSON cannot carry). One INSERT statement on PostgreSQL (the workload upsert
    rides along as a CTE), two on SQLite; the upsert (``ON CONFLICT``) makes concurrent identical scenarios
    safe; nothing is read back after the commit."""
    answer, run_id, answer_text = predict(data)
    canonical = _CANONICAL_JSON.encode(data)
    fingerprint = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    speculator = data["speculator"]
    now = utcnow()
    values = {
        "created_at": now, "gpu": data["gpu"], "target_model": data["target_model"],
        "method": speculator["method"], "draft_model": speculator.get("draft_model"),
        "decision": answer["decision"],
        # a deployment that cannot exist has no speedup (null in the answer); the summary column stores 0
        "expected_speedup": float((answer.get("speedup") or {}).get("expected") or 0.0),
        **summary_columns(data, answer), "inputs": canonical, "answer": answer_text,
        "cost_model_version": answer.get("cost_model_version", costmodel.COST_MODEL_VERSION),
        "calibration_run_id": run_id,
    }
    values["summary"] = summary_text(values)
    rec_id, workload_id = _insert(fingerprint, canonical, now, values)
    body = stored_body(rec_id, now, workload_id, canonical, answer_text)
    return {"id": rec_id, "created_at": now, "workload_id": workload_id, "scenario": data, **answer}, body


def stored_body(rec_id: int, created_at: Any, workload_id: int, inputs_text: str | bytes,
                answer_text: str | bytes) -> bytes:
    """``as_dict``'s shape as JSON (UTF-8), from the stored JSON texts of the scenario and the answer (neither is
    parsed nor encoded again): what POST sends and GET by id sends. Joined as bytes: a POST's answer text was
    encoded to UTF-8 when the driver bound it, and CPython keeps that encoding with a non-ASCII text, so its
    ``encode`` is a copy; a text joined first would be encoded anew (7 µs for an answer's 12 KB). SQLite's GET reads
    the texts as their UTF-8 bytes (:data:`_GET_BYTES`), which are joined as they are."""
    if type(rec_id) is int and type(workload_id) is int:  # json.dumps' text: the ISO time is digits and -:.T+
        head = (f'{{"id": {rec_id}, "created_at": "{created_at.isoformat()}", "workload_id": {workload_id}, '
                '"scenario": ')
    else:
        head = json.dumps({"id": rec_id, "created_at": created_at.isoformat(), "workload_id": workload_id,
                           "scenario": None})[:-len("null}")]
    return b"".join((head.encode(), _utf8(inputs_text), b", ", memoryview(_utf8(answer_text))[1:]))


def _utf8(text: str | bytes) -> bytes:
    return text if type(text) is bytes else text.encode()


_RECOMMENDATION_COLUMNS = tuple(c.name for c in Recommendation.__table__.c if c.name not in ("id", "workload_id"))


def _bind(name: str, column: sa.Column, dialect: str) -> Any:
    """A bound parameter for ``column``; JSON columns take text already encoded (cast to json on PostgreSQL)."""
    if isinstance(column.type, sa.JSON):
        text = sa.bindparam(name, type_=sa.Text())
        return sa.cast(text, column.type) if dialect == "postgresql" else text
    return sa.bindparam(name, type_=column.type)


class _Driver(NamedTuple):
    """A statement compiled once for one dialect: the SQL text, its parameters' names (in order where the driver's
    parameters are positional), each with the type processor SQLAlchemy applies to its bound value (e.g.
    UtcDateTime to UTC text on SQLite) or None, and the values of parameters the statement fixed itself (SQLite's
    ``OFFSET 0`` after a ``LIMIT``)."""

    sql: str
    binds: tuple[tuple[str, Any], ...]  # (name, processor or None)
    positional: bool
    fixed: dict[str, Any]

    def parameters(self, values: dict[str, Any]) -> Any:
        """The driver's parameters for ``values`` (by name), processed as SQLAlchemy's execute would."""
        if self.fixed:
            values = {**self.fixed, **values}
        bound = [values[name] if process is None else process(values[name]) for name, process in self.binds]
        return tuple(bound) if self.positional else dict(zip((name for name, _ in self.binds), bound))


def _driver(statement: Any, dialect: sa.Dialect) -> _Driver:
    compiled = statement.compile(dialect=dialect)
    state = compiled.construct_expanded_state({name: None for name in compiled.bind_names.values()})
    positional = state.positiontup is not None
    names = tuple(state.positiontup) if positional else tuple(state.parameters)
    fixed = {name: value for name, value in compiled.construct_params(_check=False).items() if value is not None}
    processors = {name: bind.type.dialect_impl(dialect).bind_processor(dialect)
                  for name, bind in compiled.binds.items()}
    return _Driver(state.statement, tuple((name, processors.get(name)) for name in names), positional, fixed)


@functools.cache
def _insert_statements(dialect: str) -> tuple[Any, Any]:
    """(workload upsert, recommendation insert), built once per dialect with bound parameters."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    table, workloads = Recommendation.__table__, Workload.__table__
    workload = insert(workloads).values(**{name: _bind(f"w_{name}", workloads.c[name], dialect)
                                           for name in ("fingerprint", "scenario", "created_at")})
    # DO UPDATE (a no-op write) rather than DO NOTHING so RETURNING gives the id whether or not it existed
    workload = workload.on_conflict_do_update(index_elements=["fingerprint"],
                                              set_={"fingerprint": workload.excluded.fingerprint})
    workload = workload.returning(Workload.__table__.c.id)
    values = {name: _bind(name, table.c[name], dialect) for name in _RECOMMENDATION_COLUMNS}
    if dialect == "postgresql":
        cte = workload.cte("workload")
        recommendation = (sa.insert(table).add_cte(cte)
                          .values(workload_id=sa.select(cte.c.id).scalar_subquery(), **values)
                          .returning(table.c.id, table.c.workload_id))
        return None, recommendation
    values["workload_id"] = sa.bindparam("workload_id", type_=sa.Integer())
    return workload, sa.insert(table).values(**values).returning(table.c.id, table.c.workload_id)


_DRIVERS: dict[Any, tuple[_Driver | None, _Driver]] = {}


def _insert_drivers(dialect: sa.Dialect) -> tuple[_Driver | None, _Driver]:
    """:func:`_insert_statements` compiled once for this engine's dialect. Each POST then binds its values and
    hands the SQL text to a pooled connection's cursor (:func:`_cursor`): SQLAlchemy's per-execution work on a
    cached statement (its cache key over ~30 bound parameters, parameter processing, the compiled-cache lookup)
    took about as long as SQLite's own INSERTs, and a Core connection's results and transaction a third more.
    What is stored is unchanged: the same SQL and SQLAlchemy's own type processors."""
    drivers = _DRIVERS.get(dialect)
    if drivers is None:
        workload, recommendation = _insert_statements(dialect.name)
        drivers = _DRIVERS[dialect] = (_driver(workload, dialect) if workload is not None else None,
                                       _driver(recommendation, dialect))
    return drivers


def _insert(fingerprint: str, scenario: str, now: Any, values: dict[str, Any]) -> tuple[int, int]:
    engine = db.engine
    workload, recommendation = _insert_drivers(engine.dialect)
    params = {"w_fingerprint": fingerprint, "w_scenario": scenario, "w_created_at": now, **values}
    with _cursor(transaction=True) as cursor, sqlite_write_lock(engine):
        if workload is not None:
            cursor.execute(workload.sql, workload.parameters(params))
            ((params["workload_id"],),) = cursor.fetchall()
        cursor.execute(recommendation.sql, recommendation.parameters(params))
        ((rec_id, workload_id),) = cursor.fetchall()
        cursor.connection.commit()
    return rec_id, workload_id


_THREAD_LOCKS: dict[str, threading.Lock] = {}
_LOCK_FILES: dict[str, Any] = {}


@contextlib.contextmanager
def sqlite_write_lock(engine: sa.Engine) -> Iterator[None]:
    """SQLite has one writer at a time; a writer that finds the file locked polls with growing sleeps (SQLite's
    busy handler: 1, 2, 5, 10 … 100 ms), which under load left cores idle and POSTs waiting seconds. Writers of
    this service queue instead: a thread lock within the process, an ``flock`` on a file beside the database
    between worker processes; both wake the next writer as soon as the lock is free. No-op on other backends."""
    path = engine.url.database if engine.dialect.name == "sqlite" else None
    if not path or path == ":memory:":
        yield
        return
    lock = _THREAD_LOCKS.setdefault(path, threading.Lock())
    with lock:
        handle = _LOCK_FILES.get(path)
        if handle is None:
            handle = _LOCK_FILES[path] = open(f"{path}.write-lock", "a+b")  # noqa: SIM115  (kept open)
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _cursor(transaction: bool = False) -> Iterator[Any]:
    """A pooled connection's DB-API cursor. For a read (no ``transaction``): PostgreSQL gets no BEGIN and no
    ROLLBACK round trip (psycopg's autocommit, a client-side flag, set for the read and cleared before the pool
    takes the connection back; a SELECT opens no transaction in pysqlite). A read through a Core connection cost
    the worker 0.45 ms of CPU on PostgreSQL and 0.29 ms on SQLite, the driver 0.19 and 0.05 ms (GET by id, in
    process). For a write (``transaction``): the statements run in the driver's transaction, which the caller
    commits (``cursor.connection.commit()``); an uncommitted one is rolled back as the pool takes the connection
    back (its reset on return). POST's INSERTs through a Core connection took 0.17 ms, the driver 0.11. The pool
    still checks the connection out and in (its idle ping included), and a driver error is raised as SQLAlchemy's
    (a dropped connection invalidated), so the 503 handlers see what Core raises."""
    engine = db.engine
    dialect = engine.dialect
    dbapi_error = dialect.loaded_dbapi.Error
    try:
        raw = engine.raw_connection()
    except dbapi_error as error:  # the server is down or does not answer in time (Engine.connect wraps this too)
        raise sa.exc.DBAPIError.instance(None, None, error, dbapi_error, dialect=dialect) from error
    autocommit = not transaction and dialect.name == "postgresql"
    cursor = None
    try:
        if autocommit:
            raw.driver_connection.autocommit = True
        cursor = raw.cursor()
        yield cursor
    except dbapi_error as error:
        invalidated = dialect.is_disconnect(error, raw.dbapi_connection, cursor)
        if invalidated:  # as a Core connection does: this connection, and the pool's older ones at checkout
            engine.pool._invalidate(raw, error)
        raise sa.exc.DBAPIError.instance(None, None, error, dbapi_error, connection_invalidated=invalidated,
                                         dialect=dialect) from error
    finally:
        if raw.dbapi_connection is not None:  # not invalidated
            if cursor is not None:
                cursor.close()
            if autocommit:
                raw.driver_connection.autocommit = False
        raw.close()


class _Read(NamedTuple):
    """A SELECT compiled once for one dialect (:class:`_Driver`) and its columns' result processors (e.g.
    UtcDateTime's: text to an aware datetime on SQLite)."""

    driver: _Driver
    results: tuple[Any, ...]

    def rows(self, values: dict[str, Any]) -> list[tuple]:
        """The rows for ``values`` (by parameter name), each value processed as a Core result would be."""
        with _cursor() as cursor:
            cursor.execute(self.driver.sql, self.driver.parameters(values))
            rows = cursor.fetchall()
        results = self.results
        if not any(results):
            return rows
        return [tuple(v if f is None or v is None else f(v) for f, v in zip(results, row)) for row in rows]


_READS: dict[tuple[Any, sa.Dialect], _Read] = {}


def _read(statement: Any) -> _Read:
    """``statement`` compiled once for this engine's dialect (statements are built once: functools.cache)."""
    dialect = db.engine.dialect
    read = _READS.get((statement, dialect))
    if read is None:
        results = tuple(c.type.dialect_impl(dialect).result_processor(dialect, None)
                        for c in statement.selected_columns)
        read = _READS[statement, dialect] = _Read(_driver(statement, dialect), results)
    return read


class _Utf8(sa.types.UserDefinedType):
    """A cast to SQLite's BLOB whose value comes back as the driver gives it: the text's UTF-8 bytes, not decoded
    into a str (and encoded again for the response) nor copied by LargeBinary's result processor."""

    cache_ok = True

    def get_col_spec(self, **_kw: Any) -> str:
        return "BLOB"


def _get_statement(as_type: Any) -> Select:
    return sa.select(Recommendation.id, Recommendation.created_at, Recommendation.workload_id,
                     sa.cast(Recommendation.inputs, as_type), sa.cast(Recommendation.answer, as_type)
                     ).where(Recommendation.id == sa.bindparam("rec_id"))


_GET_TEXT = _get_statement(sa.Text())  # PostgreSQL: the json type's text, verbatim
_GET_BYTES = _get_statement(_Utf8())  # SQLite: the stored text's bytes (UTF-8, the database's encoding)


def get_body(rec_id: int) -> bytes:
    """One stored recommendation as JSON (``as_dict``'s shape, UTF-8): one SELECT; the stored JSON texts are sent
    as they are (the ``json`` type keeps its text verbatim on PostgreSQL; SQLite stores text)."""
    rows = _read(_GET_BYTES if db.engine.dialect.name == "sqlite" else _GET_TEXT).rows({"rec_id": rec_id})
    if not rows:
        raise ApiError(404, f"No recommendation with id {rec_id}.")
    return stored_body(*rows[0])


def get(rec_id: int) -> Recommendation:
    rec = db.session.get(Recommendation, rec_id,
                         options=[undefer(Recommendation.inputs), undefer(Recommendation.answer)])
    if rec is None:
        raise ApiError(404, f"No recommendation with id {rec_id}.")
    return rec


# Stable export columns (README: "Export columns"); append only, never rename.
EXPORT_COLUMNS = (
    "id", "created_at", "gpu", "gpu_count", "target_model", "method", "draft_model", "structure", "concurrency",
    "decision", "speedup_expected", "speedup_low", "speedup_high", "num_speculative_tokens",
    "tpot_ms_baseline", "tpot_ms_speculative", "usd_per_million_output_tokens_baseline",
    "usd_per_million_output_tokens_speculative", "calibration_run_id", "cost_model_version", "timing_source",
)
_SUMMARY_SELECT = tuple(Recommendation.expected_speedup.label(c) if c == "speedup_expected"
                        else getattr(Recommendation, c) for c in EXPORT_COLUMNS)
_TABLE = Recommendation.__table__
# a list entry's fields after the id, with the column and the JSON type each is written as
_SUMMARY_FIELDS = tuple((name, column, _TABLE.c[column].type.python_type) for name, column in (
    (c, "expected_speedup" if c == "speedup_expected" else c) for c in EXPORT_COLUMNS[1:]))


def summary_text(values: dict[str, Any]) -> str:
    """A row's list entry without its id, as JSON text (``RecommendationSummarySchema``'s fields and types),
    from the column values about to be inserted; stored in ``summary``."""
    out = {}
    for name, column, kind in _SUMMARY_FIELDS:
        value = values[column]
        if value is not None:
            value = value.isoformat() if column == "created_at" else kind(value)
        out[name] = value
    return costmodel.finite_json(out)


_FILTERS = {"gpu": "==", "target_model": "==", "method": "==", "decision": "==",
            # UtcDateTime compares instants: +02:00 and Z agree on every backend
            "created_after": ">=", "created_before": "<="}


def _condition(key: str, value: Any) -> Any:
    column = _TABLE.c.created_at if key.startswith("created_") else _TABLE.c[key]
    return {"==": column.__eq__, ">=": column.__ge__, "<=": column.__le__}[_FILTERS[key]](value)


def _conditions(filters: dict[str, Any]) -> list[Any]:
    return [_condition(key, filters[key]) for key in _FILTERS if filters.get(key)]


def filtered(filters: dict[str, Any]) -> Select:
    """The summary columns of the matching recommendations, newest first (no answer is read)."""
    return sa.select(*_SUMMARY_SELECT).where(*_conditions(filters)).order_by(Recommendation.id.desc())


def summary_page(filters: dict[str, Any], offset: int, limit: int) -> tuple[str, int]:
    """``(a page of the list as JSON text, how many match)``, newest first, in one statement: the stored list
    entries (``summary``) are joined, nothing is parsed or encoded; the count rides along as a scalar subquery
    (a second statement only for a page past the end). Unfiltered pages read the covering index on
    ``(id, summary)``: SQLite stores ``summary`` after the ~12 KB answer, and reaching it through each row walked
    the row's overflow pages."""
    keys = tuple(key for key in _FILTERS if filters.get(key))
    query, count = _page_statements(keys)
    params = {**{key: filters[key] for key in keys}, "offset": offset, "limit": limit}
    rows = _read(query).rows(params)
    total = rows[0][2] if rows else _read(count).rows(params)[0][0]
    return _entries_text(rows), total


def page_after(filters: dict[str, Any], after_id: int, limit: int) -> str:
    """A keyset page of the list as JSON text: the matching rows older than ``after_id``, newest first. No OFFSET
    and no count: the index is read from ``after_id`` down, so the page costs the same at any depth."""
    keys = tuple(key for key in _FILTERS if filters.get(key))
    params = {**{key: filters[key] for key in keys}, "after_id": after_id, "limit": limit}
    return _entries_text(_read(_keyset_statement(keys)).rows(params))


def _entries_text(rows: Any) -> str:
    """The stored list entries of ``(id, summary, …)`` rows joined into a JSON array (nothing parsed)."""
    return "[" + ", ".join([f'{{"id": {row[0]}, {row[1][1:]}' for row in rows]) + "]"  # a list: join sizes it once


@functools.cache
def _keyset_statement(keys: tuple[str, ...]) -> Select:
    conditions = [_condition(key, sa.bindparam(key)) for key in keys]
    return (sa.select(_TABLE.c.id, _TABLE.c.summary).where(_TABLE.c.id < sa.bindparam("after_id"), *conditions)
            .order_by(_TABLE.c.id.desc()).limit(sa.bindparam("limit")))


@functools.cache
def _page_statements(keys: tuple[str, ...]) -> tuple[Select, Select]:
    """(page, count) for one set of filters, built once with bound values (SQLAlchemy then reuses the compiled
    form; building the select anew took about a third of a page's time)."""
    conditions = [_condition(key, sa.bindparam(key)) for key in keys]
    count = sa.select(sa.func.count()).select_from(_TABLE).where(*conditions)
    query = (sa.select(_TABLE.c.id, _TABLE.c.summary, count.scalar_subquery()).where(*conditions)
             .order_by(_TABLE.c.id.desc()).offset(sa.bindparam("offset")).limit(sa.bindparam("limit")))
    return query, count


def list_all(filters: dict[str, Any], limit: int | None = None) -> list[dict[str, Any]]:
    query = filtered(filters)
    if limit:
        query = query.limit(limit)
    return [dict(row._mapping) for row in db.session.execute(query)]


def as_dict(rec: Recommendation) -> dict[str, Any]:
    """The full stored answer: the cost model's answer plus identity and the scenario it answered."""
    return {"id": rec.id, "created_at": rec.created_at, "workload_id": rec.workload_id,
            "scenario": rec.inputs, **rec.answer}


COMPARE_ROWS = (
    ("decision", ("decision",)), ("speedup (expected)", ("speedup", "expected")),
    ("speedup (low)", ("speedup", "low")), ("speedup (high)", ("speedup", "high")),
    ("k", ("num_speculative_tokens",)), ("TPOT baseline (ms)", ("tpot_ms", "baseline")),
    ("TPOT speculative (ms)", ("tpot_ms", "speculative")),
    ("throughput baseline (tok/s)", ("throughput_tok_s", "baseline")),
    ("throughput speculative (tok/s)", ("throughput_tok_s", "speculative")),
    ("mean acceptance length", ("acceptance", "mean_acceptance_length")),
    ("break-even concurrency", ("break_even_concurrency",)),
    ("fits in memory", ("memory", "fits")),
    ("$ / 1M output tokens baseline", ("tco", "usd_per_million_output_tokens", "baseline")),
    ("$ / 1M output tokens speculative", ("tco", "usd_per_million_output_tokens", "speculative")),
    ("monthly savings ($)", ("tco", "monthly_savings_usd")),
)


def _dig(data: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def compare(ids: list[int]) -> dict[str, Any]:
    recs = [get(i) for i in ids]
    rows = [{"quantity": label, "values": [_dig(r.answer, path) for r in recs]} for label, path in COMPARE_ROWS]
    return {"recommendations": [as_dict(r) for r in recs], "rows": rows}
