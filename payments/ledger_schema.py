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
paywire_channels       x402 batch-settlement channels (payments/channels/): the config as signed,
                       what delivered calls were charged (the running total), the latest voucher,
                       the chain's mirror, and the reservation that lets one call at a time use it
paywire_claims         the channel claimer's transactions (payments/channels/claimer.py): one claim of
                       many channels' vouchers, or one sweep of what was claimed to the receiver,
                       written as an intent before it is broadcast, with its outcome
paywire_claim_rows     which channels a claim covers, and up to what running total each
paywire_chain_fees     one row per on-chain transaction paywire's payments cause (settlements,
                       Solana refunds, channel deposits, claims, sweeps, cooperative refunds): its
                       fee, read from the chain after the fact by payments/chain_fees.py
paywire_federation_sources   where resources are imported from (federation/store.py): a
                       catalogue or one seller, its filters and margin, its last refresh
paywire_federated_resources  the resources imported from them, as sold (price included)
paywire_federation_version   one row: a counter bumped by every change of what is imported, so
                       replicas reload their registry with one tiny query
paywire_outgoing_payments    what paywire pays upstream sellers for federated calls: an intent
                       per caller's payment row, written before anything is signed; the signed
                       payment before it is sent; the seller's answer once paid
paywire_federation_spend     what the outgoing payments of a UTC day reserve against the caps,
                       per seller and for all sellers ('*')
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


