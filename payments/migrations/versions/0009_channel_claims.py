"""Channel claims: paywire_claims and paywire_claim_rows.

- paywire_claims: one row per transaction of the channel claimer (payments/channels/claimer.py):
  a claim of many channels' vouchers or a sweep of what was claimed to the receiver (kind
  'claim' | 'settle'), written as an intent before it is broadcast; its state (settling, pending,
  settled, released), the replica working on it and its lease, the transaction, the amount it
  moves, the last error; indexes (state, lease_until) and (network, kind, created_at). Its gas is
  in paywire_chain_fees (kind claim / sweep), not here.
- paywire_claim_rows: the channels a claim covers (primary key (claim_id, channel_id)): the
  running total it claims each up to and the ceiling of the voucher it uses; index (channel_id).

The types are spelled out here rather than imported from payments.ledger_schema: a revision is
a snapshot and must not change when the schema module does.

Revision ID: 0009_channel_claims
Revises: 0008_chain_fees
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_channel_claims"
down_revision = "0008_chain_fees"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "paywire_claims",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("network", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("owner", sa.String(64)),
        sa.Column("lease_until", sa.DateTime(timezone=True)),
        sa.Column("tx_hash", sa.String(130)),
        sa.Column("amount_atomic", sa.BigInteger(), nullable=False),
        sa.Column("error", sa.Text()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_claims_open", "paywire_claims", ["state", "lease_until"])
    op.create_index("ix_claims_kind", "paywire_claims", ["network", "kind", "created_at"])
    op.create_table(
        "paywire_claim_rows",
        sa.Column("claim_id", sa.String(36), primary_key=True),
        sa.Column("channel_id", sa.String(66), primary_key=True),
        sa.Column("claim_to_atomic", sa.BigInteger(), nullable=False),
        sa.Column("voucher_max_atomic", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["claim_id"], ["paywire_claims.id"], name="fk_claim_row_claim"),
        sa.ForeignKeyConstraint(["channel_id"], ["paywire_channels.channel_id"],
                                name="fk_claim_row_channel"),
    )
    op.create_index("ix_claim_rows_channel", "paywire_claim_rows", ["channel_id"])


def downgrade() -> None:
    """Lossy: the record of claims and sweeps goes (the chain keeps what they did)."""
    op.drop_index("ix_claim_rows_channel", "paywire_claim_rows")
    op.drop_table("paywire_claim_rows")
    op.drop_index("ix_claims_kind", "paywire_claims")
    op.drop_index("ix_claims_open", "paywire_claims")
    op.drop_table("paywire_claims")
