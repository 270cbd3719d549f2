"""The legacy text endpoints of a model: completions, edits (run as a chat call) and embeddings.

Quotes follow chat's rules (chat.py): estimated input tokens x input price plus the output budget
(`max_tokens`, or the model's default) x output price, refused above the route's maximum with how
to bring it under, charged at least the minimum. What differs is only what is counted: a legacy
prompt is plain text (no chat framing); `n`/`best_of` and each prompt of an array get their own
completion, so the output budget is multiplied by them; embeddings have no output.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from decimal import ROUND_FLOOR, Decimal
from typing import Any

from ..errors import SkillInputError, UpstreamError
from ..skill import Operation, SkillResult
from ..tokens import estimate_messages, estimate_tokens
from .chat import (
    MAX_USD,
    MILLION,
    MIN_USD,
    Targets,
    _capped,
    _cost,
    _usage,
    metered_stream,
    output_budget,
    validate_chat,
)
from .upstream import UpstreamClient

MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit on the items of one embeddings request
MAX_CHOICES = 128  # OpenAI's upper bound for `n` and `best_of`
# Stands in for `messages` when chat's validator checks the sampling fields of a non-chat body.
_NEUTRAL_MESSAGES = [{"role": "user", "content": ""}]


def token_quote(spec: Any, input_tokens: int, output_tokens: int, *, choices: int = 1,
                input_param: str, shorten: str) -> Decimal:
    """USD for `input_tokens` in and `choices` x `output_tokens` out, within the route's range.

    With choices=1 this is chat_price's arithmetic; above MAX_USD the refusal says which
    `max_tokens` would fit, or what to `shorten` (at `input_param`) when no output budget would.
    """
    in_price, out_price = spec.prices.token_prices(input_tokens)  # long prompts may cost more
    assert in_price is not None  # the catalog sells priced models only
    per_output = (out_price or Decimal(0)) * choices / MILLION  # embeddings have no output price
    input_usd = Decimal(input_tokens) * in_price / MILLION
    usd = input_usd + output_tokens * per_output
    if usd > MAX_USD:
        room = (MAX_USD - input_usd) / per_output if per_output else Decimal(0)
        fit = int(room.to_integral_value(rounding=ROUND_FLOOR))
        where, hint = (("max_tokens", f"lower max_tokens to {fit} or less") if fit >= 1
                       else (input_param, shorten))
        raise SkillInputError(f"this request would cost ${usd:.6f}, above the ${MAX_USD} maximum of "
                              f"this route; {hint}", where)
    return max(usd, MIN_USD)


def _validate_sampling(body: dict[str, Any], spec: Any) -> None:
    """max_tokens, temperature, stream, stream_options: chat's own checks, so the rules match."""
    validate_chat({**body, "messages": _NEUTRAL_MESSAGES}, spec)
    for name in ("n", "best_of"):
        value = body.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or not 1 <= value <= MAX_CHOICES):
            raise SkillInputError(f"'{name}' must be a whole number from 1 to {MAX_CHOICES}", name)


