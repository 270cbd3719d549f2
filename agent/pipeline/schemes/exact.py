"""x402's `exact` scheme: the payer signed the quoted amount, and that amount is what moves. On
Solana (where x402 has no `upto` yet) a call that used less is charged less and owed the rest
back, when the operator turns refunds on (payments/refunds.py sends them in batches)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent.pipeline.paid import PaidCall
from agent.pipeline.schemes.onchain import OnchainSettlement
from payments.networks import lookup_network
from skills.skill import SkillResult, StreamUsage


class ExactSettlement(OnchainSettlement):
    scheme = "exact"

    def amount_to_settle(self, paid: PaidCall, result: SkillResult) -> int:
        return paid.atomic

    def charged(self, paid: PaidCall, result: SkillResult, amount: int) -> int | None:
        if not self._refunds_what_was_not_used(paid):
            return None
        charged = paid.charge_of(result.charge_usd)
        return charged if charged < amount else None

    def stream_charge(self, paid: PaidCall) -> Callable[[StreamUsage], int | None] | None:
        if not self._refunds_what_was_not_used(paid):
            return None
        return lambda used: paid.charge_of(used.charge_usd)

    def receipt_extra(self, paid: PaidCall, charged: int | None) -> dict[str, Any] | None:
        return self.services.refunds.refund_note(paid.atomic, charged,
                                                 paid.matched.requirement.network)

    def _refunds_what_was_not_used(self, paid: PaidCall) -> bool:
        return (self.services.refunds.enabled
                and lookup_network(paid.matched.requirement.network).family == "svm")
