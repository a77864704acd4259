"""Alembic owns the schema: upgrade -> downgrade -> upgrade on SQLite and PostgreSQL, and no drift."""
from __future__ import annotations

import json
import uuid

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from advisor.extensions import db
from advisor.storage import downgrade, upgrade
from tests.conftest import BACKENDS, POSTGRES_ADMIN_URL

TABLES = {"gpus", "models", "api_tokens", "workloads", "recommendations", "calibration_runs", "plans",
          "probe_measurements", "fitted_parameters", "deployments", "metric_snapshots"}


@pytest.fixture(params=BACKENDS)
def empty_engine(request, tmp_path):
    if request.param == "sqlite":
        engine = sa.create_engine(f"sqlite:///{tmp_path / 'm.db'}")
        yield engine
        engine.dispose()
        return
    name = f"specadvisor_mig_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    engine = sa.create_engine(sa.engine.make_url(POSTGRES_ADMIN_URL).set(database=name))
    yield engine
    engine.dispose()
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def _tables(engine) -> set[str]:
    return set(sa.inspect(engine).get_table_names()) - {"alembic_version"}


def test_upgrade_downgrade_upgrade(empty_engine):
    upgrade(empty_engine)
    assert _tables(empty_engine) == TABLES
    downgrade(empty_engine, "base")
    assert _tables(empty_engine) == set()
    upgrade(empty_engine)
    assert _tables(empty_engine) == TABLES


def test_models_match_migrations(empty_engine):
    upgrade(empty_engine)
    with empty_engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), db.metadata)
    assert diff == [], f"models and migrations differ; write a migration: {diff}"


def test_summary_text_backfill_matches_what_insert_writes(empty_engine, tmp_path):
    """0005 backfills ``summary`` for rows stored before it; the list then sends what a new row's INSERT wrote."""
    from advisor import create_app
    from tests.conftest import example_scenario

    url = empty_engine.url.render_as_string(hide_password=False)
    app = create_app({"SQLALCHEMY_DATABASE_URI": url, "TESTING": True, "INSTANCE_PATH": str(tmp_path)})
    client = app.test_client()
    for k, concurrency in ((2, 8), (3, 64)):
        workload = {**example_scenario()["workload"], "concurrency": concurrency}
        speculator = {**example_scenario()["speculator"], "num_speculative_tokens": k}
        assert client.post("/v1/recommendations",
                           json=example_scenario(workload=workload, speculator=speculator)).status_code == 201
    written = client.get("/v1/recommendations").json
    with app.app_context():
        db.session.remove()
    downgrade(empty_engine, "0004")
    assert "summary" not in {c["name"] for c in sa.inspect(empty_engine).get_columns("recommendations")}
    upgrade(empty_engine)
    backfilled = client.get("/v1/recommendations").json
    assert len(backfilled) == 2 and backfilled == written  # 0007 appends timing_source from each stored answer
    assert [r["timing_source"] for r in written] == ["default", "default"]
    assert isinstance(written[0]["concurrency"], float) and written[0]["created_at"].endswith("+00:00")
    with app.app_context():
        db.session.remove()
        db.engine.dispose()


def test_timing_source_is_backfilled_from_each_stored_answer(empty_engine, tmp_path):
    """0007 adds ``timing_source`` and appends it to each stored list entry, from the answer's provenance (here a
    measured profile's); its downgrade takes both away again, and the list is what it was before 0007."""
    from advisor import create_app
    from tests.conftest import example_scenario

    url = empty_engine.url.render_as_string(hide_password=False)
    app = create_app({"SQLALCHEMY_DATABASE_URI": url, "TESTING": True, "INSTANCE_PATH": str(tmp_path)})
    client = app.test_client()
    for version in ("0.24", None):
        assert client.post("/v1/recommendations", json=example_scenario(vllm_version=version)).status_code == 201
    written = client.get("/v1/recommendations").json
    assert [r["timing_source"] for r in written] == ["default", "profile:H100-SXM × vLLM 0.24"]
    with app.app_context():
        db.session.remove()
    downgrade(empty_engine, "0006")
    assert "timing_source" not in {c["name"] for c in sa.inspect(empty_engine).get_columns("recommendations")}
    with empty_engine.connect() as conn:
        summaries = conn.execute(sa.text("SELECT summary FROM recommendations ORDER BY id DESC")).scalars().all()
    assert [json.loads(text) for text in summaries] == [{k: v for k, v in r.items() if k not in ("id", "timing_source")}
                                                        for r in written]
    upgrade(empty_engine)
    assert client.get("/v1/recommendations").json == written
    with app.app_context():
        db.session.remove()
        db.engine.dispose()


def test_sqlite_instants_in_sqlite3s_format_are_rewritten(tmp_path):
    """0006: rows the driver-level INSERT stored as ``…+00:00`` (before its values went through the column types)
    are rewritten as UtcDateTime writes them, whole seconds included, and read back as the same instants."""
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'm.db'}")
    upgrade(engine, "0005")
    old = {"2026-12-01 10:00:00.123456+00:00": "2026-12-01 10:00:00.123456",
           "2026-12-01 10:00:01+00:00": "2026-12-01 10:00:01.000000",
           "2026-12-01 10:00:02.500000": "2026-12-01 10:00:02.500000"}  # already the type's format
    with engine.begin() as conn:
        for i, text in enumerate(old, start=1):
            conn.execute(sa.text("INSERT INTO workloads (id, fingerprint, scenario, created_at) "
                                 "VALUES (:i, :f, '{}', :t)"), {"i": i, "f": f"fp{i}", "t": text})
    upgrade(engine)
    with engine.connect() as conn:
        stored = [row[0] for row in conn.execute(sa.text("SELECT created_at FROM workloads ORDER BY id"))]
    assert stored == list(old.values())
    engine.dispose()


def test_context_windows_are_backfilled_for_the_shipped_models(empty_engine):
    """0008 adds ``max_position_embeddings`` and gives the shipped models the database already holds the shipped
    catalog's window (a row the catalog does not know stays null); the downgrade takes the column away."""
    from advisor.storage import catalog_items

    upgrade(empty_engine, "0007")
    shipped = {m["name"]: m for m in catalog_items("models")}
    columns = [c["name"] for c in sa.inspect(empty_engine).get_columns("models") if c["name"] != "id"]
    rows = [{c: m.get(c) for c in columns} for m in shipped.values()]
    rows.append({**rows[0], "name": "my-own-model"})
    with empty_engine.begin() as conn:
        conn.execute(sa.table("models", *map(sa.column, columns)).insert(), [
            {**r, "created_at": "2026-12-01 00:00:00", "updated_at": "2026-12-01 00:00:00"} for r in rows])
    upgrade(empty_engine)
    with empty_engine.connect() as conn:
        got = dict(conn.execute(sa.text("SELECT name, max_position_embeddings FROM models")).all())
    assert got == {**{n: m.get("max_position_embeddings") for n, m in shipped.items()}, "my-own-model": None}
    assert got["llama-3.1-8b-instruct"] == 131_072 and got["vicuna-7b-v1.3"] == 2048
    downgrade(empty_engine, "0007")
    assert "max_position_embeddings" not in {c["name"] for c in sa.inspect(empty_engine).get_columns("models")}
