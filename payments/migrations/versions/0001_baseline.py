"""Baseline: paywire_payments exactly as paywire created it before migrations (`create_all`).

A database that has this table and no version table is at this revision: `paywire db upgrade`
stamps it, then upgrades it.

Revision ID: 0001_baseline
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_baseline"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "paywire_payments",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("network", sa.String(64), nullable=False),
        sa.Column("payer", sa.String(128), nullable=False),
        sa.Column("nonce", sa.String(130), nullable=False),
        sa.Column("amount_atomic", sa.BigInteger(), nullable=False),
        sa.Column("asset", sa.String(128), nullable=False),
        sa.Column("pay_to", sa.String(128), nullable=False),
        sa.Column("skill_id", sa.String(200), nullable=False),
        sa.Column("request_digest", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("tx_hash", sa.String(130)),
        sa.Column("error", sa.Text()),
        sa.Column("usage", sa.JSON()),
        sa.Column("upstream_cost_usd", sa.String(32)),  # exact decimal text
        sa.Column("latency_ms", sa.Integer()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("network", "payer", "nonce", name="uq_payment_once"),
    )


def downgrade() -> None:
    op.drop_table("paywire_payments")
