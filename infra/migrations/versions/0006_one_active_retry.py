"""at most one active retry of a failed task

A retry asked twice (a double-click on the console's Retry, an operator's command
run again) made two tasks doing the same work. With this index the store holds at
most one active task per `retry_of`, so a second retry answers the first one's
task, also when two come at the same instant on PostgreSQL.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

_ACTIVE = "status IN ('queued', 'loading', 'running', 'cancelling')"


def upgrade() -> None:
    op.create_index('ux_tasks_retry', 'tasks', ['retry_of'], unique=True,
                    postgresql_where=sa.text(f"retry_of IS NOT NULL AND {_ACTIVE}"),
                    sqlite_where=sa.text(f"retry_of IS NOT NULL AND {_ACTIVE}"))


def downgrade() -> None:
    op.drop_index('ux_tasks_retry', table_name='tasks')
