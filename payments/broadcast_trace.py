"""What a settlement did on the way to the chain, seen from inside the facilitator's signer.

The gateway must tell "nothing was broadcast" (the payment may be retried at once) from "it may
have been" (the ledger says pending and the reconciler asks the chain). A facilitator's answer
does not always say: the SDK reports a node refusing a transaction ("nonce too low") and an RPC
timeout on the send the same way. paywire's own signers (payments/signers.py, the devnets') record
it here: the gateway sets a `BroadcastTrace` in `current_trace` around a settle, the in-process
facilitator carries the context into its worker thread, and the signer notes the transaction id
before it sends and whether the node accepted it.

A settlement sends within `SEND_WINDOW_SECONDS` of the moment it began (its trace was made, just
after its intent was written) or not at all: `sending` refuses a later send before anything leaves
the process (`SendWindowClosed`; the trace still says nothing was sent, so the payment is released
and may be sent again). That bound is what lets the reconciler prove early that a payment whose
replica lost it can no longer move (payments/reconciler.py): past the window, no settlement of it
can still begin a send, whatever became of the process that ran it (a stalled event loop, a
database it could not reach while its settle thread went on).
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

# How long after it began a settlement may still begin a send. A healthy one sends within a
# second (the facilitator's checks, the send lock); the rest is a queue for the facilitator's
# threads or the send lock under load. The reconciler's early proof that nothing of a payment can
# still move waits this long (and a margin) after the payment's last settlement attempt began.
SEND_WINDOW_SECONDS = 20.0


class SendWindowClosed(RuntimeError):
    """A send refused before it left: its settlement began more than the send window ago."""


class Sent(enum.Enum):
    NO = "no"  # nothing reached a node (or the node refused it: it is not in any pool)
    MAYBE = "maybe"  # a send began and its answer was not seen
    YES = "yes"  # a node accepted the transaction


@dataclass
class BroadcastTrace:
    """One settlement's broadcast, written by a signer thread, read by the gateway after."""

    sent: Sent = Sent.NO
    transaction: str | None = None  # known just before it is sent
    began: float = field(default_factory=time.monotonic)  # when the settlement began
    window: float | None = None  # seconds it may begin sends in (None: SEND_WINDOW_SECONDS)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def sending(self, transaction: str) -> None:
        """A send is about to begin: its id, noted before anything leaves. Raises
        `SendWindowClosed` (nothing noted, nothing to be sent) past the settlement's window."""
        window = SEND_WINDOW_SECONDS if self.window is None else self.window
        late = time.monotonic() - self.began - window
        if late > 0:
            raise SendWindowClosed(f"not sent: the settlement began more than {window:.0f} s ago "
                                   f"({late:.1f} s past its send window)")
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
    that escapes leaves it "maybe sent". Past the settlement's send window it raises
    `SendWindowClosed` before the send begins."""
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
