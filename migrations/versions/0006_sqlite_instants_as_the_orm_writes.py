"""SQLite: instants the driver-level INSERT stored in sqlite3's own format, rewritten as UtcDateTime writes them

From 0002 on, a POST's INSERT ran on the driver without SQLAlchemy's bind processors, so SQLite stored
``2026-12-02 03:04:35.944328+00:00`` (or ``…:35+00:00`` on a whole second) where the column type writes
``2026-12-02 03:04:35.944328``. Text comparison put a whole-second row before its own instant, outside
``created_after``. Every such value is UTC (the service binds aware UTC instants), so dropping the offset and
padding the microseconds keeps the instant. PostgreSQL stores timestamptz and is not touched.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 03:40:00
"""
from __future__ import annotations

from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

TABLES = ('recommendations', 'workloads')


def upgrade() -> None:
    if op.get_bind().dialect.name != 'sqlite':
        return
    for table in TABLES:
        op.execute(f"UPDATE {table} SET created_at = substr(created_at, 1, 26) "
                   "WHERE created_at LIKE '%+00:00' AND length(created_at) = 32")
        op.execute(f"UPDATE {table} SET created_at = substr(created_at, 1, 19) || '.000000' "
                   "WHERE created_at LIKE '%+00:00' AND length(created_at) = 25")


def downgrade() -> None:
    pass  # the same instants in the column type's own format; nothing to undo
