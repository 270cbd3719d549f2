"""How an A2A message names a skill call: one documented convention, used by every A2A path.

- A data part `{"skill": "<id>", "input": {...}, "operation": "..."?}` runs that skill with
  `input` exactly as the matching REST route's body.
- A text-only message with `metadata.skill` set to a chat model runs a one-turn chat.
- A text-only message with no skill goes to the free `help` skill.

Protobuf `Struct`/`Value` carry every number as a double, so whole numbers are coerced back to
integers on read (an `input` of `{"n": 2}` arrives as `2.0`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from a2a.types import Message
from google.protobuf.json_format import MessageToDict

from agent.pipeline.catalogue import HELP_SKILL

# The a2a-x402 extension (its URI and the metadata keys below): defined here once, the card imports it.
X402_EXTENSION = "https://github.com/google-agentic-commerce/a2a-x402/blob/main/spec/v0.2"
# v0.1, as deployed clients send it (the a2a-x402 library of that version) and as its spec names it.
# Same flow and metadata keys; a v0.1 client gets the quote in x402's v1 form (see the executor).
X402_EXTENSION_V01 = "https://github.com/google-a2a/a2a-x402/v0.1"
X402_EXTENSION_V01_SPEC = "https://google-a2a.github.io/A2A/extensions/payments/x402/v0.1"
X402_EXTENSIONS = (X402_EXTENSION, X402_EXTENSION_V01, X402_EXTENSION_V01_SPEC)  # newest first
X402_V01_EXTENSIONS = frozenset({X402_EXTENSION_V01, X402_EXTENSION_V01_SPEC})
STATUS_KEY = "x402.payment.status"
REQUIRED_KEY = "x402.payment.required"
PAYLOAD_KEY = "x402.payment.payload"
RECEIPTS_KEY = "x402.payment.receipts"
ERROR_KEY = "x402.payment.error"
REQUEST_KEY = "paywire.request"  # task metadata: the call a pending payment is for
PAYER_KEY = "paywire.payer"  # task metadata: the wallet that paid (it may read the task too)
TOKEN_KEY = "paywire.taskToken"  # message metadata (in) / result task metadata (out): task token


class MessageError(ValueError):
    """The message does not name a callable skill; `field` says where."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


@dataclass(frozen=True)
class SkillCall:
    skill_id: str
    input: dict[str, Any]
    operation: str | None = None


def coerce_numbers(value: Any) -> Any:
    """Undo protobuf's double-only numbers: integral floats become ints, recursively."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: coerce_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [coerce_numbers(v) for v in value]
    return value


def message_metadata(message: Message) -> dict[str, Any]:
    return coerce_numbers(MessageToDict(message.metadata)) if message.HasField("metadata") else {}


def parse_skill_call(message: Message) -> SkillCall:
    """The skill call a message asks for, or MessageError naming the problem."""
    return parse_skill_call_json(MessageToDict(message))


def parse_skill_call_json(message: dict[str, Any]) -> SkillCall:
    """Same, from a message's JSON in either the 1.0 shape (`{"data": ...}` parts) or the 0.3
    shape (`{"kind": "data", "data": ...}` parts)."""
    parts = message.get("parts")
    if not isinstance(parts, list):
        raise MessageError("message.parts must be a list of parts", "message.parts")
    data_parts, texts = [], []
    for i, part in enumerate(parts):
        if not isinstance(part, dict):
            continue
        if "data" in part:
            data_parts.append((i, coerce_numbers(part["data"])))
        elif isinstance(part.get("text"), str):
            texts.append(part["text"])
    if data_parts:
        index, data = data_parts[0]
        where = f"message.parts[{index}].data"
        if not isinstance(data, dict):
            raise MessageError(
                f"{where} must be an object {{\"skill\": \"<id>\", \"input\": {{...}}}}, "
                f"got {type(data).__name__}", where)
        skill = data.get("skill")
        if not isinstance(skill, str) or not skill:
            raise MessageError(f"{where}.skill must name a skill id (see the agent card)",
                               f"{where}.skill")
        payload = data.get("input", {})
        if not isinstance(payload, dict):
            raise MessageError(f"{where}.input must be a JSON object (the REST body of the skill)",
                               f"{where}.input")
        operation = data.get("operation")
        if operation is not None and not isinstance(operation, str):
            raise MessageError(f"{where}.operation must be a string", f"{where}.operation")
        return SkillCall(skill, payload, operation)
    text = "\n".join(t for t in texts if t)
    metadata = message.get("metadata") if isinstance(message.get("metadata"), dict) else {}
    skill = metadata.get("skill")
    if skill:
        if not isinstance(skill, str):
            raise MessageError("message.metadata.skill must be a skill id", "message.metadata.skill")
        return SkillCall(skill, {"messages": [{"role": "user", "content": text}]},
                         "chat.completions")
    return SkillCall(HELP_SKILL, {"text": text})
