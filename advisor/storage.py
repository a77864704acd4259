"""Schema and seed data: Alembic upgrades and the catalog loader."""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config as AlembicConfig
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


def upgrade(engine: Engine, revision: str = "head") -> None:
    with engine.begin() as connection:
        cfg = alembic_config(engine.url.render_as_string(hide_password=False))
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, revision)


def downgrade(engine: Engine, revision: str = "base") -> None:
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
    return added
