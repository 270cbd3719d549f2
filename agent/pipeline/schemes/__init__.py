"""Each x402 scheme's settlement behind one interface (`base.Settlement`), chosen by the scheme
of the requirement a payment matched. A scheme plugs in by a class here and a line in
`Settlements.__init__`."""

from __future__ import annotations

from agent.pipeline.paid import PaidCall, PaidServices
from agent.pipeline.schemes.base import Settlement
from agent.pipeline.schemes.channel import ChannelSettlement
from agent.pipeline.schemes.exact import ExactSettlement
from agent.pipeline.schemes.upto import UptoSettlement


class Settlements:
    """The registry: scheme name -> its settlement, for the schemes this gateway settles."""

    def __init__(self, services: PaidServices) -> None:
        settlements: list[Settlement] = [ExactSettlement(services), UptoSettlement(services),
                                         ChannelSettlement(services)]
        self._by_scheme = {s.scheme: s for s in settlements}

    def of(self, paid: PaidCall) -> Settlement:
        """The settlement of the scheme `paid`'s payment matched (only offered schemes match)."""
        return self._by_scheme[paid.matched.requirement.scheme]
