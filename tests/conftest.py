"""Shared fixtures: the service against SQLite and PostgreSQL (the real server on 127.0.0.1:5432)."""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

REPO = Path(__file__).resolve().parent.parent
# Probe runs started by the tests (RQ worker, benchmarks) inherit this: on a host busy all along, a calibration
# waits a minute for quiet in all, not the product's 300 s (calibration.contention.WAIT_BUDGET_S)
os.environ.setdefault("SPECADVISOR_CONTENTION_WAIT_S", "60")
POSTGRES_ADMIN_URL = os.environ.get("SPECADVISOR_TEST_POSTGRES",
                                    "postgresql+psycopg://postgres@127.0.0.1:5432/test")
BACKENDS = [b for b in os.environ.get("SPECADVISOR_TEST_BACKENDS", "sqlite,postgresql").split(",") if b]
EPHEMERAL_TABLES = ("plans", "metric_snapshots", "deployments", "recommendations", "workloads", "fitted_parameters",
                    "probe_measurements", "calibration_runs", "api_tokens")


def without_iteration_timing(records: list[dict]) -> list[dict]:
    """Probe records as written before 2026-12-05: without the cycles' ``engine_step_s`` and ``batch_occupancy``
    (calibration.probes.StepTiming), so the fit reads them per mean sequence's cycle. Records nest their values
    (``{"probe", "params", "values"}``) or carry them flat (the serving benchmark's ``records.jsonl``)."""
    def drop(values: dict) -> dict:
        return {k: v for k, v in values.items() if k not in ("engine_step_s", "batch_occupancy")}

    return [dict(r, values=drop(r["values"])) if isinstance(r.get("values"), dict) else drop(r) for r in records]


def example_scenario(**changes) -> dict:
    """The README's example scenario (issue 3's shape); keyword arguments replace top-level fields."""
    scenario = {
        "gpu": "H100-SXM", "gpu_count": 1, "target_model": "llama-3.1-8b-instruct", "weights_dtype": "bf16",
        "speculator": {"method": "eagle", "draft_model": "eagle-llama-3.1-8b", "num_speculative_tokens": 2},
        "workload": {"prompt_tokens": 512, "output_tokens": 256, "temperature": 0.0, "structure": "prose",
                     "concurrency": 8},
        "acceptance": {"mean_acceptance_length": 2.04}, "gpu_hour_usd": 3.0,
    }
    scenario.update(changes)
    return scenario


@pytest.fixture(scope="session")
def postgres_database():
    """A throwaway database on the PostgreSQL server, dropped at the end of the session."""
    name = f"specadvisor_test_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = sa.engine.make_url(POSTGRES_ADMIN_URL).set(database=name)
    yield url.render_as_string(hide_password=False)
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session", params=BACKENDS)
def database_url(request, tmp_path_factory):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'specadvisor.db'}"
    return request.getfixturevalue("postgres_database")


@pytest.fixture(scope="session")
def app(database_url, tmp_path_factory):
    from advisor import create_app

    app = create_app({"SQLALCHEMY_DATABASE_URI": database_url, "TESTING": True, "REDIS_URL": "",
                      "INSTANCE_PATH": str(tmp_path_factory.mktemp("instance"))})
    yield app
    with app.app_context():
        from advisor.extensions import db

        db.engine.dispose()


@pytest.fixture()
def client(app):
    yield app.test_client()
    _reset(app)


def _reset(app) -> None:
    from advisor.extensions import db
    from advisor.storage import catalog_items, seed_catalog

    with app.app_context():
        db.session.rollback()
        with db.engine.begin() as conn:
            for table in EPHEMERAL_TABLES:
                conn.execute(sa.text(f"DELETE FROM {table}"))
            for table, kind in (("gpus", "gpus"), ("models", "models")):
                shipped = [item["name"] for item in catalog_items(kind)]
                conn.execute(sa.text(f"DELETE FROM {table} WHERE name NOT IN :names")
                             .bindparams(sa.bindparam("names", expanding=True)), {"names": shipped})
        seed_catalog(overwrite=True)


@pytest.fixture()
def token(app, client):
    from advisor.auth import create_token

    with app.app_context():
        return create_token("tests")


@pytest.fixture()
def auth(token):
    return {"Authorization": f"Bearer {token}"}
