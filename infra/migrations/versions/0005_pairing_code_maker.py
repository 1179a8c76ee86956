"""pairing codes remember the client that made them

A code minted through `POST /v1/pairing-codes` no longer redeems once its maker is
revoked: a client about to be revoked could otherwise mint codes ahead and come back
within their lifetime. Codes made before this revision have no maker, like an
operator's.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('pairing_codes', schema=None) as batch_op:
        batch_op.add_column(sa.Column('created_by', sa.String(length=40), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('pairing_codes', schema=None) as batch_op:
        batch_op.drop_column('created_by')
