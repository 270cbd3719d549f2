"""Solana refunds: paywire_refunds, paywire_turns, paywire_payments.refund_id.

- paywire_refunds: one row per refund (one SPL transfer per payer per batch), written as an
  intent before it is broadcast: the signed transaction, its signature (unique), its blockhash and
  the blockhash's last valid height; its state (signed, sent, confirmed), lease and attempts.
- paywire_turns (name PK, owner, until): turns replicas take by lease (one refund batch at a
  time, once per period).
- paywire_payments.refund_id (NULL, foreign key to paywire_refunds.id): the refund that covers
  the payment, set once; index (refund_id, charged_atomic): a refund's rows, and what is owed.
  Existing rows are owed nothing refunded yet (NULL): what they are owed is derived from
  charged_atomic (payments/refunds.py).

The types are spelled out here rather than imported from payments.ledger_schema: a revision is
a snapshot and must not change when the schema module does.

Revision ID: 0006_refunds
Revises: 0005_charged_amounts
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_refunds"
down_revision = "0005_charged_amounts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "paywire_refunds",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("network", sa.String(64), nullable=False),
        sa.Column("payer", sa.String(128), nullable=False),
        sa.Column("asset", sa.String(128), nullable=False),
        sa.Column("pay_to", sa.String(128), nullable=False),
        sa.Column("amount_atomic", sa.BigInteger(), nullable=False),
        sa.Column("payments", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("signature", sa.String(128), nullable=False),
        sa.Column("blockhash", sa.String(64), nullable=False),
        sa.Column("last_valid_height", sa.BigInteger(), nullable=False),
        sa.Column("transaction", sa.Text(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("expired_signatures", sa.JSON()),
        sa.Column("owner", sa.String(64)),
        sa.Column("lease_until", sa.DateTime(timezone=True)),
        sa.Column("error", sa.Text()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("confirmed_at", sa.DateTime(timezone=True)),
        sa.UniqueConstraint("signature", name="uq_refund_signature"),
    )
    op.create_index("ix_refunds_state", "paywire_refunds", ["state", "lease_until"])
    op.create_index("ix_refunds_payer", "paywire_refunds", ["payer"])
    op.create_table(
        "paywire_turns",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("until", sa.DateTime(timezone=True), nullable=False),
    )
    # (SQLite cannot add a foreign key in place: the batch copies the table there)
    with op.batch_alter_table("paywire_payments") as batch:
        batch.add_column(sa.Column("refund_id", sa.String(36)))
        batch.create_foreign_key("fk_payment_refund", "paywire_refunds", ["refund_id"], ["id"])
        batch.create_index("ix_payments_refund", ["refund_id", "charged_atomic"])


def downgrade() -> None:
    """Lossy: which payments were refunded, and the refunds, go."""
    with op.batch_alter_table("paywire_payments") as batch:
        batch.drop_index("ix_payments_refund")
        batch.drop_constraint("fk_payment_refund", type_="foreignkey")
        batch.drop_column("refund_id")
    op.drop_table("paywire_turns")
    op.drop_index("ix_refunds_payer", "paywire_refunds")
    op.drop_index("ix_refunds_state", "paywire_refunds")
    op.drop_table("paywire_refunds")