def _strings(value: Any, name: str, *, allow_empty: bool) -> list[str]:
    """A string or a non-empty array of strings, as a list. Token arrays are refused: the upstreams
    behind one model do not share a tokenizer, so token ids cannot be priced or passed on safely."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise SkillInputError(f"'{name}' must be a string or a non-empty array of strings", name)
    for i, item in enumerate(items):
        where = name if isinstance(value, str) else f"{name}.{i}"
        if not isinstance(item, str):
            raise SkillInputError(f"'{name}' accepts strings only (not token ids or other values); "
                                  f"{where} is {type(item).__name__}", where)
        if not item and not allow_empty:
            raise SkillInputError(f"{where} is empty; send some text", where)
    return items


def _choices_of(answer: Any) -> list[Any]:
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list):
        raise UpstreamError("the model provider answered without choices", 502)
    return choices


# ---- completions ---------------------------------------------------------------------------------


def validate_completions(body: dict[str, Any], spec: Any) -> None:
    if "prompt" not in body:
        raise SkillInputError("'prompt' is required: a string or an array of strings", "prompt")
    _strings(body["prompt"], "prompt", allow_empty=True)  # "" is a valid legacy prompt
    _validate_sampling(body, spec)
    n, best_of = body.get("n") or 1, body.get("best_of")
    if best_of is not None and best_of < n:
        raise SkillInputError("'best_of' must be greater than or equal to 'n'", "best_of")
    if best_of not in (None, 1) and body.get("stream") is True:
        raise SkillInputError("'best_of' cannot be used with 'stream'", "best_of")


def completions_price(body: dict[str, Any], spec: Any) -> Decimal:
    prompt = body.get("prompt", "")
    prompts = [prompt] if isinstance(prompt, str) else [p for p in prompt if isinstance(p, str)]
    input_tokens = sum(estimate_tokens(p, spec.id).tokens for p in prompts)
    # every prompt gets max(n, best_of) completions generated upstream, each up to the budget
    choices = max(1, len(prompts)) * max(body.get("n") or 1, body.get("best_of") or 1)
    return token_quote(spec, input_tokens, output_budget(body, spec), choices=choices,
                       input_param="prompt", shorten="shorten the prompt")


def make_completions_operation(spec: Any, targets: Targets, client: UpstreamClient) -> Operation:
    """POST /v1/completions of one model: the legacy prompt API, passed through to its upstreams."""

    def validate(body: dict[str, Any]) -> None:
        validate_completions(body, spec)

    def price(body: dict[str, Any]) -> Decimal:
        targets()  # 503 naming what enables the model, before any quote
        return completions_price(body, spec)

    async def run(body: dict[str, Any]) -> SkillResult:
        answer, target, _ = await client.request(targets(), "/completions",
                                                 json_body={**_capped(body, spec), "stream": False})
        _choices_of(answer)
        answer["model"] = spec.id
        usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else None
        return SkillResult(body=answer, usage=_usage(usage, target), upstream_cost_usd=_cost(usage, spec))

    def stream(body: dict[str, Any]) -> AsyncIterator[Any]:
        return metered_stream(client, targets(), "/completions", body, spec)

    return Operation("completions", run, price, validate, stream)


# ---- edits ---------------------------------------------------------------------------------------

# Fields of a legacy edit request that mean the same in a chat request.
_EDIT_PASSTHROUGH = ("temperature", "top_p", "n", "max_tokens", "max_completion_tokens", "user")


def validate_edits(body: dict[str, Any], spec: Any) -> None:
    instruction = body.get("instruction")
    if not isinstance(instruction, str) or not instruction.strip():
        raise SkillInputError("'instruction' is required: a non-empty string telling the model how "
                              "to edit the input", "instruction")
    if not isinstance(body.get("input", ""), str):
        raise SkillInputError("'input' must be a string (the text to edit)", "input")
    if body.get("stream") is True:  # the edits API never streamed; say so rather than ignore it
        raise SkillInputError("/v1/edits does not stream; leave 'stream' out or use "
                              "/v1/chat/completions", "stream")
    _validate_sampling(body, spec)


def edit_messages(body: dict[str, Any]) -> list[dict[str, str]]:
    return [{"role": "system", "content": str(body.get("instruction", ""))},
            {"role": "user", "content": str(body.get("input", ""))}]


def edits_price(body: dict[str, Any], spec: Any) -> Decimal:
    # the call is a chat call: its messages are counted as chat counts them (framing included)
    input_tokens = estimate_messages(edit_messages(body), spec.id).tokens
    return token_quote(spec, input_tokens, output_budget(body, spec), choices=body.get("n") or 1,
                       input_param="input", shorten="shorten the instruction or the input")


def make_edits_operation(spec: Any, targets: Targets, client: UpstreamClient) -> Operation:
    """POST /v1/edits of one model: a chat call (system: instruction, user: input), answered in the
    legacy edit shape."""

    def validate(body: dict[str, Any]) -> None:
        validate_edits(body, spec)

    def price(body: dict[str, Any]) -> Decimal:
        targets()
        return edits_price(body, spec)

    async def run(body: dict[str, Any]) -> SkillResult:
        chat = {"messages": edit_messages(body), "stream": False,
                **{k: body[k] for k in _EDIT_PASSTHROUGH if k in body}}
        answer, target, _ = await client.request(targets(), "/chat/completions", json_body=chat)
        choices = []
        for i, choice in enumerate(_choices_of(answer)):
            message = choice.get("message") if isinstance(choice, dict) else None
            text = message.get("content") if isinstance(message, dict) else None
            if not isinstance(text, str):
                raise UpstreamError("the model provider answered a choice without text", 502)
            choices.append({"text": text, "index": choice.get("index", i)})
        usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else None
        created = answer.get("created")
        edit = {"object": "edit", "created": created if isinstance(created, int) else int(time.time()),
                "choices": choices,
                "usage": {k: int((usage or {}).get(k) or 0)
                          for k in ("prompt_tokens", "completion_tokens", "total_tokens")}}
        return SkillResult(body=edit, usage=_usage(usage, target), upstream_cost_usd=_cost(usage, spec))

    return Operation("edits", run, price, validate)


# ---- embeddings ----------------------------------------------------------------------------------


def validate_embeddings(body: dict[str, Any], spec: Any) -> None:
    if "input" not in body:
        raise SkillInputError("'input' is required: a string or an array of strings", "input")
    inputs = _strings(body["input"], "input", allow_empty=False)
    if len(inputs) > MAX_EMBEDDING_INPUTS:
        raise SkillInputError(f"'input' has {len(inputs)} items; send at most {MAX_EMBEDDING_INPUTS} "
                              "per request", "input")
    if body.get("encoding_format", "float") not in ("float", "base64"):
        raise SkillInputError("'encoding_format' must be 'float' or 'base64'", "encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and (not isinstance(dimensions, int) or isinstance(dimensions, bool)
                                   or dimensions < 1):
        raise SkillInputError("'dimensions' must be a positive whole number", "dimensions")


def embeddings_price(body: dict[str, Any], spec: Any) -> Decimal:
    raw = body.get("input", "")
    inputs = [raw] if isinstance(raw, str) else [t for t in raw if isinstance(t, str)]
    input_tokens = sum(estimate_tokens(t, spec.id).tokens for t in inputs)
    return token_quote(spec, input_tokens, 0, input_param="input", shorten="send fewer or shorter inputs")


def make_embeddings_operation(spec: Any, targets: Targets, client: UpstreamClient) -> Operation:
    """POST /v1/embeddings of one model; `encoding_format` and `dimensions` go to the upstream as
    given, so a base64 answer is passed through untouched."""

    def validate(body: dict[str, Any]) -> None:
        validate_embeddings(body, spec)

    def price(body: dict[str, Any]) -> Decimal:
        targets()
        return embeddings_price(body, spec)

    async def run(body: dict[str, Any]) -> SkillResult:
        answer, target, _ = await client.request(targets(), "/embeddings", json_body=body)
        if not isinstance(answer, dict) or not isinstance(answer.get("data"), list):
            raise UpstreamError("the model provider answered without embeddings", 502)
        answer["model"] = spec.id
        usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else None
        cost = None
        if usage and spec.prices.input_per_mtok is not None:
            cost = spec.upstream_cost(
                Decimal(int(usage.get("prompt_tokens") or 0)) * spec.prices.input_per_mtok / MILLION)
        return SkillResult(body=answer, usage=_usage(usage, target), upstream_cost_usd=cost)

    return Operation("embeddings", run, price, validate)


FACTORIES: dict[str, Any] = {
    "completions": make_completions_operation,
    "edits": make_edits_operation,
    "embeddings": make_embeddings_operation,
}
