"""Operator controls: skill switches, the payer deny list, their change counter; an index on
paywire_payments.created_at.

- paywire_skill_switches (skill_id PK, enabled, reason, changed_by, changed_at): a skill the
  operator switched off answers 503 before any quote, on every replica.
- paywire_denied_payers (payer PK as the ledger keys it, reason, created_at): payments from
  these payers are refused (403) before any facilitator is asked.
- paywire_controls_version (one row, id 1): bumped with every change to the two tables, so each
  replica's periodic check is one tiny query (payments/controls.py).
- ix_payments_created on paywire_payments(created_at): reports by period.

The types are spelled out here rather than imported from payments.ledger_schema: a revision is
a snapshot and must not change when the schema module does.

Revision ID: 0003_operator_controls
Revises: 0002_settlement_states
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_operator_controls"
down_revision = "0002_settlement_states"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "paywire_skill_switches",
        sa.Column("skill_id", sa.String(200), primary_key=True),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text()),
        sa.Column("changed_by", sa.String(200), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "paywire_denied_payers",
        sa.Column("payer", sa.String(128), primary_key=True),
        sa.Column("reason", sa.Text()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "paywire_controls_version",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_payments_created", "paywire_payments", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_payments_created", "paywire_payments")
    op.drop_table("paywire_controls_version")
    op.drop_table("paywire_denied_payers")
    op.drop_table("paywire_skill_switches")
