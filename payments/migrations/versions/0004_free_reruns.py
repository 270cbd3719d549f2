"""Free re-runs counted: paywire_payments.reruns.

- paywire_payments.reruns (INTEGER NOT NULL, default 0): how many free re-runs a settled payment
  whose result did not reach its payer has taken; `Ledger.take_redelivery` takes one only below
  the policy's bound (SettlementPolicy.free_reruns). Existing rows start at 0.

The types are spelled out here rather than imported from payments.ledger_schema: a revision is
a snapshot and must not change when the schema module does.

Revision ID: 0004_free_reruns
Revises: 0003_operator_controls
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_free_reruns"
down_revision = "0003_operator_controls"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # (a NOT NULL column with a default is added in place on both databases: no table copy)
    op.add_column("paywire_payments", sa.Column("reruns", sa.Integer(), nullable=False,
                                                server_default=sa.text("0")))


def downgrade() -> None:
    with op.batch_alter_table("paywire_payments") as batch:
        batch.drop_column("reruns")
