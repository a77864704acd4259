"""recommendation summary columns (lists never parse whole answers)

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 16:30:00
"""
from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None

# (column, type) in the order of the README's export columns
SUMMARY_COLUMNS = (
    ('gpu_count', sa.Integer()), ('structure', sa.String(length=16)), ('concurrency', sa.Double()),
    ('speedup_low', sa.Double()), ('speedup_high', sa.Double()), ('num_speculative_tokens', sa.Integer()),
    ('tpot_ms_baseline', sa.Double()), ('tpot_ms_speculative', sa.Double()),
    ('usd_per_million_output_tokens_baseline', sa.Double()),
    ('usd_per_million_output_tokens_speculative', sa.Double()),
)


def _loads(value: Any) -> dict[str, Any]:
    if isinstance(value, (str, bytes)):
        value = json.loads(value)
    return value if isinstance(value, dict) else {}


def _summary(inputs: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """The stored answer's list columns, as ``advisor.services.recommendations.summary_columns`` computed them
    when this revision was written (a migration must not follow later code)."""
    workload = inputs.get('workload') or {}
    speedup, tpot = answer.get('speedup') or {}, answer.get('tpot_ms') or {}
    usd = (answer.get('tco') or {}).get('usd_per_million_output_tokens') or {}
    concurrency = workload.get('concurrency')
    if concurrency is None:
        concurrency = (answer.get('concurrency') or {}).get('speculative')
    return {'gpu_count': inputs.get('gpu_count', 1), 'structure': workload.get('structure'),
            'concurrency': concurrency, 'speedup_low': speedup.get('low'), 'speedup_high': speedup.get('high'),
            'num_speculative_tokens': answer.get('num_speculative_tokens'),
            'tpot_ms_baseline': tpot.get('baseline'), 'tpot_ms_speculative': tpot.get('speculative'),
            'usd_per_million_output_tokens_baseline': usd.get('baseline'),
            'usd_per_million_output_tokens_speculative': usd.get('speculative')}


def upgrade() -> None:
    with op.batch_alter_table('recommendations', schema=None) as batch_op:
        for name, type_ in SUMMARY_COLUMNS:
            batch_op.add_column(sa.Column(name, type_, nullable=True))

    # backfill the answers stored before this revision
    table = sa.table('recommendations', sa.column('id', sa.Integer()), sa.column('inputs', sa.Text()),
                     sa.column('answer', sa.Text()), *(sa.column(name, type_) for name, type_ in SUMMARY_COLUMNS))
    conn = op.get_bind()
    rows = conn.execute(sa.select(table.c.id, sa.cast(table.c.inputs, sa.Text()),
                                  sa.cast(table.c.answer, sa.Text()))).all()
    for rec_id, inputs, answer in rows:
        conn.execute(table.update().where(table.c.id == rec_id).values(**_summary(_loads(inputs), _loads(answer))))


def downgrade() -> None:
    with op.batch_alter_table('recommendations', schema=None) as batch_op:
        for name, _ in reversed(SUMMARY_COLUMNS):
            batch_op.drop_column(name)
