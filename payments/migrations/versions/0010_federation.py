"""Federation (issue 24): the marketplace resells other x402 sellers' resources.

- paywire_federation_sources: where resources are imported from (primary key: the source's id,
  derived from its URL): URL, kind (catalogue | seller), filters (JSON), margin (percent and a
  fixed USD amount, exact), origin (env | cli), and the last refresh (when, ok, detail, count).
- paywire_federated_resources: the imported resources as sold (primary key resource_id): the
  source they came from (indexed), the resource as JSON, its fingerprint, when it last changed.
- paywire_federation_version: one row, a counter bumped by every change of what is imported.
- paywire_outgoing_payments: what paywire pays upstream sellers, one intent per attempt of a
  caller's payment row, written before anything is signed: its payment identifier (unique), state
  (intent, signed, sent, paid, void, lost), the call (caller row, payer, request digest, resource),
  the seller and the option paid (network, asset, pay_to, amount atomic and USD), the signed
  payment and its chain reference, the transaction, the seller's answer once paid, the UTC day it
  counts on, its replica and lease; indexes (caller_row_id), (state, lease_until),
  (caller_payer, request_digest, resource_id), (seller, state).
- paywire_federation_spend: what the day's outgoing payments reserve against the caps, per
  (UTC day, seller), seller '*' standing for all sellers (exact USD).

USD amounts are exact: NUMERIC(32, 12) on PostgreSQL, decimal text on SQLite (ExactUsd). The
types are spelled out here rather than imported from payments.ledger_schema: a revision is a
snapshot and must not change when the schema module does.

Revision ID: 0010_federation
Revises: 0009_channel_claims
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_federation"
down_revision = "0009_channel_claims"
branch_labels = None
depends_on = None


def _exact_usd(dialect: str) -> sa.types.TypeEngine[object]:
    """ExactUsd's column type on this database (payments.ledger_schema.ExactUsd)."""
    return sa.String(48) if dialect == "sqlite" else sa.Numeric(32, 12)  # type: ignore[return-value]


def upgrade() -> None:
    usd = _exact_usd(op.get_bind().dialect.name)
    op.create_table(
        "paywire_federation_sources",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("filters", sa.JSON(), nullable=False),
        sa.Column("margin_percent", usd, nullable=False),
        sa.Column("margin_fixed_usd", usd, nullable=False),
        sa.Column("origin", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_refresh_at", sa.DateTime(timezone=True)),
        sa.Column("last_refresh_ok", sa.Boolean()),
        sa.Column("last_refresh_detail", sa.Text()),
        sa.Column("last_count", sa.Integer()),
    )
    op.create_table(
        "paywire_federated_resources",
        sa.Column("resource_id", sa.String(200), primary_key=True),
        sa.Column("source_id", sa.String(64), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_federated_resources_source", "paywire_federated_resources", ["source_id"])
    op.create_table(
        "paywire_federation_version",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "paywire_outgoing_payments",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("payment_identifier", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("caller_row_id", sa.String(36), nullable=False),
        sa.Column("caller_payer", sa.String(128), nullable=False),
        sa.Column("request_digest", sa.String(64), nullable=False),
        sa.Column("resource_id", sa.String(200), nullable=False),
        sa.Column("seller", sa.String(300), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("network", sa.String(64), nullable=False),
        sa.Column("asset", sa.String(128), nullable=False),
        sa.Column("pay_to", sa.String(128), nullable=False),
        sa.Column("amount_atomic", sa.BigInteger(), nullable=False),
        sa.Column("amount_usd", usd, nullable=False),
        sa.Column("payload", sa.Text()),
        sa.Column("chain_ref", sa.JSON()),
        sa.Column("valid_before", sa.DateTime(timezone=True)),
        sa.Column("tx_hash", sa.String(130)),
        sa.Column("answer_status", sa.Integer()),
        sa.Column("answer_media_type", sa.String(200)),
        sa.Column("answer_body", sa.LargeBinary()),
        sa.Column("error", sa.Text()),
        sa.Column("day", sa.String(10), nullable=False),
        sa.Column("owner", sa.String(64)),
        sa.Column("lease_until", sa.DateTime(timezone=True)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("payment_identifier", name="uq_outgoing_payment_identifier"),
    )
    op.create_index("ix_outgoing_caller", "paywire_outgoing_payments", ["caller_row_id"])
    op.create_index("ix_outgoing_open", "paywire_outgoing_payments", ["state", "lease_until"])
    op.create_index("ix_outgoing_request", "paywire_outgoing_payments",
                    ["caller_payer", "request_digest", "resource_id"])
    op.create_index("ix_outgoing_seller", "paywire_outgoing_payments", ["seller", "state"])
    op.create_table(
        "paywire_federation_spend",
        sa.Column("day", sa.String(10), primary_key=True),
        sa.Column("seller", sa.String(300), primary_key=True),
        sa.Column("reserved_usd", usd, nullable=False),
    )


def downgrade() -> None:
    """Lossy: the sources, the imported resources and the record of outgoing payments go (a
    payment still open then is resolved by no one: settle them before downgrading)."""
    op.drop_table("paywire_federation_spend")
    for index in ("ix_outgoing_seller", "ix_outgoing_request", "ix_outgoing_open",
                  "ix_outgoing_caller"):
        op.drop_index(index, "paywire_outgoing_payments")
    op.drop_table("paywire_outgoing_payments")
    op.drop_table("paywire_federation_version")
    op.drop_index("ix_federated_resources_source", "paywire_federated_resources")
    op.drop_table("paywire_federated_resources")
    op.drop_table("paywire_federation_sources")
