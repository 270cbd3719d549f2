"""Chat (and the chat-shaped legacy routes): validation, quote, and the call itself.

The quote is estimated input tokens (the token-count-508 estimator) x input price plus
`max_tokens` (or the model's default) x output price, rounded up by the pipeline; below the
route's minimum it is the minimum, above its maximum the request is refused with how to bring it
under. Identical requests get identical quotes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from decimal import ROUND_FLOOR, Decimal
from typing import Any

from ..errors import SkillInputError, UpstreamError
from ..skill import Operation, SkillResult, StreamUsage
from ..tokens import estimate_messages
from .upstream import Target, UpstreamClient

ROLES = ("system", "user", "assistant")
MIN_USD = Decimal("0.0001")
MAX_USD = Decimal("0.50")
MILLION = Decimal(1_000_000)

Targets = Callable[[], Sequence[Target]]


def validate_chat(body: dict[str, Any], spec: Any) -> None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise SkillInputError("'messages' must be a non-empty list of {role, content}", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise SkillInputError(f"messages[{i}] must be an object {{role, content}}", f"messages.{i}")
        role = message.get("role")
        if role not in ROLES:
            raise SkillInputError(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}",
                                  f"messages.{i}.role")
        if not isinstance(message.get("content"), str):
            raise SkillInputError(f"messages[{i}].content must be a string", f"messages.{i}.content")
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                   or not 1 <= max_tokens <= spec.max_output_tokens):
        raise SkillInputError(f"'max_tokens' must be a whole number from 1 to "
                              f"{spec.max_output_tokens} for {spec.id}", "max_tokens")
    temperature = body.get("temperature")
    if temperature is not None and (isinstance(temperature, bool)
                                    or not isinstance(temperature, int | float)
                                    or not 0 <= temperature <= 2):
        raise SkillInputError("'temperature' must be a number from 0 to 2", "temperature")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise SkillInputError("'stream' must be true or false", "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise SkillInputError("'stream_options' must be an object", "stream_options")
    n = body.get("n", 1)
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 128:
        raise SkillInputError("'n' must be a whole number from 1 to 128", "n")


def output_budget(body: dict[str, Any], spec: Any) -> int:
    value = body.get("max_tokens", body.get("max_completion_tokens"))
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else spec.default_max_tokens


def chat_price(body: dict[str, Any], spec: Any) -> Decimal:
    input_tokens = estimate_messages(body.get("messages") or [], spec.id).tokens
    in_price, out_price = spec.prices.token_prices(input_tokens)  # long prompts may cost more
    assert in_price is not None and out_price is not None  # the catalog sells priced models only
    choices = body.get("n", 1) if isinstance(body.get("n", 1), int) else 1
    out_tokens = output_budget(body, spec) * choices  # every choice is generated and billed
    usd = (Decimal(input_tokens) * in_price + Decimal(out_tokens) * out_price) / MILLION
    if usd > MAX_USD:
        per_token = out_price / MILLION
        room = (MAX_USD - Decimal(input_tokens) * in_price / MILLION) / per_token
        fit = int(room.to_integral_value(rounding=ROUND_FLOOR)) if per_token else 0
        hint = (f"lower max_tokens to {fit} or less" if fit >= 1
                else "shorten the messages")
        raise SkillInputError(f"this request would cost ${usd:.6f}, above the ${MAX_USD} maximum of "
                              f"this route; {hint}", "max_tokens")
    return max(usd, MIN_USD)


def make_chat_operation(spec: Any, targets: Targets, client: UpstreamClient) -> Operation:
    """The chat.completions endpoint of one model, on its upstreams in preference order."""

    def validate(body: dict[str, Any]) -> None:
        validate_chat(body, spec)

    def price(body: dict[str, Any]) -> Decimal:
        _require(targets, spec)
        return chat_price(body, spec)

    async def run(body: dict[str, Any]) -> SkillResult:
        upstream_body = {**_capped(body, spec), "stream": False}
        answer, target, _ = await client.request(_require(targets, spec), "/chat/completions",
                                                 json_body=upstream_body)
        if not isinstance(answer, dict) or "choices" not in answer:
            raise UpstreamError("the model provider answered without choices", 502)
        answer["model"] = spec.id
        usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else None
        return SkillResult(body=answer, usage=_usage(usage, target),
                           upstream_cost_usd=_cost(usage, spec))

    def stream(body: dict[str, Any]) -> AsyncIterator[Any]:
        return metered_stream(client, _require(targets, spec), "/chat/completions", body, spec)

    return Operation("chat.completions", run, price, validate, stream)


async def metered_stream(client: UpstreamClient, targets: Sequence[Target], path: str,
                         body: dict[str, Any], spec: Any) -> AsyncIterator[Any]:
    """An OpenAI token stream passed through chunk by chunk. The upstream is always asked for its
    usage report (the ledger wants it); the caller sees that report only if it asked for it. The
    last item is a StreamUsage for the pipeline."""
    options = body.get("stream_options") if isinstance(body.get("stream_options"), dict) else {}
    wants_usage = options.get("include_usage") is True
    upstream_body = {**_capped(body, spec), "stream": True,
                     "stream_options": {**options, "include_usage": True}}
    served: list[Target] = []
    usage: dict[str, Any] | None = None
    async for event in client.stream(targets, path, upstream_body, on_start=served.append):
        if "model" in event:
            event["model"] = spec.id
        if "usage" in event:
            if isinstance(event["usage"], dict):
                usage = event["usage"]
            if not wants_usage:
                if not event.get("choices"):
                    continue  # the usage-only last chunk the caller did not ask for
                event = {k: v for k, v in event.items() if k != "usage"}
        yield event
    if served:
        yield StreamUsage(_usage(usage, served[0]), _cost(usage, spec))


def _capped(body: dict[str, Any], spec: Any) -> dict[str, Any]:
    """The quote paid for `max_tokens` (or the model default): the upstream gets that cap too, so
    the answer can never run past what was paid for."""
    if "max_tokens" in body or "max_completion_tokens" in body:
        return body
    return {**body, "max_tokens": spec.default_max_tokens}


def _require(targets: Targets, spec: Any) -> Sequence[Target]:
    """The model's usable upstreams; `targets` raises UpstreamError(503) naming what enables it."""
    return targets()


def _usage(usage: dict[str, Any] | None, target: Target) -> dict[str, Any]:
    return {"provider": target.provider, "upstream_model": target.model, **(usage or {})}


def _cost(usage: dict[str, Any] | None, spec: Any) -> Decimal | None:
    if not usage:
        return None
    prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    in_price, out_price = spec.prices.token_prices(prompt)
    return spec.upstream_cost((prompt * (in_price or 0) + completion * (out_price or 0)) / MILLION)
