"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-30 04:46:01.544251
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('clients',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('scopes', sa.Text(), nullable=False),
    sa.Column('created_at', sa.BigInteger(), nullable=False),
    sa.Column('revoked_at', sa.BigInteger(), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('token_hash')
    )
    op.create_table('idempotency_keys',
    sa.Column('client_id', sa.String(length=40), nullable=False),
    sa.Column('key', sa.String(length=255), nullable=False),
    sa.Column('request_digest', sa.String(length=64), nullable=False),
    sa.Column('status_code', sa.Integer(), nullable=False),
    sa.Column('body', sa.Text(), nullable=False),
    sa.Column('task_id', sa.String(length=40), nullable=False),
    sa.Column('created_at', sa.BigInteger(), nullable=False),
    sa.Column('expires_at', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('client_id', 'key')
    )
    with op.batch_alter_table('idempotency_keys', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_idempotency_keys_expires_at'), ['expires_at'], unique=False)

    op.create_table('models',
    sa.Column('id', sa.String(length=200), nullable=False),
    sa.Column('engine', sa.String(length=64), nullable=False),
    sa.Column('path', sa.Text(), nullable=False),
    sa.Column('size_bytes', sa.BigInteger(), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.BigInteger(), nullable=False),
    sa.Column('metadata', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('pairing_codes',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('secret_hash', sa.String(length=64), nullable=False),
    sa.Column('scopes', sa.Text(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=True),
    sa.Column('created_at', sa.BigInteger(), nullable=False),
    sa.Column('expires_at', sa.BigInteger(), nullable=False),
    sa.Column('failures', sa.Integer(), server_default='0', nullable=False),
    sa.Column('used_at', sa.BigInteger(), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('pairing_codes', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_pairing_codes_expires_at'), ['expires_at'], unique=False)

    op.create_table('responses',
    sa.Column('task_id', sa.String(length=40), nullable=False),
    sa.Column('output_text', sa.Text(), server_default='', nullable=False),
    sa.Column('input_tokens', sa.Integer(), server_default='0', nullable=False),
    sa.Column('output_tokens', sa.Integer(), server_default='0', nullable=False),
    sa.Column('updated_at', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('task_id')
    )
    op.create_table('schedule_slots',
    sa.Column('schedule_id', sa.String(length=40), nullable=False),
    sa.Column('slot_at', sa.BigInteger(), autoincrement=False, nullable=False),
    sa.Column('task_id', sa.String(length=40), nullable=False),
    sa.Column('created_at', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('schedule_id', 'slot_at')
    )
    op.create_table('schedules',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('client_id', sa.String(length=40), nullable=False),
    sa.Column('cron', sa.String(length=200), nullable=False),
    sa.Column('request', sa.Text(), nullable=False),
    sa.Column('catch_up', sa.Integer(), nullable=False),
    sa.Column('checkpoint', sa.BigInteger(), nullable=False),
    sa.Column('next_slot_at', sa.BigInteger(), nullable=False),
    sa.Column('created_at', sa.BigInteger(), nullable=False),
    sa.Column('updated_at', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('schedules', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_schedules_client_id'), ['client_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_schedules_next_slot_at'), ['next_slot_at'], unique=False)

    op.create_table('service_config',
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('value', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('key')
    )
    op.create_table('task_events',
    sa.Column('task_id', sa.String(length=40), nullable=False),
    sa.Column('seq', sa.Integer(), autoincrement=False, nullable=False),
    sa.Column('type', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.BigInteger(), nullable=False),
    sa.Column('data', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('task_id', 'seq')
    )
    op.create_table('tasks',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('client_id', sa.String(length=40), nullable=False),
    sa.Column('model', sa.String(length=200), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('on_restart', sa.String(length=8), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('max_attempts', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.BigInteger(), nullable=False),
    sa.Column('updated_at', sa.BigInteger(), nullable=False),
    sa.Column('run_at', sa.BigInteger(), nullable=False),
    sa.Column('started_at', sa.BigInteger(), nullable=True),
    sa.Column('finished_at', sa.BigInteger(), nullable=True),
    sa.Column('owner_token', sa.String(length=40), nullable=True),
    sa.Column('lease_expires_at', sa.BigInteger(), nullable=True),
    sa.Column('node_id', sa.String(length=200), nullable=True),
    sa.Column('last_seq', sa.Integer(), nullable=False),
    sa.Column('dedupe_key', sa.String(length=255), nullable=True),
    sa.Column('error_code', sa.String(length=64), nullable=True),
    sa.Column('error_message', sa.String(length=500), nullable=True),
    sa.Column('dead_lettered', sa.Integer(), server_default='0', nullable=False),
    sa.Column('metadata', sa.Text(), nullable=False),
    sa.Column('request', sa.Text(), nullable=False),
    sa.Column('snapshot', sa.Text(), nullable=True),
    sa.Column('schedule_id', sa.String(length=40), nullable=True),
    sa.Column('retry_of', sa.String(length=40), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.create_index('ix_tasks_client', ['client_id', 'id'], unique=False)
        batch_op.create_index('ix_tasks_dead', ['id'], unique=False, sqlite_where=sa.text('dead_lettered = 1'), postgresql_where=sa.text('dead_lettered = 1'))
        batch_op.create_index('ix_tasks_due', ['run_at', 'id'], unique=False, sqlite_where=sa.text("status = 'queued'"), postgresql_where=sa.text("status = 'queued'"))
        batch_op.create_index('ix_tasks_finished', ['finished_at'], unique=False, sqlite_where=sa.text("status IN ('completed', 'failed', 'cancelled')"), postgresql_where=sa.text("status IN ('completed', 'failed', 'cancelled')"))
        batch_op.create_index('ix_tasks_leases', ['lease_expires_at'], unique=False, sqlite_where=sa.text("status IN ('loading', 'running', 'cancelling')"), postgresql_where=sa.text("status IN ('loading', 'running', 'cancelling')"))
        batch_op.create_index('ix_tasks_node', ['node_id'], unique=False, sqlite_where=sa.text("status IN ('queued', 'loading', 'running', 'cancelling')"), postgresql_where=sa.text("status IN ('queued', 'loading', 'running', 'cancelling')"))
        batch_op.create_index('ux_tasks_dedupe', ['client_id', 'dedupe_key'], unique=True, sqlite_where=sa.text("dedupe_key IS NOT NULL AND status IN ('queued', 'loading', 'running', 'cancelling')"), postgresql_where=sa.text("dedupe_key IS NOT NULL AND status IN ('queued', 'loading', 'running', 'cancelling')"))



def downgrade() -> None:
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.drop_index('ux_tasks_dedupe', sqlite_where=sa.text("dedupe_key IS NOT NULL AND status IN ('queued', 'loading', 'running', 'cancelling')"), postgresql_where=sa.text("dedupe_key IS NOT NULL AND status IN ('queued', 'loading', 'running', 'cancelling')"))
        batch_op.drop_index('ix_tasks_node', sqlite_where=sa.text("status IN ('queued', 'loading', 'running', 'cancelling')"), postgresql_where=sa.text("status IN ('queued', 'loading', 'running', 'cancelling')"))
        batch_op.drop_index('ix_tasks_leases', sqlite_where=sa.text("status IN ('loading', 'running', 'cancelling')"), postgresql_where=sa.text("status IN ('loading', 'running', 'cancelling')"))
        batch_op.drop_index('ix_tasks_finished', sqlite_where=sa.text("status IN ('completed', 'failed', 'cancelled')"), postgresql_where=sa.text("status IN ('completed', 'failed', 'cancelled')"))
        batch_op.drop_index('ix_tasks_due', sqlite_where=sa.text("status = 'queued'"), postgresql_where=sa.text("status = 'queued'"))
        batch_op.drop_index('ix_tasks_dead', sqlite_where=sa.text('dead_lettered = 1'), postgresql_where=sa.text('dead_lettered = 1'))
        batch_op.drop_index('ix_tasks_client')

    op.drop_table('tasks')
    op.drop_table('task_events')
    op.drop_table('service_config')
    with op.batch_alter_table('schedules', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_schedules_next_slot_at'))
        batch_op.drop_index(batch_op.f('ix_schedules_client_id'))

    op.drop_table('schedules')
    op.drop_table('schedule_slots')
    op.drop_table('responses')
    with op.batch_alter_table('pairing_codes', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_pairing_codes_expires_at'))

    op.drop_table('pairing_codes')
    op.drop_table('models')
    with op.batch_alter_table('idempotency_keys', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_idempotency_keys_expires_at'))

    op.drop_table('idempotency_keys')
    op.drop_table('clients')
