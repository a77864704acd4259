"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-30 06:38:40.167418
"""
from alembic import op
import sqlalchemy as sa


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('api_tokens',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('prefix', sa.String(length=12), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('revoked', sa.Boolean(), nullable=False),
    sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_tokens')),
    sa.UniqueConstraint('token_hash', name=op.f('uq_api_tokens_token_hash'))
    )
    with op.batch_alter_table('api_tokens', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_api_tokens_created_at'), ['created_at'], unique=False)

    op.create_table('calibration_runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('hardware', sa.String(length=96), nullable=False),
    sa.Column('target_model', sa.String(length=96), nullable=False),
    sa.Column('method', sa.String(length=32), nullable=False),
    sa.Column('draft_model', sa.String(length=96), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('progress', sa.Double(), nullable=False),
    sa.Column('message', sa.Text(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('queue', sa.String(length=128), nullable=True),
    sa.Column('job_id', sa.String(length=64), nullable=True),
    sa.Column('config', sa.JSON(), nullable=False),
    sa.Column('environment', sa.JSON(), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_calibration_runs'))
    )
    with op.batch_alter_table('calibration_runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_calibration_runs_created_at'), ['created_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_calibration_runs_hardware'), ['hardware'], unique=False)
        batch_op.create_index(batch_op.f('ix_calibration_runs_status'), ['status'], unique=False)

    op.create_table('gpus',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('vendor', sa.String(length=32), nullable=False),
    sa.Column('gpu_class', sa.String(length=32), nullable=False),
    sa.Column('memory_gb', sa.Double(), nullable=False),
    sa.Column('hbm_bandwidth_gb_per_s', sa.Double(), nullable=False),
    sa.Column('bf16_tflops', sa.Double(), nullable=False),
    sa.Column('fp8_tflops', sa.Double(), nullable=True),
    sa.Column('gpu_hour_usd', sa.Double(), nullable=False),
    sa.Column('gpu_hour_usd_date', sa.String(length=10), nullable=False),
    sa.Column('source', sa.Text(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_gpus')),
    sa.UniqueConstraint('name', name=op.f('uq_gpus_name'))
    )
    with op.batch_alter_table('gpus', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_gpus_created_at'), ['created_at'], unique=False)

    op.create_table('models',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=96), nullable=False),
    sa.Column('family', sa.String(length=64), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('num_layers', sa.Integer(), nullable=False),
    sa.Column('hidden_size', sa.Integer(), nullable=False),
    sa.Column('num_attention_heads', sa.Integer(), nullable=False),
    sa.Column('num_kv_heads', sa.Integer(), nullable=False),
    sa.Column('head_dim', sa.Integer(), nullable=False),
    sa.Column('intermediate_size', sa.Integer(), nullable=False),
    sa.Column('vocab_size', sa.Integer(), nullable=False),
    sa.Column('tie_word_embeddings', sa.Boolean(), nullable=False),
    sa.Column('num_experts', sa.Integer(), nullable=True),
    sa.Column('num_experts_per_token', sa.Integer(), nullable=True),
    sa.Column('param_count', sa.BigInteger(), nullable=False),
    sa.Column('tokenizer_family', sa.String(length=64), nullable=False),
    sa.Column('tokenizer_vocab_size', sa.Integer(), nullable=False),
    sa.Column('tokenizer_hash', sa.String(length=128), nullable=True),
    sa.Column('hf_repo', sa.String(length=200), nullable=True),
    sa.Column('source', sa.Text(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_models')),
    sa.UniqueConstraint('name', name=op.f('uq_models_name'))
    )
    with op.batch_alter_table('models', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_models_created_at'), ['created_at'], unique=False)

    op.create_table('workloads',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('fingerprint', sa.String(length=64), nullable=False),
    sa.Column('scenario', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_workloads')),
    sa.UniqueConstraint('fingerprint', name=op.f('uq_workloads_fingerprint'))
    )
    with op.batch_alter_table('workloads', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_workloads_created_at'), ['created_at'], unique=False)

    op.create_table('fitted_parameters',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('key', sa.String(length=200), nullable=False),
    sa.Column('params', sa.JSON(), nullable=False),
    sa.Column('residuals', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['calibration_runs.id'], name=op.f('fk_fitted_parameters_run_id_calibration_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_fitted_parameters'))
    )
    with op.batch_alter_table('fitted_parameters', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_fitted_parameters_created_at'), ['created_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_fitted_parameters_run_id'), ['run_id'], unique=False)

    op.create_table('probe_measurements',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('probe', sa.String(length=32), nullable=False),
    sa.Column('params', sa.JSON(), nullable=False),
    sa.Column('values', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['calibration_runs.id'], name=op.f('fk_probe_measurements_run_id_calibration_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_probe_measurements'))
    )
    with op.batch_alter_table('probe_measurements', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_probe_measurements_created_at'), ['created_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_probe_measurements_run_id'), ['run_id'], unique=False)

    op.create_table('recommendations',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('workload_id', sa.Integer(), nullable=False),
    sa.Column('gpu', sa.String(length=64), nullable=False),
    sa.Column('target_model', sa.String(length=96), nullable=False),
    sa.Column('method', sa.String(length=32), nullable=False),
    sa.Column('draft_model', sa.String(length=96), nullable=True),
    sa.Column('decision', sa.String(length=16), nullable=False),
    sa.Column('expected_speedup', sa.Double(), nullable=False),
    sa.Column('inputs', sa.JSON(), nullable=False),
    sa.Column('answer', sa.JSON(), nullable=False),
    sa.Column('cost_model_version', sa.String(length=16), nullable=False),
    sa.Column('calibration_run_id', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['calibration_run_id'], ['calibration_runs.id'], name=op.f('fk_recommendations_calibration_run_id_calibration_runs')),
    sa.ForeignKeyConstraint(['workload_id'], ['workloads.id'], name=op.f('fk_recommendations_workload_id_workloads')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_recommendations'))
    )
    with op.batch_alter_table('recommendations', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_recommendations_created_at'), ['created_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_recommendations_decision'), ['decision'], unique=False)
        batch_op.create_index(batch_op.f('ix_recommendations_gpu'), ['gpu'], unique=False)
        batch_op.create_index(batch_op.f('ix_recommendations_target_model'), ['target_model'], unique=False)
        batch_op.create_index(batch_op.f('ix_recommendations_workload_id'), ['workload_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('recommendations', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_recommendations_workload_id'))
        batch_op.drop_index(batch_op.f('ix_recommendations_target_model'))
        batch_op.drop_index(batch_op.f('ix_recommendations_gpu'))
        batch_op.drop_index(batch_op.f('ix_recommendations_decision'))
        batch_op.drop_index(batch_op.f('ix_recommendations_created_at'))

    op.drop_table('recommendations')
    with op.batch_alter_table('probe_measurements', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_probe_measurements_run_id'))
        batch_op.drop_index(batch_op.f('ix_probe_measurements_created_at'))

    op.drop_table('probe_measurements')
    with op.batch_alter_table('fitted_parameters', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_fitted_parameters_run_id'))
        batch_op.drop_index(batch_op.f('ix_fitted_parameters_created_at'))

    op.drop_table('fitted_parameters')
    with op.batch_alter_table('workloads', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_workloads_created_at'))

    op.drop_table('workloads')
    with op.batch_alter_table('models', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_models_created_at'))

    op.drop_table('models')
    with op.batch_alter_table('gpus', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_gpus_created_at'))

    op.drop_table('gpus')
    with op.batch_alter_table('calibration_runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_calibration_runs_status'))
        batch_op.drop_index(batch_op.f('ix_calibration_runs_hardware'))
        batch_op.drop_index(batch_op.f('ix_calibration_runs_created_at'))

    op.drop_table('calibration_runs')
    with op.batch_alter_table('api_tokens', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_api_tokens_created_at'))

    op.drop_table('api_tokens')
