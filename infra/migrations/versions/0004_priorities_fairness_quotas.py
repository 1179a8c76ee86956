"""priorities, the fair line and client quotas

Tasks gain `priority` (0..9, lower first) and `vtime`, their place in the fair line
(`core.store.line`); tasks queued before this revision have no place yet and are placed
by the next claim. Clients and pairing codes gain quota columns (NULL: the settings' default).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

_IN_LINE = sa.text("status = 'queued' AND vtime IS NOT NULL")
_OUTSIDE_LINE = sa.text("status = 'queued' AND vtime IS NULL")
_ACTIVE = sa.text("status IN ('queued', 'loading', 'running', 'cancelling')")


def upgrade() -> None:
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.add_column(sa.Column('priority', sa.Integer(), server_default='5',
                                      nullable=False))
        batch_op.add_column(sa.Column('vtime', sa.BigInteger(), nullable=True))
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.create_index('ix_tasks_line', ['priority', 'vtime', 'id'], unique=False,
                              sqlite_where=_IN_LINE, postgresql_where=_IN_LINE)
        batch_op.create_index('ix_tasks_client_line', ['client_id', 'priority', 'vtime'],
                              unique=False, sqlite_where=_IN_LINE, postgresql_where=_IN_LINE)
        batch_op.create_index('ix_tasks_outside_line', ['run_at', 'id'], unique=False,
                              sqlite_where=_OUTSIDE_LINE, postgresql_where=_OUTSIDE_LINE)
        batch_op.create_index('ix_tasks_client_active', ['client_id'], unique=False,
                              sqlite_where=_ACTIVE, postgresql_where=_ACTIVE)
    with op.batch_alter_table('clients', schema=None) as batch_op:
        batch_op.add_column(sa.Column('max_active_tasks', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('requests_per_second', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('max_streams', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('limits_changed_at', sa.BigInteger(), nullable=True))
    with op.batch_alter_table('pairing_codes', schema=None) as batch_op:
        batch_op.add_column(sa.Column('max_active_tasks', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('requests_per_second', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('max_streams', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('pairing_codes', schema=None) as batch_op:
        for column in ('max_streams', 'requests_per_second', 'max_active_tasks'):
            batch_op.drop_column(column)
    with op.batch_alter_table('clients', schema=None) as batch_op:
        for column in ('limits_changed_at', 'max_streams', 'requests_per_second',
                       'max_active_tasks'):
            batch_op.drop_column(column)
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        for index in ('ix_tasks_client_active', 'ix_tasks_outside_line',
                      'ix_tasks_client_line', 'ix_tasks_line'):
            batch_op.drop_index(index)
        batch_op.drop_column('vtime')
        batch_op.drop_column('priority')
