"""the waiting tasks of each client, for a fair placing into the line

A claim places the waiting tasks that have become due (a future `run_at`, a retry's
backoff, a requeue) into the fair line. Taken in `run_at` order across all clients, one
client's thousands of earlier-due tasks were all placed before another client's one
task, a delay that grew with that backlog; taken per client, round-robin
(`core.store.line`), each client's earliest waiting tasks are found by this index.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

_OUTSIDE_LINE = "status = 'queued' AND vtime IS NULL"


def upgrade() -> None:
    op.create_index('ix_tasks_client_outside_line', 'tasks', ['client_id', 'run_at', 'id'],
                    postgresql_where=sa.text(_OUTSIDE_LINE), sqlite_where=sa.text(_OUTSIDE_LINE))


def downgrade() -> None:
    op.drop_index('ix_tasks_client_outside_line', table_name='tasks')
