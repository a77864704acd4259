"""Schema and seed data: Alembic upgrades and the catalog loader."""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import select
from sqlalchemy.engine import Engine

from .extensions import db
from .models import Gpu, Model



def migrations_dir() -> Path:
    """The Alembic scripts ship as the ``migrations`` package (repo checkout or installed wheel)."""
    import migrations

    return Path(migrations.__file__).resolve().parent


def alembic_config(url: str) -> AlembicConfig:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


class SchemaMismatch(RuntimeError):
    """The database's schema revision is not the one this code was written for."""


def schema_revisions(engine: Engine) -> tuple[str | None, str, set[str]]:
    """(the database's Alembic revision or None, this code's head, every revision this code knows)."""
    script = ScriptDirectory.from_config(alembic_config(engine.url.render_as_string(hide_password=False)))
    with engine.connect() as connection:
        current = MigrationContext.configure(connection).get_current_revision()
    return current, script.get_current_head(), {rev.revision for rev in script.walk_revisions()}


def check_schema(engine: Engine, allow_older: bool = False) -> None:
    """Refuse a database whose schema is newer than this code, or older unless it is about to be upgraded."""
    current, head, known = schema_revisions(engine)
    if current == head:
        return
    where = engine.url.render_as_string(hide_password=True)
    if current is not None and current not in known:
        raise SchemaMismatch(
            f"The database {where} has schema revision {current}, newer than this specadvisor (head {head}). "
            "Run the specadvisor version that migrated it, or point DATABASE_URL at another database.")
    if not allow_older:
        raise SchemaMismatch(
            f"The database {where} has schema revision {current or 'none (empty)'}; this specadvisor needs {head}. "
            "Run 'advisor migrate' (or start with SPECADVISOR_AUTO_MIGRATE=1).")


def upgrade(engine: Engine, revision: str = "head") -> None:
    check_schema(engine, allow_older=True)  # Alembic cannot upgrade from a revision it does not know
    with engine.begin() as connection:
        cfg = alembic_config(engine.url.render_as_string(hide_password=False))
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, revision)


def downgrade(engine: Engine, revision: str) -> None:
    with engine.begin() as connection:
        cfg = alembic_config(engine.url.render_as_string(hide_password=False))
        cfg.attributes["connection"] = connection
        command.downgrade(cfg, revision)


def catalog_items(kind: str) -> list[dict[str, Any]]:
    """The shipped catalog (``advisor/data/{gpus,models}.json``), each row with its ``source``."""
    text = resources.files("advisor").joinpath("data", f"{kind}.json").read_text(encoding="utf-8")
    return json.loads(text)["items"]


def seed_catalog(overwrite: bool = False) -> dict[str, int]:
    """Insert shipped GPUs and models that the DB lacks; with ``overwrite`` also reset edited rows."""
    added = {"gpus": 0, "models": 0}
    for kind, cls in (("gpus", Gpu), ("models", Model)):
        columns = set(cls.__table__.columns.keys())
        existing = {row.name: row for row in db.session.scalars(select(cls))}
        for item in catalog_items(kind):
            values = {k: v for k, v in item.items() if k in columns}
            row = existing.get(item["name"])
            if row is None:
                db.session.add(cls(**values))
                added[kind] += 1
            elif overwrite:
                for key, value in values.items():
                    setattr(row, key, value)
    db.session.commit()
    from .services import calibrations, catalog

    catalog.forget_snapshots()
    calibrations.forget_newest()
    return added
