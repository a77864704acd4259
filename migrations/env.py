"""Alembic environment: the URL comes from the caller (``advisor.storage.migrate``) or DATABASE_URL."""
from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine, pool

from advisor.config import _normalise_db_url
from advisor.extensions import db
from advisor import models  # noqa: F401  (registers the tables on the metadata)

config = context.config
target_metadata = db.metadata


def _url() -> str:
    return config.get_main_option("sqlalchemy.url") or _normalise_db_url(os.environ["DATABASE_URL"])


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as conn:
        _run(conn)


def _run(connection) -> None:  # noqa: ANN001
    # render_as_batch: SQLite cannot ALTER most things; batch mode copies tables instead.
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
