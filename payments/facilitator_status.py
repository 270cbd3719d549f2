"""Why a facilitator cannot be used yet: it is down (retry), or it is not what was configured.

`PaymentProcessor.start` asks the facilitator which payment kinds it settles. A facilitator that
does not answer (connection refused, timeout, 5xx, no kinds yet) is `FacilitatorUnavailable`: the
gateway serves anyway, not ready, and keeps asking (`PaymentProcessor.keep_starting`); until it
answers, `requirements` raises it and paid calls are answered 503 (nothing is charged). A URL that
answers but is not a facilitator, or a facilitator that does not settle a configured network, is
`FacilitatorMismatch`: a configuration problem, reported at startup.
"""

from __future__ import annotations

# What a caller is told while payments are not ready (the operator's reason: /readyz, the log).
NOT_READY = ("payments are unavailable right now (the payment facilitator has not answered yet); "
             "retry later, nothing was charged")


class FacilitatorUnavailable(RuntimeError):
    """The facilitator could not be asked right now; asking again later may work."""


class FacilitatorMismatch(ValueError):
    """The facilitator answered, but is not one (or does not settle what is configured)."""


class SettlementNotBroadcast(RuntimeError):
    """A settle failed before anything could reach the chain (the facilitator was never reached,
    or it refused before broadcasting; the node refused the transaction): nothing moved, the
    same signed payment may be settled again, here or by the next facilitator."""


class SettlementUnknown(RuntimeError):
    """A settle whose outcome is not known: the request may have reached a facilitator that
    broadcast (a timeout after sending, a 5xx, a dropped connection, a receipt that did not come
    in time). Never fail over or answer "nothing was charged" on it: the ledger records the
    payment as pending and the reconciler asks the chain. `transaction` is the broadcast
    transaction's id when it is known."""

    def __init__(self, message: str, transaction: str | None = None) -> None:
        super().__init__(message)
        self.transaction = transaction or None
