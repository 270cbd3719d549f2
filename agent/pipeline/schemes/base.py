"""The one interface every x402 scheme's settlement offers the claimed path."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from x402.schemas import SettleResponse

from agent.pipeline.outcomes import Outcome
from agent.pipeline.paid import PaidCall
from payments.ledger import Claimed, Existing, PaymentRow
from skills.skill import SkillResult


class Settlement(Protocol):
    """How a claimed, run call's payment of one scheme (`scheme`: the matched requirement's) moves
    its money and becomes the caller's answer. The claimed path has claimed the payment and run
    the call; the settlement turns the result into `Delivered` (with the receipt), or into the
    refusal or pending answer when the money did not (or may not have) moved.

    What a scheme must guarantee:
    - the intent first: the ledger records what may move (`Ledger.begin_settlement`) before
      anything is sent, so a retry after a crash finds the payment, never "no row";
    - a raise from the facilitator is never read as "nothing moved": only a verdict that proves
      it (payments/settlement_outcome.py) releases the claim; anything else is pending;
    - nothing is charged when the call did not deliver: settlement begins only after a result
      (a stream: at the latest, its first chunk) is in hand, and not at all once the face
      stopped it (`shielding.settle_guard`);
    - a payer who is charged gets the result: a settled result whose ledger write failed is
      still delivered (the reconciler records it)."""

    scheme: str

    async def claim(self, paid: PaidCall) -> Claimed | Existing | Outcome:
        """Take the payment for this call (the ledger's row under this replica's lease, and
        whatever the scheme holds with it: a channel's reservation): Claimed, or the row of a
        payment the ledger already knows (a retry), or the answer when it cannot be taken.
        LEDGER_ERRORS raise."""
        ...

    async def release(self, row_id: str, reason: str, **kwargs: Any) -> bool:
        """Nothing is charged: the claim released with what the scheme held with it (True when
        the ledger wrote it; if it is down the lease runs out and the reconciler releases it)."""
        ...

    async def receipt_of(self, row: PaymentRow) -> SettleResponse:
        """The receipt of a settled payment asked again (a retry gets what the first answer said
        was charged). LEDGER_ERRORS raise."""
        ...

    async def settle(self, paid: PaidCall, row_id: str, result: SkillResult, *,
                     record: bool = True) -> Outcome:
        """Settle a claimed call whose run gave `result`: intent -> move the money -> classify
        -> record. `record=False`: a stream, whose usage and delivery are recorded at its end."""
        ...

    async def settle_stream(self, paid: PaidCall, row_id: str, chunks: AsyncIterator[Any],
                            first: Any) -> Outcome:
        """A claimed stream's settlement, which says when it settles (the exact scheme: with its
        `first` chunk in hand, before any byte goes out), then its handover to the caller."""
        ...

    async def settle_again(self, paid: PaidCall, row: PaymentRow) -> Outcome | PaymentRow:
        """A retry of a payment whose earlier settlement's outcome is unknown and which the chain
        says can still move: the row, settled, when the money moved (the claimed path redelivers
        its result), else the answer (pending: only a success counts, any refusal may mean the
        earlier broadcast landed)."""
        ...