class ExactInteger(TypeDecorator[int]):
    """An exact whole number of any size (a fee in wei can pass 2^63): NUMERIC(78, 0) on
    PostgreSQL (any uint256 fits); decimal text on SQLite, whose INTEGER is 64 bits."""

    impl = Numeric(78, 0, asdecimal=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(String(80))
        return dialect.type_descriptor(Numeric(78, 0, asdecimal=True))

    def process_bind_param(self, value: int | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        return str(int(value)) if dialect.name == "sqlite" else Decimal(int(value))

    def process_result_value(self, value: Any, dialect: Dialect) -> int | None:
        return None if value is None else int(Decimal(str(value)))


WHOLE = ExactInteger()


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
    # The x402 scheme the payment matched. A batch-settlement (channel) call's row names its
    # channel; its nonce is "<channelId>/<base>" (the channel's running total it was charged on
    # top of) and its charge is in charged_atomic (payments/channels/store.py).
    Column("scheme", String(24), nullable=False, server_default=text("'exact'")),
    Column("channel_id", String(66)),
    UniqueConstraint("network", "payer", "nonce", name="uq_payment_once"),
    UniqueConstraint("payment_id", name="uq_payment_identifier"),
    Index("ix_payments_unfinished", "state", "lease_until"),
    Index("ix_payments_created", "created_at"),  # reports by period
    Index("ix_payments_refund", "refund_id", "charged_atomic"),  # a refund's rows; what is owed
    Index("ix_payments_channel", "channel_id", "state"),  # a channel's calls
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


class ChannelState(enum.StrEnum):
    """Where a batch-settlement channel is (payments/channels/store.py).

    open         it holds a deposit: vouchers are taken, one call at a time
    closing      the payer asked to withdraw (pendingWithdrawals on chain): no new voucher, the
                 claimer claims it at once (x402 #3464)
    quarantined  a claim's pre-check failed (the chain disagrees with the ledger): no new voucher
                 until the operator looks
    closed       it holds nothing paywire can charge (no deposit yet, or refunded): a deposit
                 opens it
    """

    OPEN = "open"
    CLOSING = "closing"
    QUARANTINED = "quarantined"
    CLOSED = "closed"


channels_table = Table(
    "paywire_channels",
    metadata,
    Column("channel_id", String(66), primary_key=True),  # lower-case hex, bound to the config
    Column("network", String(64), nullable=False),
    Column("state", String(16), nullable=False),
    # The ChannelConfig as signed (addresses in lower case; salt as 0x + 64 hex digits).
    Column("payer", String(128), nullable=False),
    Column("payer_authorizer", String(128), nullable=False),
    Column("receiver", String(128), nullable=False),
    Column("receiver_authorizer", String(128), nullable=False),
    Column("token", String(128), nullable=False),
    Column("withdraw_delay", Integer, nullable=False),
    Column("salt", String(66), nullable=False),
    # What delivered calls were charged, counted from the channel's first deposit (or from the
    # chain's totalClaimed when paywire adopted a channel it did not know): the running total
    # each voucher must sign on top of. Raised by a commit (one call's charge), or to the chain's
    # totalClaimed when claims were made elsewhere (the mirror).
    Column("charged_atomic", BigInteger, nullable=False),
    # The latest accepted voucher: its ceiling and signature (a bearer allowance: never logged).
    Column("signed_max_atomic", BigInteger),
    Column("signature", Text),
    # The chain's mirror, from paywire's own reads only (never a facilitator's report, x402 #2559).
    Column("balance_atomic", BigInteger, nullable=False),
    Column("total_claimed_atomic", BigInteger, nullable=False),
    Column("withdraw_requested_at", BigInteger, nullable=False),  # 0: no withdrawal pending
    Column("refund_nonce", BigInteger, nullable=False),
    Column("onchain_synced_at", DateTime(timezone=True)),
    # The reservation: the payment row of the one call using the channel, its replica, and until
    # when (renewed with the row's lease; NULL while a deposit's outcome is unknown: held until
    # the chain decides).
    Column("pending_row", String(36), ForeignKey("paywire_payments.id", name="fk_channel_pending_row")),
    Column("owner", String(64)),
    Column("lease_until", DateTime(timezone=True)),
    Column("claim_due_at", DateTime(timezone=True)),  # when the claimer should claim it
    Column("last_request_at", DateTime(timezone=True)),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Index("ix_channels_claim_due", "state", "claim_due_at"),
    Index("ix_channels_payer", "payer"),
    # (no index on the reservation's columns, which every call rewrites: the reconciler finds a
    # dead reservation through its payment row, ix_payments_unfinished)
)


class ChainFeeState(enum.StrEnum):
    """Where a transaction's fee is (payments/chain_fees.py).

    waiting   known to paywire, its fee not read yet (the node did not know it yet, or could not
              be asked): the meter asks again at `next_try_at`
    recorded  its receipt was read: the fee is in `fee`
    missing   the node still did not know it long after it was registered (never landed, or the
              node keeps no such history): no fee, not asked again
    """

    WAITING = "waiting"
    RECORDED = "recorded"
    MISSING = "missing"


chain_fees_table = Table(
    "paywire_chain_fees",
    metadata,
    # One row per transaction: a fee is counted once, whoever registers or reads it.
    Column("network", String(64), primary_key=True),
    Column("tx_id", String(130), primary_key=True),  # EVM: the hash in lower case; Solana: signature
    Column("kind", String(24), nullable=False),  # settlement, upto_settlement, refund, deposit, ...
    Column("ref", String(66)),  # what it is for: the payment row, the refund, the channel
    Column("skill", String(200)),  # a settlement's: its payment's skill (reports by skill)
    Column("at", DateTime(timezone=True), nullable=False),  # the UTC day its fee counts on
    Column("state", String(16), nullable=False),
    # What the chain says (NULL until recorded): the account that paid the fee, gas used and the
    # effective gas price (EVM), an OP-stack L1 fee, the fee in the native token's smallest unit
    # (wei, lamports), the block (or slot), whether the transaction succeeded.
    Column("paid_by", String(128)),
    Column("gas_used", BigInteger),
    Column("gas_price", WHOLE),
    Column("l1_fee", WHOLE),
    Column("fee", WHOLE),
    Column("block_number", BigInteger),
    Column("succeeded", Boolean),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("next_try_at", DateTime(timezone=True)),
    Column("error", Text),  # why the last attempt read no fee, for the operator
    Column("expected_at", DateTime(timezone=True), nullable=False),
    Column("observed_at", DateTime(timezone=True)),
    Index("ix_chain_fees_due", "state", "next_try_at"),
    Index("ix_chain_fees_at", "at"),  # reports by period
)


class ClaimKind(enum.StrEnum):
    """What a paywire_claims transaction does (payments/channels/claimer.py)."""

    CLAIM = "claim"  # claimWithSignature: channels' vouchers claimed (accounting, no token moves)
    SETTLE = "settle"  # settle(receiver, token): what was claimed goes to the receiver (the sweep)


class ClaimState(enum.StrEnum):
    """Where a claim or sweep is (payments/channels/claimer.py).

    settling  the intent is written: it may be broadcast from now on (a crash here: resolved
              from the chain once its lease runs out)
    pending   broadcast, its outcome not known: the claimer asks the chain
    settled   the chain has it (every row's totalClaimed reached its claim_to; a sweep landed)
    released  nothing moved (the facilitator refused it, or the chain shows it did not land):
              its channels are claimed again by a later one
    """

    SETTLING = "settling"
    PENDING = "pending"
    SETTLED = "settled"
    RELEASED = "released"


OPEN_CLAIMS = (ClaimState.SETTLING, ClaimState.PENDING)

claims_table = Table(
    "paywire_claims",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("network", String(64), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("state", String(16), nullable=False),
    # Which replica's claimer works on it, and until when (an open one past its lease, or
    # pending, is resolved from the chain by whichever claimer takes it).
    Column("owner", String(64)),
    Column("lease_until", DateTime(timezone=True)),
    Column("tx_hash", String(130)),
    # A claim: what it moves into the receiver's claimed total (the rows' claim_to less the
    # chain's totalClaimed read before it); a sweep: what it transfers to the receiver.
    Column("amount_atomic", BigInteger, nullable=False),
    Column("error", Text),  # why it did not move (or not yet), for the operator
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Index("ix_claims_open", "state", "lease_until"),
    Index("ix_claims_kind", "network", "kind", "created_at"),  # the last sweep of a network
)

claim_rows_table = Table(
    "paywire_claim_rows",
    metadata,
    Column("claim_id", String(36), ForeignKey("paywire_claims.id", name="fk_claim_row_claim"),
           primary_key=True),
    Column("channel_id", String(66),
           ForeignKey("paywire_channels.channel_id", name="fk_claim_row_channel"), primary_key=True),
    # The channel's running total when the intent was written (what the claim sets its
    # totalClaimed to), and the ceiling of the voucher it was claimed with.
    Column("claim_to_atomic", BigInteger, nullable=False),
    Column("voucher_max_atomic", BigInteger, nullable=False),
    Index("ix_claim_rows_channel", "channel_id"),  # whether a channel is in an open claim
)


# -- federation (issue 24: federation/store.py) ------------------------------------------------

federation_sources_table = Table(
    "paywire_federation_sources",
    metadata,
    Column("id", String(64), primary_key=True),  # federation.model.source_id_for(url)
    Column("url", Text, nullable=False),
    Column("kind", String(16), nullable=False),  # catalogue | seller
    Column("filters", JSON, nullable=False),  # federation.model.Filters.to_json()
    Column("margin_percent", USD, nullable=False),
    Column("margin_fixed_usd", USD, nullable=False),
    Column("origin", String(16), nullable=False),  # env (PAYWIRE_FEDERATE) | cli
    Column("created_at", DateTime(timezone=True), nullable=False),
    # The last refresh (by whichever replica held the turn): when, whether it worked, what it
    # said (problems, or why it failed), how many resources it imported.
    Column("last_refresh_at", DateTime(timezone=True)),
    Column("last_refresh_ok", Boolean),
    Column("last_refresh_detail", Text),
    Column("last_count", Integer),
)

federated_resources_table = Table(
    "paywire_federated_resources",
    metadata,
    Column("resource_id", String(200), primary_key=True),
    Column("source_id", String(64), nullable=False),
    Column("data", JSON, nullable=False),  # federation.model.ImportedResource.to_json()
    Column("fingerprint", String(64), nullable=False),  # ImportedResource.fingerprint()
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Index("ix_federated_resources_source", "source_id"),
)

federation_version_table = Table(
    "paywire_federation_version",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),  # always 1
    Column("version", BigInteger, nullable=False),
    Column("changed_at", DateTime(timezone=True), nullable=False),
)


class IntentState(enum.StrEnum):
    """Where an outgoing payment is (federation/store.py, federation/paying.py).

    intent  written within the caps, nothing signed yet (a crash here: void, nothing can move)
    signed  the payment is signed and stored, not sent yet (as far as anyone knows)
    sent    sent to the seller at least once: whether it moved is the seller's answer, else the
            chain's to say
    paid    the seller took it and answered: the answer is kept for the caller
    void    nothing moved and nothing can: its reservation against the caps is given back
    lost    it moved and no answer was kept: the operator's loss
    """

    INTENT = "intent"
    SIGNED = "signed"
    SENT = "sent"
    PAID = "paid"
    VOID = "void"
    LOST = "lost"


OPEN_INTENTS = (IntentState.INTENT, IntentState.SIGNED, IntentState.SENT)

outgoing_payments_table = Table(
    "paywire_outgoing_payments",
    metadata,
    Column("id", String(36), primary_key=True),
    # The x402 payment-identifier the payment is signed with: fixed at insert ("fed_" + 32 hex),
    # so every send of it is the same payment to the seller.
    Column("payment_identifier", String(64), nullable=False),
    Column("state", String(16), nullable=False),
    # The call it pays for: the caller's payment row (paywire_payments.id; moved by an adoption,
    # so no foreign key pins it), its payer and request.
    Column("caller_row_id", String(36), nullable=False),
    Column("caller_payer", String(128), nullable=False),
    Column("request_digest", String(64), nullable=False),
    Column("resource_id", String(200), nullable=False),
    Column("seller", String(300), nullable=False),  # scheme://host[:port]
    Column("url", Text, nullable=False),
    Column("network", String(64), nullable=False),
    Column("asset", String(128), nullable=False),
    Column("pay_to", String(128), nullable=False),
    Column("amount_atomic", BigInteger, nullable=False),
    Column("amount_usd", USD, nullable=False),  # what it reserves against the caps
    # The signed payment (a bearer payment: never logged), and what identifies it on its chain
    # (payments.chain_probe's refs), written before it is sent.
    Column("payload", Text),
    Column("chain_ref", JSON),
    Column("valid_before", DateTime(timezone=True)),
    Column("tx_hash", String(130)),
    # The seller's answer once paid: given to the caller's retry instead of paying again.
    Column("answer_status", Integer),
    Column("answer_media_type", String(200)),
    Column("answer_body", LargeBinary),
    Column("error", Text),
    Column("day", String(10), nullable=False),  # the UTC day its reservation counts on
    Column("owner", String(64)),
    Column("lease_until", DateTime(timezone=True)),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("payment_identifier", name="uq_outgoing_payment_identifier"),
    Index("ix_outgoing_caller", "caller_row_id"),
    Index("ix_outgoing_open", "state", "lease_until"),
    Index("ix_outgoing_request", "caller_payer", "request_digest", "resource_id"),
    Index("ix_outgoing_seller", "seller", "state"),  # the report's totals by seller
)

federation_spend_table = Table(
    "paywire_federation_spend",
    metadata,
    Column("day", String(10), primary_key=True),  # YYYY-MM-DD, UTC
    Column("seller", String(300), primary_key=True),  # a seller's origin, or '*': all sellers
    # What the day's outgoing payments that are not void reserve (exact; raised within the cap
    # when an intent is written, lowered once when one turns void).
    Column("reserved_usd", USD, nullable=False),
)
