"""x402 batch-settlement channels: paywire_channels, paywire_payments.scheme and channel_id.

- paywire_channels: one row per channel (payments/channels/store.py): its config as signed, its
  state (open, closing, quarantined, closed), what delivered calls were charged (the running
  total), the latest voucher, the chain's mirror (balance, totalClaimed, withdrawal, refund nonce,
  when it was read), and the reservation (the payment row of the one call using it, its replica
  and lease); indexes (state, claim_due_at), (payer).
- paywire_payments.scheme (VARCHAR(24) NOT NULL, default 'exact'): the x402 scheme the payment
  matched; existing rows are exact payments.
- paywire_payments.channel_id (NULL): a channel call's channel; index (channel_id, state).

The types are spelled out here rather than imported from payments.ledger_schema: a revision is
a snapshot and must not change when the schema module does.

Revision ID: 0007_channels
Revises: 0006_refunds
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_channels"
down_revision = "0006_refunds"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "paywire_channels",
        sa.Column("channel_id", sa.String(66), primary_key=True),
        sa.Column("network", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("payer", sa.String(128), nullable=False),
        sa.Column("payer_authorizer", sa.String(128), nullable=False),
        sa.Column("receiver", sa.String(128), nullable=False),
        sa.Column("receiver_authorizer", sa.String(128), nullable=False),
        sa.Column("token", sa.String(128), nullable=False),
        sa.Column("withdraw_delay", sa.Integer(), nullable=False),
        sa.Column("salt", sa.String(66), nullable=False),
        sa.Column("charged_atomic", sa.BigInteger(), nullable=False),
        sa.Column("signed_max_atomic", sa.BigInteger()),
        sa.Column("signature", sa.Text()),
        sa.Column("balance_atomic", sa.BigInteger(), nullable=False),
        sa.Column("total_claimed_atomic", sa.BigInteger(), nullable=False),
        sa.Column("withdraw_requested_at", sa.BigInteger(), nullable=False),
        sa.Column("refund_nonce", sa.BigInteger(), nullable=False),
        sa.Column("onchain_synced_at", sa.DateTime(timezone=True)),
        sa.Column("pending_row", sa.String(36)),
        sa.Column("owner", sa.String(64)),
        sa.Column("lease_until", sa.DateTime(timezone=True)),
        sa.Column("claim_due_at", sa.DateTime(timezone=True)),
        sa.Column("last_request_at", sa.DateTime(timezone=True)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["pending_row"], ["paywire_payments.id"], name="fk_channel_pending_row"),
    )
    op.create_index("ix_channels_claim_due", "paywire_channels", ["state", "claim_due_at"])
    op.create_index("ix_channels_payer", "paywire_channels", ["payer"])
    # (NOT NULL with a default and a nullable column are added in place on both databases)
    op.add_column("paywire_payments", sa.Column("scheme", sa.String(24), nullable=False,
                                                server_default=sa.text("'exact'")))
    op.add_column("paywire_payments", sa.Column("channel_id", sa.String(66)))
    op.create_index("ix_payments_channel", "paywire_payments", ["channel_id", "state"])


def downgrade() -> None:
    """Lossy: the channels, and which payments were channel calls, go."""
    op.drop_index("ix_payments_channel", "paywire_payments")
    with op.batch_alter_table("paywire_payments") as batch:
        batch.drop_column("channel_id")
        batch.drop_column("scheme")
    op.drop_index("ix_channels_payer", "paywire_channels")
    op.drop_index("ix_channels_claim_due", "paywire_channels")
    op.drop_table("paywire_channels")
