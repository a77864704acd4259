"""recommendation timing_source: where an answer's timing came from (calibration run, measured profile, default)

A list and an export said which calibration run an answer used, but not whether a measured engine profile (a
scenario naming its vLLM version) timed it: ``calibration_run_id`` empty read as "catalog and priors" for both.
The column holds the answer's provenance of ``tpot_ms.baseline``, and each row's stored list entry (``summary``,
0005) gains it as its last field.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05 17:50:00
"""
from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def _rows(conn, table, batch_size: int = 1000):  # noqa: ANN001
    last = 0
    while True:
        rows = conn.execute(sa.select(table).where(table.c.id > last).order_by(table.c.id).limit(batch_size)
                            ).mappings().all()
        if not rows:
            return
        yield rows
        last = rows[-1]['id']


def upgrade() -> None:
    with op.batch_alter_table('recommendations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('timing_source', sa.String(length=160), nullable=True))
    # backfill from each stored answer, and append the field to its list entry as an INSERT now writes it
    table = sa.table('recommendations', sa.column('id', sa.Integer()), sa.column('answer', sa.JSON()),
                     sa.column('summary', sa.Text()), sa.column('timing_source', sa.String()))
    conn = op.get_bind()
    update = table.update().where(table.c.id == sa.bindparam('rid')).values(
        timing_source=sa.bindparam('source'), summary=sa.bindparam('text'))
    for rows in _rows(conn, table):
        params = []
        for row in rows:
            answer = row['answer'] if isinstance(row['answer'], dict) else json.loads(row['answer'] or '{}')
            source = (answer.get('provenance') or {}).get('tpot_ms.baseline')
            summary = {**json.loads(row['summary']), 'timing_source': source}
            params.append({'rid': row['id'], 'source': source, 'text': json.dumps(summary, allow_nan=False)})
        conn.execute(update, params)


def downgrade() -> None:
    table = sa.table('recommendations', sa.column('id', sa.Integer()), sa.column('summary', sa.Text()))
    conn = op.get_bind()
    update = table.update().where(table.c.id == sa.bindparam('rid')).values(summary=sa.bindparam('text'))
    for rows in _rows(conn, table):
        conn.execute(update, [{'rid': row['id'], 'text': json.dumps(
            {k: v for k, v in json.loads(row['summary']).items() if k != 'timing_source'}, allow_nan=False)}
            for row in rows])
    with op.batch_alter_table('recommendations', schema=None) as batch_op:
        batch_op.drop_column('timing_source')
