"""x402's `exact` scheme: the payer signed the quoted amount, and that amount is what moves."""

from __future__ import annotations

from agent.pipeline.paid import PaidCall
from agent.pipeline.schemes.onchain import OnchainSettlement
from skills.skill import SkillResult


class ExactSettlement(OnchainSettlement):
    scheme = "exact"

    def amount_to_settle(self, paid: PaidCall, result: SkillResult) -> int:
        return paid.atomic
