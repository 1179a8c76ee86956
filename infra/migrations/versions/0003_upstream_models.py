"""upstream model entries

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 08:10:00

A model entry may name inference servers instead of a file: `path`, `size_bytes` and
`sha256` become optional, `upstream` holds the servers (JSON) and `max_concurrency` the
fleet-wide bound the claim checks, served by a partial index over leased tasks. Two
small tables keep what /metrics shows of the upstreams (errors by code, cool-downs).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None

_LEASED = "status IN ('loading', 'running', 'cancelling')"


def upgrade() -> None:
    with op.batch_alter_table('models', schema=None) as batch_op:
        batch_op.alter_column('path', existing_type=sa.Text(), nullable=True)
        batch_op.alter_column('size_bytes', existing_type=sa.BigInteger(), nullable=True)
        batch_op.alter_column('sha256', existing_type=sa.String(length=64), nullable=True)
        batch_op.add_column(sa.Column('upstream', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('max_concurrency', sa.Integer(), nullable=True))
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.create_index('ix_tasks_model_leased', ['model', 'lease_expires_at'],
                              unique=False, sqlite_where=sa.text(_LEASED),
                              postgresql_where=sa.text(_LEASED))
    op.create_table('upstream_errors',
    sa.Column('model_id', sa.String(length=200), nullable=False),
    sa.Column('code', sa.String(length=64), nullable=False),
    sa.Column('count', sa.BigInteger(), nullable=False),
    sa.Column('last_at', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('model_id', 'code')
    )
    op.create_table('upstream_cooldowns',
    sa.Column('model_id', sa.String(length=200), nullable=False),
    sa.Column('base_url', sa.String(length=2048), nullable=False),
    sa.Column('until', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('model_id', 'base_url')
    )


def downgrade() -> None:
    op.drop_table('upstream_cooldowns')
    op.drop_table('upstream_errors')
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.drop_index('ix_tasks_model_leased')
    op.execute("DELETE FROM models WHERE upstream IS NOT NULL")
    with op.batch_alter_table('models', schema=None) as batch_op:
        batch_op.drop_column('max_concurrency')
        batch_op.drop_column('upstream')
        batch_op.alter_column('sha256', existing_type=sa.String(length=64), nullable=False)
        batch_op.alter_column('size_bytes', existing_type=sa.BigInteger(), nullable=False)
        batch_op.alter_column('path', existing_type=sa.Text(), nullable=False)
