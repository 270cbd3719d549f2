"""The ledger's tables: what is stored, one definition used by the ledger and the migrations.

The schema is owned by Alembic (`payments/migrations/`, `paywire db upgrade`); this module is
the head revision's shape, and `alembic check` in the tests keeps the two from drifting.

paywire_payments       one row per payment (unique on its on-chain identity, and on the x402
                       payment identifier when the payer sent one), its state and lease
paywire_results        a paid call's result, kept (bounded by settings) so a retry carrying the
                       same payment gets it instead of a second charge
paywire_payment_events what the reconciler did to a row (the hot path only logs its changes)
paywire_skill_switches the operator's skill switches (payments/controls.py): a skill switched off
                       answers 503 before any quote, on every replica
paywire_denied_payers  payers whose payments are refused (403) before any facilitator is asked
paywire_controls_version one row: a counter bumped by every change to the two tables above, so
                       replicas notice a change with one tiny query
paywire_refunds        Solana refunds (payments/refunds.py): one SPL transfer per payer per batch,
                       written as an intent (signed transaction, signature, blockhash) before it
                       is broadcast; the payments it covers point to it (paywire_payments.refund_id)
paywire_turns          named turns replicas take by lease (one replica runs a refund batch at a
                       time, and not again before the period ends)
"""

from __future__ import annotations

import enum
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Numeric,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

metadata = MetaData()

