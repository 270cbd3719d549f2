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
