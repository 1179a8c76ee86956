"""at most one active retry of a failed task

A retry asked twice (a double-click on the console's Retry, an operator's command
run again) made two tasks doing the same work. With this index the store holds at
most one active task per `retry_of`, so a second retry answers the first one's
task, also when two come at the same instant on PostgreSQL.

A store that an older version let retry one task twice holds two active tasks with
the same `retry_of`, and the unique index could not be built over them: the upgrade
failed, and the store stayed at 0005 for good. So the later ones are unlinked first:
of each such group the oldest (by `created_at`, then `id`) keeps `retry_of`, the others
get NULL and stay the ordinary tasks they are, to run or finish as they would have.
Nothing else about them changes; only a retry asked of the failed task from now on
answers the oldest instead of one of them.

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

_ACTIVE_STATUSES = "('queued', 'loading', 'running', 'cancelling')"
_ACTIVE = f"status IN {_ACTIVE_STATUSES}"

# An active retry with an older active sibling (same `retry_of`) loses its link.
_UNLINK_LATER_RETRIES = f"""
UPDATE tasks SET retry_of = NULL
WHERE retry_of IS NOT NULL AND {_ACTIVE}
  AND EXISTS (
    SELECT 1 FROM tasks AS older
    WHERE older.retry_of = tasks.retry_of
      AND older.status IN {_ACTIVE_STATUSES}
      AND (older.created_at < tasks.created_at
           OR (older.created_at = tasks.created_at AND older.id < tasks.id)))
"""


def upgrade() -> None:
    op.execute(sa.text(_UNLINK_LATER_RETRIES))
    op.create_index('ux_tasks_retry', 'tasks', ['retry_of'], unique=True,
                    postgresql_where=sa.text(f"retry_of IS NOT NULL AND {_ACTIVE}"),
                    sqlite_where=sa.text(f"retry_of IS NOT NULL AND {_ACTIVE}"))


def downgrade() -> None:
    op.drop_index('ux_tasks_retry', table_name='tasks')
