"""Chain fees: paywire_chain_fees.

- paywire_chain_fees: one row per on-chain transaction paywire's payments cause (primary key
  (network, tx_id)): its kind (settlement, upto_settlement, refund, deposit, claim, sweep,
  channel_refund), what it is for (`ref`; a settlement's payment's `skill`), the day it counts on
  (`at`), its state (waiting,
  recorded, missing), and what the chain says once read: who paid the fee, gas used, the effective
  gas price, an OP-stack L1 fee, the fee in the native token's smallest unit (wei, lamports; exact:
  NUMERIC(78, 0) on PostgreSQL, decimal text on SQLite), the block or slot, success; the meter's
  attempts, next try and last error; indexes (state, next_try_at) and (at).
  Existing settled payments and confirmed refunds get their rows from the meter's scan
  (payments/chain_fees.py), not from this revision.

The types are spelled out here rather than imported from payments.ledger_schema: a revision is
a snapshot and must not change when the schema module does.

Revision ID: 0008_chain_fees
Revises: 0007_channels
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_chain_fees"
down_revision = "0007_channels"
branch_labels = None
depends_on = None


def _whole(dialect: str) -> sa.types.TypeEngine[object]:
    """An exact integer of any size: NUMERIC(78, 0), or decimal text where INTEGER is 64 bits."""
    return sa.String(80) if dialect == "sqlite" else sa.Numeric(78, 0)  # type: ignore[return-value]


def upgrade() -> None:
    whole = _whole(op.get_bind().dialect.name)
    op.create_table(
        "paywire_chain_fees",
        sa.Column("network", sa.String(64), primary_key=True),
        sa.Column("tx_id", sa.String(130), primary_key=True),
        sa.Column("kind", sa.String(24), nullable=False),
        sa.Column("ref", sa.String(66)),
        sa.Column("skill", sa.String(200)),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("paid_by", sa.String(128)),
        sa.Column("gas_used", sa.BigInteger()),
        sa.Column("gas_price", whole),
        sa.Column("l1_fee", whole),
        sa.Column("fee", whole),
        sa.Column("block_number", sa.BigInteger()),
        sa.Column("succeeded", sa.Boolean()),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("next_try_at", sa.DateTime(timezone=True)),
        sa.Column("error", sa.Text()),
        sa.Column("expected_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("observed_at", sa.DateTime(timezone=True)),
    )
    op.create_index("ix_chain_fees_due", "paywire_chain_fees", ["state", "next_try_at"])
    op.create_index("ix_chain_fees_at", "paywire_chain_fees", ["at"])


def downgrade() -> None:
    """Lossy: the fees read so far go (the meter reads them again after an upgrade)."""
    op.drop_index("ix_chain_fees_at", "paywire_chain_fees")
    op.drop_index("ix_chain_fees_due", "paywire_chain_fees")
    op.drop_table("paywire_chain_fees")
