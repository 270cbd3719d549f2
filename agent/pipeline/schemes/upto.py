"""x402's `upto` scheme (EVM, through Permit2): the payer authorized the quote as a maximum, and
what the call used is what moves, after the run; a call that used nothing billable moves nothing
(no transaction). A stream settles at its end, once its usage is known: its chunks go out as they
come, the claim's lease renewed meanwhile, and the settlement's receipt is in the ledger (a
caller that leaves part way is charged for what was produced until then)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from agent.pipeline.outcomes import Outcome
from agent.pipeline.paid import PaidCall
from agent.pipeline.schemes.at_end import stream_settled_at_its_end
from agent.pipeline.schemes.onchain import OnchainSettlement
from payments.ledger import PaymentRow
from skills.skill import SkillResult


class UptoSettlement(OnchainSettlement):
    scheme = "upto"

    def amount_to_settle(self, paid: PaidCall, result: SkillResult) -> int:
        return paid.charge_of(result.charge_usd)

    def retry_amount(self, paid: PaidCall, row: PaymentRow) -> int:
        return row.charged  # what the first attempt's intent recorded

    async def settle_stream(self, paid: PaidCall, row_id: str, chunks: AsyncIterator[Any],
                            first: Any) -> Outcome:
        return stream_settled_at_its_end(self, paid, row_id, chunks, first)
