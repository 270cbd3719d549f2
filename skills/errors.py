"""Errors a skill raises. The pipeline maps them to wire errors; skills never see HTTP."""

from __future__ import annotations

from decimal import Decimal
from typing import Any


class SkillError(Exception):
    """Base class: something about a skill call went wrong."""


class SkillInputError(SkillError):
    """The caller's input cannot run. Raised before any quote, so nobody pays for it.

    `field` names the offending input field (dotted path, e.g. ``messages.0.content``)
    so every face can point at it; the message says what would be accepted.
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class SkillUnavailableError(SkillError):
    """The skill exists and can be quoted but cannot run here (not implemented, not configured).

    A paid call that hits this is not charged.
    """


class UpstreamError(SkillError):
    """The skill's upstream failed: it could not be reached, broke off, or answered nonsense.
    Skills say what happened, never an HTTP status: the pipeline decides the answer (one place,
    `agent.pipeline.outcomes.refusal`). Subclasses say more.

    `usage` and `upstream_cost_usd` say what the failed call still spent upstream (a model that
    answered, but not validly): the caller is not charged, the operator's ledger shows the cost.
    """

    def __init__(self, message: str, *, usage: dict[str, Any] | None = None,
                 upstream_cost_usd: Decimal | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.usage = usage
        self.upstream_cost_usd = upstream_cost_usd


class UpstreamTimeout(UpstreamError):
    """The upstream did not answer in time."""


class UpstreamRejected(UpstreamError):
    """The upstream refused the request as invalid: another upstream would refuse it too."""


class UpstreamAnswer(UpstreamError):
    """A forwarded upstream's non-2xx answer, handed to the caller as it is (its status, body,
    type: data passed on, not a status chosen here); the call did not deliver, so it is not
    charged."""

    def __init__(self, upstream_status: int, body: bytes, media_type: str, message: str) -> None:
        super().__init__(message)
        self.upstream_status = upstream_status
        self.body = body
        self.media_type = media_type
