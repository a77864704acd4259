"""recommendation summary as stored JSON text, indexed with the id (a list page joins 100 stored texts)

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 03:10:00
"""
from __future__ import annotations

import datetime as dt
import json
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

# (list field, column, python type) in the order of the README's export columns, without the id
FIELDS = (
    ('created_at', 'created_at', None), ('gpu', 'gpu', str), ('gpu_count', 'gpu_count', int),
    ('target_model', 'target_model', str), ('method', 'method', str), ('draft_model', 'draft_model', str),
    ('structure', 'structure', str), ('concurrency', 'concurrency', float), ('decision', 'decision', str),
    ('speedup_expected', 'expected_speedup', float), ('speedup_low', 'speedup_low', float),
    ('speedup_high', 'speedup_high', float), ('num_speculative_tokens', 'num_speculative_tokens', int),
    ('tpot_ms_baseline', 'tpot_ms_baseline', float), ('tpot_ms_speculative', 'tpot_ms_speculative', float),
    ('usd_per_million_output_tokens_baseline', 'usd_per_million_output_tokens_baseline', float),
    ('usd_per_million_output_tokens_speculative', 'usd_per_million_output_tokens_speculative', float),
    ('calibration_run_id', 'calibration_run_id', int), ('cost_model_version', 'cost_model_version', str),
)


def _summary(row: Any) -> str:
    """A row's list entry without its id, as ``advisor.services.recommendations.summary_text`` wrote it when
    this revision was written (a migration must not follow later code)."""
    out = {}
    for name, column, kind in FIELDS:
        value = row[column]
        if column == 'created_at':
            utc = value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None else value.astimezone(dt.timezone.utc)
            value = utc.isoformat()
        elif value is not None:
            value = kind(value)
        out[name] = value
    return json.dumps(out, allow_nan=False)


def upgrade() -> None:
    with op.batch_alter_table('recommendations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('summary', sa.Text(), nullable=True))

    # backfill the rows stored before this revision, from their summary columns (0002)
    columns = [sa.column('id', sa.Integer()), sa.column('summary', sa.Text()),
               sa.column('created_at', sa.DateTime(timezone=True))]
    columns += [sa.column(column, sa.Double() if kind is float else sa.Integer() if kind is int else sa.Text())
                for _, column, kind in FIELDS if column != 'created_at']
    table = sa.table('recommendations', *columns)
    conn = op.get_bind()
    update = table.update().where(table.c.id == sa.bindparam('rid')).values(summary=sa.bindparam('text'))
    last = 0
    while True:
        batch = sa.select(table).where(table.c.id > last).order_by(table.c.id).limit(1000)
        rows = conn.execute(batch).mappings().all()
        if not rows:
            break
        conn.execute(update, [{'rid': row['id'], 'text': _summary(row)} for row in rows])
        last = rows[-1]['id']

    with op.batch_alter_table('recommendations', schema=None) as batch_op:
        batch_op.alter_column('summary', existing_type=sa.Text(), nullable=False)
        # a list page reads ids and summaries from the index alone (SQLite keeps summary after the answer)
        batch_op.create_index('ix_recommendations_id_summary', ['id', 'summary'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('recommendations', schema=None) as batch_op:
        batch_op.drop_index('ix_recommendations_id_summary')
        batch_op.drop_column('summary')
