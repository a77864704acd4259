"""models.max_position_embeddings: a model's context window

vLLM serves no request longer than the model's context window, and by default sizes --max-model-len to it: a KV
cache that cannot hold one such request stops the engine at start. The cost model needs the window for both. The
shipped models the database already holds get the shipped catalog's value (others stay null: not checked).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06 13:20:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

# advisor/data/models.json as of this revision (each model's config.json)
SHIPPED = {"llama-3.1-8b-instruct": 131072, "llama-3.2-1b-instruct": 131072, "llama-3.2-3b-instruct": 131072,
           "llama-3-70b-instruct": 8192, "llama-3.3-70b-instruct": 131072, "qwen3-0.6b": 40960, "qwen3-1.7b": 40960,
           "qwen3-8b": 40960, "qwen3-32b": 40960, "smollm2-135m-instruct": 8192, "smollm2-360m-instruct": 8192,
           "smollm2-1.7b-instruct": 8192, "vicuna-7b-v1.3": 2048, "vicuna-68m": 2048}


def upgrade() -> None:
    with op.batch_alter_table('models', schema=None) as batch_op:
        batch_op.add_column(sa.Column('max_position_embeddings', sa.Integer(), nullable=True))
    table = sa.table('models', sa.column('name', sa.String()), sa.column('max_position_embeddings', sa.Integer()))
    op.get_bind().execute(table.update().where(table.c.name == sa.bindparam('model')).values(
        max_position_embeddings=sa.bindparam('window')), [{'model': k, 'window': v} for k, v in SHIPPED.items()])


def downgrade() -> None:
    with op.batch_alter_table('models', schema=None) as batch_op:
        batch_op.drop_column('max_position_embeddings')
