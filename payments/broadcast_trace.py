"""What a settlement did on the way to the chain, seen from inside the facilitator's signer.

The gateway must tell "nothing was broadcast" (the payment may be retried at once) from "it may
have been" (the ledger says pending and the reconciler asks the chain). A facilitator's answer
does not always say: the SDK reports a node refusing a transaction ("nonce too low") and an RPC
timeout on the send the same way. paywire's own signers (payments/signers.py, the devnets') record
it here: the gateway sets a `BroadcastTrace` in `current_trace` around a settle, the in-process
facilitator carries the context into its worker thread, and the signer notes the transaction id
before it sends and whether the node accepted it.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field


class Sent(enum.Enum):
    NO = "no"  # nothing reached a node (or the node refused it: it is not in any pool)
    MAYBE = "maybe"  # a send began and its answer was not seen
    YES = "yes"  # a node accepted the transaction


@dataclass
class BroadcastTrace:
    """One settlement's broadcast, written by a signer thread, read by the gateway after."""

    sent: Sent = Sent.NO
    transaction: str | None = None  # known just before it is sent
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def sending(self, transaction: str) -> None:
        with self._lock:
            self.transaction, self.sent = transaction, Sent.MAYBE

    def accepted(self) -> None:
        with self._lock:
            self.sent = Sent.YES

    def refused(self) -> None:
        """The node answered the send with an error: the transaction is in no pool."""
        with self._lock:
            if self.sent is Sent.MAYBE:
                self.sent = Sent.NO


current_trace: contextvars.ContextVar[BroadcastTrace | None] = contextvars.ContextVar(
    "paywire_broadcast_trace", default=None)


def trace() -> BroadcastTrace | None:
    """The trace of the settlement this thread works for (None outside a traced settle)."""
    return current_trace.get()


@contextlib.contextmanager
def broadcasting(transaction: str, refusal: type[BaseException]) -> Iterator[None]:
    """Around one send by a signer: the id first, then accepted, or refused when the node
    answered with `refusal` (an error answer: the transaction is in no pool). Anything else
    that escapes leaves it "maybe sent"."""
    traced = trace()
    if traced is not None:
        traced.sending(transaction)
    try:
        yield
    except refusal:
        if traced is not None:
            traced.refused()
        raise
    if traced is not None:
        traced.accepted()
