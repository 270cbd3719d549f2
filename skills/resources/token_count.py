"""token-count-508: how many tokens a text or chat takes for a model.

Counted locally by skills.tokens, no network, deterministic: exact (``"method": "exact"``)
where the model's own tokenizer runs here (OpenAI's cl100k_base / o200k_base and the other
families skills.tokens lists); for a model whose tokenizer is not published, the exact count
of the nearest real tokenizer times a calibrated multiplier (``"method": "heuristic"``,
``multiplier`` and ``encoding_tokens`` given).

Input, a JSON object with exactly these fields:
- ``model`` (required): non-empty string, at most 200 characters. Unknown models are
  counted as o200k_base, ``known_model`` false, and the answer says so in ``note``.
- exactly one of
  - ``text``: non-empty string, at most 1,000,000 characters, or
  - ``messages``: non-empty list (at most 10,000) of ``{"role": str, "content": str}``
    objects, optionally with ``"name": str``; contents and names together at most
    1,000,000 characters.

Unknown top-level or per-message fields are rejected, not ignored: a typo such as
``"txt"`` or ``"contents"`` fails before the caller pays instead of silently producing
a count for the wrong input.
"""

from __future__ import annotations

import asyncio
from typing import Any

from skills.described import NOT_BLANK, described
from skills.errors import SkillInputError
from skills.tokens import TokenEstimate, counting_may_block, estimate_messages, estimate_tokens

MAX_CHARS = 1_000_000
MAX_MESSAGES = 10_000
MAX_MODEL_CHARS = 200
MAX_ROLE_CHARS = 64
MAX_NAME_CHARS = 256

_FIELDS = ("text", "messages", "model")
_MESSAGE_FIELDS = ("role", "content", "name")


def _fail(message: str, field: str | None) -> SkillInputError:
    return SkillInputError(message, field=field)


def _check_model(payload: dict[str, Any]) -> None:
    if "model" not in payload or payload["model"] is None:
        raise _fail(
            "field 'model' is required: a model name such as 'gpt-4o', 'gpt-4' or"
            " 'claude-sonnet-4-5' (unknown names are counted as o200k_base)",
            "model",
        )
    model = payload["model"]
    if not isinstance(model, str) or not model.strip():
        raise _fail("field 'model' must be a non-empty string such as 'gpt-4o'", "model")
    if len(model) > MAX_MODEL_CHARS:
        raise _fail(
            f"field 'model' is {len(model)} characters; at most {MAX_MODEL_CHARS} are accepted",
            "model",
        )


def _check_text(text: Any) -> None:
    if not isinstance(text, str):
        raise _fail(
            f"field 'text' must be a string, got {type(text).__name__}; send the text to"
            " count, or use 'messages' for a chat",
            "text",
        )
    if not text:
        raise _fail("field 'text' must not be empty", "text")
    if len(text) > MAX_CHARS:
        raise _fail(
            f"field 'text' is {len(text):,} characters; at most {MAX_CHARS:,} are accepted",
            "text",
        )


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise _fail(
            "field 'messages' must be a non-empty list of {\"role\": string, \"content\":"
            " string} objects",
            "messages",
        )
    if len(messages) > MAX_MESSAGES:
        raise _fail(
            f"field 'messages' has {len(messages):,} items; at most {MAX_MESSAGES:,} are"
            " accepted",
            "messages",
        )
    total = 0
    for i, message in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(message, dict):
            raise _fail(
                f"{where} must be an object {{\"role\": string, \"content\": string}}", where
            )
        for key in message:
            if key not in _MESSAGE_FIELDS:
                raise _fail(
                    f"{where}.{key} is not accepted: a message has 'role', 'content' and"
                    " optionally 'name'",
                    f"{where}.{key}",
                )
        role = message.get("role")
        if not isinstance(role, str) or not role.strip() or len(role) > MAX_ROLE_CHARS:
            raise _fail(
                f"{where}.role must be a non-empty string of at most {MAX_ROLE_CHARS}"
                " characters, such as 'system', 'user' or 'assistant'",
                f"{where}.role",
            )
        if "content" not in message or not isinstance(message["content"], str):
            raise _fail(
                f"{where}.content must be a string (the message text; it may be empty)",
                f"{where}.content",
            )
        total += len(message["content"])
        if "name" in message:
            name = message["name"]
            if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
                raise _fail(
                    f"{where}.name must be a non-empty string of at most {MAX_NAME_CHARS}"
                    " characters, or be left out",
                    f"{where}.name",
                )
            total += len(name)
        if total > MAX_CHARS:
            raise _fail(
                f"field 'messages' holds more than {MAX_CHARS:,} characters of content",
                "messages",
            )


