"""Settlement states: leases, the chain reference, kept results, the reconciler's events.

- paywire_payments: payment_id (unique: the x402 payment identifier), chain_ref, owner,
  lease_until, delivered_at, index (state, lease_until); upstream_cost_usd from decimal text to
  NUMERIC(32, 12) on PostgreSQL (cast in place, the text is parsed exactly; a value with more
  than 12 decimals is rounded there as any new write would be), still decimal text on SQLite
  (VARCHAR(48)).
- paywire_results, paywire_payment_events: new.
- Rows left `claimed` by an older paywire become `pending`: it may have crashed after
  broadcasting the settlement, so only the chain can say (the reconciler asks it). Each such
  change is written to paywire_payment_events.

The types are spelled out here rather than imported from payments.ledger_schema: a revision is
a snapshot and must not change when the schema module does.

Revision ID: 0002_settlement_states
Revises: 0001_baseline
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0002_settlement_states"
down_revision = "0001_baseline"
branch_labels = None
depends_on = None

ACTOR = "migration 0002_settlement_states"


def _exact_usd(dialect: str) -> sa.types.TypeEngine[object]:
    """ExactUsd's column type on this database (payments.ledger_schema.ExactUsd)."""
    return sa.String(48) if dialect == "sqlite" else sa.Numeric(32, 12)  # type: ignore[return-value]


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    with op.batch_alter_table("paywire_payments") as batch:
        batch.add_column(sa.Column("payment_id", sa.String(128)))
        batch.add_column(sa.Column("chain_ref", sa.JSON()))
        batch.add_column(sa.Column("owner", sa.String(64)))
        batch.add_column(sa.Column("lease_until", sa.DateTime(timezone=True)))
        batch.add_column(sa.Column("delivered_at", sa.DateTime(timezone=True)))
        batch.alter_column("upstream_cost_usd", existing_type=sa.String(32), type_=_exact_usd(dialect),
                           postgresql_using="upstream_cost_usd::numeric(32, 12)")
        batch.create_unique_constraint("uq_payment_identifier", ["payment_id"])
        batch.create_index("ix_payments_unfinished", ["state", "lease_until"])

    op.create_table(
        "paywire_results",
        sa.Column("payment_row", sa.String(36),
                  sa.ForeignKey("paywire_payments.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("media_type", sa.String(200), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_results_expires", "paywire_results", ["expires_at"])
    op.create_table(
        "paywire_payment_events",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("payment_row", sa.String(36),
                  sa.ForeignKey("paywire_payments.id", ondelete="CASCADE"), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(64), nullable=False),
        sa.Column("from_state", sa.String(16), nullable=False),
        sa.Column("to_state", sa.String(16), nullable=False),
        sa.Column("detail", sa.Text()),
    )
    op.create_index("ix_events_row", "paywire_payment_events", ["payment_row"])
    op.create_index("ix_events_at", "paywire_payment_events", ["at"])

    payments = sa.table("paywire_payments", sa.column("id", sa.String()), sa.column("state", sa.String()))
    events = sa.table("paywire_payment_events", sa.column("payment_row", sa.String()),
                      sa.column("at", sa.DateTime(timezone=True)), sa.column("actor", sa.String()),
                      sa.column("from_state", sa.String()), sa.column("to_state", sa.String()),
                      sa.column("detail", sa.Text()))
    claimed = payments.c.state == "claimed"
    op.execute(events.insert().from_select(
        ["payment_row", "at", "actor", "from_state", "to_state", "detail"],
        sa.select(payments.c.id, sa.literal(datetime.now(UTC), sa.DateTime(timezone=True)),
                  sa.literal(ACTOR), sa.literal("claimed"), sa.literal("pending"),
                  sa.literal("claimed under a paywire without settlement states: it may have "
                             "broadcast the settlement; the chain decides")).where(claimed)))
    op.execute(payments.update().where(claimed).values(state="pending"))


def downgrade() -> None:
    """Back to the baseline. Lossy: the new tables and columns go, and rows an older paywire
    cannot read (settling, pending) become `claimed`, which it leaves alone."""
    dialect = op.get_bind().dialect.name
    payments = sa.table("paywire_payments", sa.column("state", sa.String()))
    op.execute(payments.update().where(payments.c.state.in_(("settling", "pending")))
               .values(state="claimed"))
    op.drop_table("paywire_payment_events")
    op.drop_table("paywire_results")
    with op.batch_alter_table("paywire_payments") as batch:
        batch.drop_index("ix_payments_unfinished")
        batch.drop_constraint("uq_payment_identifier", type_="unique")
        batch.alter_column("upstream_cost_usd", existing_type=_exact_usd(dialect), type_=sa.String(32),
                           postgresql_using="upstream_cost_usd::text")
        for column in ("delivered_at", "lease_until", "owner", "chain_ref", "payment_id"):
            batch.drop_column(column)
