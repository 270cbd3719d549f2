"""What a settle attempt means for the payer: it moved, nothing moved, or nobody knows yet.

The one rule that keeps a payer from being charged without a result: "nothing moved" is said only
when it is known, never guessed from a failure. What tells:
- the facilitator's answer: a success; or a refusal it gave before broadcasting (the SDK's
  `invalid_*` reasons: the payment failed its checks again at settle time);
- `SettlementNotBroadcast` from a remote facilitator that was never reached;
- the in-process signers' `BroadcastTrace`: the node refused the transaction, or it was never sent.
Everything else (a timeout, a 5xx, `settlement_pending`, a transaction that was sent but whose
fate is unclear) is unknown: the ledger records it as pending and the reconciler asks the chain.
"""

from __future__ import annotations

from dataclasses import dataclass

from x402.schemas import SettleResponse

from .broadcast_trace import BroadcastTrace, Sent
from .facilitator_status import SettlementNotBroadcast, SettlementUnknown

SETTLEMENT_PENDING = "settlement_pending"  # the SDK's reason: broadcast, receipt not seen in time

# Reasons a facilitator gives before anything is broadcast, besides the `invalid_*` family.
_BEFORE_BROADCAST = frozenset({
    "unsupported_scheme", "network_mismatch", "invalid_network", "invalid_payload",
    "invalid_payment_requirements", "invalid_scheme", "insufficient_funds",
})


@dataclass(frozen=True)
class Moved:
    transaction: str


@dataclass(frozen=True)
class NotMoved:
    reason: str
    transaction: str | None = None  # a transaction the node refused or that reverted, if any


@dataclass(frozen=True)
class Unknown:
    reason: str
    transaction: str | None = None


Verdict = Moved | NotMoved | Unknown


def classify(receipt: SettleResponse | None, error: BaseException | None, trace: BroadcastTrace,
             *, traced: bool) -> Verdict:
    """The verdict on one settle attempt. `traced`: the facilitator is in process, so `trace`
    saw every send its signers made (a remote facilitator's sends are invisible here)."""
    if receipt is not None and receipt.success:
        return Moved(receipt.transaction)
    transaction = (receipt.transaction if receipt is not None else None) or trace.transaction
    if isinstance(error, SettlementNotBroadcast):
        return NotMoved(f"settlement_not_broadcast: {error}")
    if trace.sent is not Sent.NO:  # one of our signers sent (or may have sent) a transaction
        reason = receipt.error_reason if receipt is not None else _describe(error)
        return Unknown(reason or SETTLEMENT_PENDING, transaction)
    if error is not None:
        if traced and not isinstance(error, SettlementUnknown):
            return NotMoved(f"settlement_error: {_describe(error)}")  # our signers sent nothing
        tx = error.transaction if isinstance(error, SettlementUnknown) else None
        return Unknown(_describe(error), tx or transaction)
    assert receipt is not None
    reason = receipt.error_reason or "settlement_failed"
    if reason == SETTLEMENT_PENDING or reason == "duplicate_settlement":
        return Unknown(reason, transaction)
    if traced or (not receipt.transaction and (reason.startswith("invalid_")
                                               or reason in _BEFORE_BROADCAST)):
        return NotMoved(reason, receipt.transaction or None)
    return Unknown(reason, transaction)


def _describe(error: BaseException | None) -> str:
    if error is None:
        return SETTLEMENT_PENDING
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
