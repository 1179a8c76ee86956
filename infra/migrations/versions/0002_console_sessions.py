"""console sessions, and a covering index for the count of live tasks by state

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 08:10:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('console_sessions',
    sa.Column('secret_hash', sa.String(length=64), nullable=False),
    sa.Column('client_id', sa.String(length=40), nullable=False),
    sa.Column('created_at', sa.BigInteger(), nullable=False),
    sa.Column('expires_at', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('secret_hash')
    )
    with op.batch_alter_table('console_sessions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_console_sessions_expires_at'), ['expires_at'], unique=False)
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.create_index('ix_tasks_active_status', ['status'], unique=False, sqlite_where=sa.text("status IN ('queued', 'loading', 'running', 'cancelling')"), postgresql_where=sa.text("status IN ('queued', 'loading', 'running', 'cancelling')"))


def downgrade() -> None:
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.drop_index('ix_tasks_active_status')
    with op.batch_alter_table('console_sessions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_console_sessions_expires_at'))
    op.drop_table('console_sessions')
