"""capacity plans (issue 12)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 16:35:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('plans',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('target_model', sa.String(length=96), nullable=False),
    sa.Column('feasible', sa.Boolean(), nullable=False),
    sa.Column('best_option', sa.String(length=160), nullable=True),
    sa.Column('inputs', sa.JSON(), nullable=False),
    sa.Column('answer', sa.JSON(), nullable=False),
    sa.Column('cost_model_version', sa.String(length=16), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_plans'))
    )
    with op.batch_alter_table('plans', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_plans_created_at'), ['created_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_plans_target_model'), ['target_model'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('plans', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_plans_target_model'))
        batch_op.drop_index(batch_op.f('ix_plans_created_at'))
    op.drop_table('plans')
