"""What a face builds for the pipeline: the call (`CallRequest`) and the payment that came with
it (`Payment`, decoded once where it entered); and what identifies a call's request."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from x402.schemas import PaymentPayload, PaymentPayloadV1

from agent.pipeline.bazaar import HttpRoute
from payments.codec import PaymentHeaderError, decode_payment_header, decode_payment_object
from skills.skill import Skill


@dataclass(frozen=True)
class Payment:
    """The payment that came with a call, decoded once where it entered (a header by the HTTP
    edge, an in-band object by the A2A face): the SDK's payload model, or why it is not one."""

    payload: PaymentPayload | PaymentPayloadV1 | None
    problem: str | None = None  # the refusal's message; `where` names the header or field
    where: str | None = None
    misplaced: bool = False  # a payment in a header paywire does not read: a 402 saying where

    @staticmethod
    def from_header(name: str, value: str) -> Payment:
        try:
            return Payment(decode_payment_header(value, name))
        except PaymentHeaderError as exc:
            return Payment(None, exc.message, exc.header)

    @staticmethod
    def from_object(data: Any, where: str) -> Payment:
        try:
            return Payment(decode_payment_object(data, where))
        except PaymentHeaderError as exc:
            return Payment(None, exc.message, exc.header)


@dataclass
class CallRequest:
    skill_id: str
    payload: dict[str, Any] | None
    resource_url: str
    payment: Payment | None = None
    skill: Skill | None = None  # the skill the face already resolved (saves a second lookup)
    stream: bool = False  # the caller takes chunks as they come, when the skill streams
    operation: str | None = None  # a model's endpoint (chat.completions...); None: the default
    client: str | None = None  # the caller's address (behind PAYWIRE_TRUSTED_PROXIES: the real one)
    route: HttpRoute | None = None  # the face's paid route: its 402 describes it (x402 bazaar)
    # x402 extensions a face that is not an HTTP route adds to its 402 (an MCP tool's bazaar
    # description, agent/mcp/face.py); used when `route` is None
    extensions: Mapping[str, Any] | None = None


def request_digest(skill_id: str, payload: dict[str, Any] | None) -> str:
    """What identifies a call's request: its skill and payload as canonical (key-sorted) JSON.
    orjson at C speed; the standard library where orjson cannot write a value (integers beyond
    64 bits)."""
    call = {"skill": skill_id, "payload": payload or {}}
    try:
        canonical = orjson.dumps(call, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        canonical = json.dumps(call, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(canonical).hexdigest()