class ExactUsd(TypeDecorator[Decimal]):
    """Exact decimal USD: NUMERIC(32, 12) where the database has an exact numeric type
    (PostgreSQL); decimal text on SQLite, whose NUMERIC affinity would store a binary float."""

    impl = Numeric(32, 12, asdecimal=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(String(48))
        return dialect.type_descriptor(Numeric(32, 12, asdecimal=True))

    def process_bind_param(self, value: Decimal | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        exact = Decimal(value)
        return str(exact) if dialect.name == "sqlite" else exact

    def process_result_value(self, value: Any, dialect: Dialect) -> Decimal | None:
        return None if value is None else Decimal(str(value))


USD = ExactUsd()


class PaymentState(enum.StrEnum):
    """Where a payment is; the transitions are in docs/architecture.md ("Settlement states").

    claimed   reserved for one call; nothing was broadcast (a crash here is safe to release)
    settling  the settlement intent is written: something may be broadcast from now on
    pending   the settlement's outcome is not known (a timeout, a facilitator 5xx, a crash):
              the reconciler asks the chain
    settled   the money moved (the transaction is in `tx_hash`)
    released  nothing moved: the call did not deliver, or the chain says the payment can no
              longer move; the same signed payment may be claimed again
    failed    written by versions before the state machine only (terminal, kept for history)
    """

    CLAIMED = "claimed"
    SETTLING = "settling"
    PENDING = "pending"
    SETTLED = "settled"
    RELEASED = "released"
    FAILED = "failed"


UNFINISHED = (PaymentState.CLAIMED, PaymentState.SETTLING, PaymentState.PENDING)
MAY_HAVE_MOVED = (PaymentState.SETTLING, PaymentState.PENDING)

payments_table = Table(
    "paywire_payments",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("network", String(64), nullable=False),
    Column("payer", String(128), nullable=False),
    Column("nonce", String(130), nullable=False),
    Column("amount_atomic", BigInteger, nullable=False),
    Column("asset", String(128), nullable=False),
    Column("pay_to", String(128), nullable=False),
    Column("skill_id", String(200), nullable=False),
    Column("request_digest", String(64), nullable=False),
    Column("state", String(16), nullable=False),
    Column("tx_hash", String(130)),
    Column("error", Text),
    Column("usage", JSON),
    Column("upstream_cost_usd", USD),
    Column("latency_ms", Integer),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    # The x402 `payment-identifier` extension's id, when the payer sent one (idempotency key).
    Column("payment_id", String(128)),
    # What identifies the on-chain action, written with the intent before anything is broadcast:
    # {"kind": "eip3009", "token", "from", "to", "value", "valid_after", "valid_before", "nonce"}
    # or {"kind": "svm", "message_hash", "signature" (when known), "blockhash", "fee_payer"}.
    Column("chain_ref", JSON),
    # Which replica works on the row, and until when (renewed while it works; an expired lease
    # on an unfinished row is the reconciler's to take).
    Column("owner", String(64)),
    Column("lease_until", DateTime(timezone=True)),
    Column("delivered_at", DateTime(timezone=True)),
    # Free re-runs taken for a settled result that did not reach its payer (bounded by
    # SettlementPolicy.free_reruns: a payer whose client always leaves is not run for forever).
    Column("reruns", Integer, nullable=False, server_default=text("0")),
    # What the call was charged when less than `amount_atomic` (upto: what settled; exact on
    # Solana: what the payer keeps paying once the rest is refunded). NULL: all of it. Set once.
    Column("charged_atomic", BigInteger),
    # The refund that gives back what an exact payment on Solana paid above `charged_atomic`
    # (payments/refunds.py). Set once, by a compare-and-set on NULL: a payment is refunded once.
    Column("refund_id", String(36), ForeignKey("paywire_refunds.id", name="fk_payment_refund")),
    UniqueConstraint("network", "payer", "nonce", name="uq_payment_once"),
    UniqueConstraint("payment_id", name="uq_payment_identifier"),
    Index("ix_payments_unfinished", "state", "lease_until"),
    Index("ix_payments_created", "created_at"),  # reports by period
    Index("ix_payments_refund", "refund_id", "charged_atomic"),  # a refund's rows; what is owed
)

results_table = Table(
    "paywire_results",
    metadata,
    Column("payment_row", String(36), ForeignKey("paywire_payments.id", ondelete="CASCADE"),
           primary_key=True),
    Column("status", Integer, nullable=False),
    Column("media_type", String(200), nullable=False),
    Column("body", LargeBinary, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Index("ix_results_expires", "expires_at"),
)

events_table = Table(
    "paywire_payment_events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("payment_row", String(36), ForeignKey("paywire_payments.id", ondelete="CASCADE"),
           nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("actor", String(64), nullable=False),  # the replica, e.g. "reconciler@<replica>"
    Column("from_state", String(16), nullable=False),
    Column("to_state", String(16), nullable=False),
    Column("detail", Text),
    Index("ix_events_row", "payment_row"),
    Index("ix_events_at", "at"),
)

skill_switches_table = Table(
    "paywire_skill_switches",
    metadata,
    Column("skill_id", String(200), primary_key=True),
    Column("enabled", Boolean, nullable=False),
    Column("reason", Text),
    Column("changed_by", String(200), nullable=False),
    Column("changed_at", DateTime(timezone=True), nullable=False),
)

denied_payers_table = Table(
    "paywire_denied_payers",
    metadata,
    Column("payer", String(128), primary_key=True),  # as the ledger keys it: EVM lower case
    Column("reason", Text),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

controls_version_table = Table(
    "paywire_controls_version",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),  # always 1
    Column("version", BigInteger, nullable=False),
    Column("changed_at", DateTime(timezone=True), nullable=False),
)


class RefundState(enum.StrEnum):
    """Where a refund is (payments/refunds.py).

    signed     the intent: the transfer is signed and recorded, its signature known; it may or
               may not have been broadcast (a crash here: sent again, as it is, after restart)
    sent       a node accepted the transfer; not confirmed yet
    confirmed  the transfer landed (confirmed commitment): the payer has the money
    """

    SIGNED = "signed"
    SENT = "sent"
    CONFIRMED = "confirmed"


OPEN_REFUNDS = (RefundState.SIGNED, RefundState.SENT)

refunds_table = Table(
    "paywire_refunds",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("network", String(64), nullable=False),
    Column("payer", String(128), nullable=False),  # who gets the money back
    Column("asset", String(128), nullable=False),
    Column("pay_to", String(128), nullable=False),  # the operator's wallet it is sent from
    Column("amount_atomic", BigInteger, nullable=False),
    Column("payments", Integer, nullable=False),  # how many payment rows it covers
    Column("state", String(16), nullable=False),
    # The current attempt, written before it is broadcast: a Solana transaction's id is its fee
    # payer's signature, known once signed. A fresh attempt replaces it only once the chain shows
    # the previous one can never land (its blockhash expired without it).
    Column("signature", String(128), nullable=False),
    Column("blockhash", String(64), nullable=False),
    Column("last_valid_height", BigInteger, nullable=False),
    Column("transaction", Text, nullable=False),  # signed, base64: sent again as it is
    Column("attempts", Integer, nullable=False),
    Column("expired_signatures", JSON),  # earlier attempts, which never landed
    Column("owner", String(64)),
    Column("lease_until", DateTime(timezone=True)),
    Column("error", Text),  # the last send's refusal, for the operator
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("confirmed_at", DateTime(timezone=True)),
    UniqueConstraint("signature", name="uq_refund_signature"),
    Index("ix_refunds_state", "state", "lease_until"),
    Index("ix_refunds_payer", "payer"),
)

turns_table = Table(
    "paywire_turns",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("owner", String(64), nullable=False),
    Column("until", DateTime(timezone=True), nullable=False),  # nobody else takes it before
)