_WORD = {"type": "string", "pattern": NOT_BLANK}  # not empty, not only spaces (`.strip()`)
_MESSAGE_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["role", "content"],
                   "properties": dict(zip(_MESSAGE_FIELDS, (
                       {**_WORD, "maxLength": MAX_ROLE_CHARS}, {"type": "string"},
                       {"type": "string", "minLength": 1, "maxLength": MAX_NAME_CHARS}), strict=True))}
# What `validate` enforces, as JSON Schema (all but the 1,000,000 characters of a chat in all: a sum)
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["model"],
          "oneOf": [{"required": ["text"]}, {"required": ["messages"]}],
          "properties": dict(zip(_FIELDS, (
              {"type": "string", "minLength": 1, "maxLength": MAX_CHARS},
              {"type": "array", "minItems": 1, "maxItems": MAX_MESSAGES, "items": _MESSAGE_SCHEMA},
              {**_WORD, "maxLength": MAX_MODEL_CHARS}), strict=True))}


@described(SCHEMA)
def validate(payload: dict[str, Any]) -> None:
    """Raise SkillInputError naming the offending field if ``payload`` cannot run."""
    if not isinstance(payload, dict):
        raise _fail(
            "the input must be a JSON object with 'model' and either 'text' or 'messages'", None
        )
    for key in payload:
        if key not in _FIELDS:
            raise _fail(
                f"field '{key}' is not accepted: send 'model' and either 'text' or 'messages'",
                str(key),
            )
    has_text, has_messages = "text" in payload, "messages" in payload
    if has_text == has_messages:
        which = "both were given" if has_text else "neither was given"
        raise _fail(
            f"send exactly one of 'text' (a string) or 'messages' (a chat list); {which}",
            "text",
        )
    _check_model(payload)
    if has_text:
        _check_text(payload["text"])
    else:
        _check_messages(payload["messages"])


def _estimate(payload: dict[str, Any]) -> TokenEstimate:
    if "text" in payload:
        return estimate_tokens(payload["text"], payload["model"])
    return estimate_messages(payload["messages"], payload["model"])


async def run(payload: dict[str, Any]) -> dict[str, Any]:
    """Count the tokens of ``payload`` (validated again: run may be called directly)."""
    validate(payload)
    size = len(payload["text"]) if "text" in payload else sum(
        len(m["content"]) for m in payload["messages"]
    )
    if counting_may_block(payload["model"], size):  # a long text, or a tokenizer to load
        estimate = await asyncio.to_thread(_estimate, payload)
    else:
        estimate = _estimate(payload)
    body: dict[str, Any] = {
        "model": payload["model"],
        "tokens": estimate.tokens,
        "encoding": estimate.encoding,
        "model_family": estimate.model_family,
        "method": estimate.method,
        "known_model": estimate.known_model,
        "input": "text" if "text" in payload else "messages",
        "characters": estimate.characters,
        "words": estimate.words,
        "note": estimate.note,
    }
    if estimate.method == "heuristic":
        # the count is encoding_tokens x multiplier (framing excepted, for messages)
        body["multiplier"] = estimate.multiplier
        body["encoding_tokens"] = estimate.base_tokens
    if estimate.messages is not None:
        body["messages"] = estimate.messages
    return body
