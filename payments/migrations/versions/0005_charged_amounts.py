"""What a paid call was charged: paywire_payments.charged_atomic.

- paywire_payments.charged_atomic (BIGINT, NULL): the atomic amount the call was charged, when it
  differs from what the payment authorized (`amount_atomic`): an `upto` payment settles what the
  call used (written with the settlement intent, before anything is broadcast: it is the amount
  that moves); an `exact` payment on Solana pays the whole amount and is owed the difference back
  (payments/refunds.py). NULL: the whole `amount_atomic` was charged (every row before this
  revision). Written once: a value is never changed.

The types are spelled out here rather than imported from payments.ledger_schema: a revision is
a snapshot and must not change when the schema module does.

Revision ID: 0005_charged_amounts
Revises: 0004_free_reruns
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_charged_amounts"
down_revision = "0004_free_reruns"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("paywire_payments", sa.Column("charged_atomic", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("paywire_payments") as batch:
        batch.drop_column("charged_atomic")
