"""The paid call a skill runs for, when it needs to know: a skill that pays someone else for the
call (a federated resource, federation/paying.py) ties its own payment to the caller's, so a
retry of the caller's payment never pays twice. Set by the pipeline around a paid run."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True)
class PaidCallRef:
    row_id: str          # the caller's payment row in the ledger (paywire_payments.id)
    payer: str
    request_digest: str  # the call's request (agent/pipeline/requests.py request_digest)


current_call: ContextVar[PaidCallRef | None] = ContextVar("paywire_current_call", default=None)


@contextlib.contextmanager
def paid_call(ref: PaidCallRef) -> Iterator[None]:
    """`ref` is the current call while the block runs (and in what it awaits)."""
    token = current_call.set(ref)
    try:
        yield
    finally:
        current_call.reset(token)
