"""Chat (and the chat-shaped legacy routes): validation, quote, and the call itself.

The quote is token_quotes.py's rule: every input the upstream bills as prompt (the messages with
their names, tools, functions, tool_choice, response_format; the token-count-508 estimator) x input
price plus the paid output (the cap x n) x output price, rounded up by the pipeline; below the
route's minimum it is the minimum, above its maximum the request is refused with how to bring it
under. The upstream body is built from CHAT_FIELDS only and carries exactly the paid cap, in the
caller's field or (none named) in the field the serving upstream takes (its provider's `cap_field`);
fields the upstream would bill beyond that are refused. Identical requests get identical quotes.

A call is charged what it used, never more than its quote (token_quotes.token_charge): the answer's
usage report, or the quoted input and the delivered text counted. A stream is a MeteredStream: its
last item says what it used, and `used()` says it at any point (a caller that left part way).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Hashable
from decimal import Decimal
from typing import Any

from ..errors import SkillInputError, UpstreamError
from ..skill import Operation, SkillResult, StreamUsage
from ..tokens import estimate_messages
from .request_fields import (
    BUDGET,
    FREE,
    PRICED,
    REFUSED,
    Check,
    Field,
    FieldTable,
    array_of,
    boolean,
    described,
    integer,
    nullable,
    obj,
    one_of,
    only,
    schema_of,
    text,
)
from .spec import ModelSpec
from .token_quotes import (
    CHOICES,
    MAX_USD,
    MIN_USD,
    SAMPLING,
    TOKEN_RULE,
    Input,
    OutputBudget,
    OutputText,
    TokenQuote,
    budget_schema,
    json_tokens,
    output_budget,
    quote_of,
    token_charge,
    token_cost,
    token_quote,
    usage_record,
)
from .upstream import JsonBody, Target, Targets
from .upstream_port import Upstream

ROLES = ("system", "user", "assistant")
MESSAGE_KEYS = ("role", "content", "name")
MAX_MESSAGES = 2048
MAX_NAME = 64  # a message's or a function's name
MAX_TOOLS = 128  # OpenAI's limit on tools (and functions) per request
MAX_DESCRIPTION = 1 << 20  # (the body limit bounds it first on REST)
EFFORTS = ("none", "minimal", "low", "medium", "high")
# Reasoning budgets, spent inside the paid cap: field -> its budget key (OpenRouter's `reasoning`,
# Anthropic's OpenAI-compatible `thinking`). OpenAI's reasoning_effort is a free option: its
# reasoning tokens are output tokens, bounded by the cap.
REASONING_BUDGETS = {"reasoning": "max_tokens", "thinking": "budget_tokens"}
# Inputs the upstream bills as prompt besides the messages, counted as their JSON text.
JSON_INPUTS = {"tools": "send fewer or shorter tools", "functions": "send fewer or shorter functions",
               "tool_choice": "shorten tool_choice", "function_call": "shorten function_call",
               "response_format": "shorten the response_format schema"}


def _or_mode(modes: tuple[str, ...], named: Check) -> Check:
    """A mode string (auto, none...) or an object naming a function."""
    @described({"anyOf": [{"enum": list(modes)}, schema_of(named) or {}]})
    def check(value: Any, name: str) -> None:
        if isinstance(value, str):
            one_of(*modes)(value, name)
        else:
            named(value, name)

    return check


@described({"type": "array", "items": {"const": "text"}, "maxItems": 1})
def _modalities(value: Any, name: str) -> None:
    if value != ["text"] and value != []:
        raise SkillInputError(f"'{name}' may only be [\"text\"]: audio output is billed as audio tokens, "
                              "which paywire does not price", name)


_NAME = text(MAX_NAME)


@described({"type": "array", "minItems": 1, "maxItems": MAX_MESSAGES, "items": {
    "type": "object", "required": ["role", "content"], "additionalProperties": False,
    "properties": dict(zip(MESSAGE_KEYS, ({"enum": list(ROLES)}, {"type": "string"},
                                          nullable(schema_of(_NAME))), strict=True))}})
def _messages(messages: Any, name: str) -> None:
    """The chat: 1 to MAX_MESSAGES text messages {role, content, name?} (what the quote counts)."""
    if not isinstance(messages, list) or not messages:
        raise SkillInputError(f"'{name}' must be a non-empty list of {{role, content}}", name)
    if len(messages) > MAX_MESSAGES:
        raise SkillInputError(f"'{name}' has {len(messages)} messages; send at most {MAX_MESSAGES}", name)
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise SkillInputError(f"{name}[{i}] must be an object {{role, content}}", f"{name}.{i}")
        role = message.get("role")
        if role not in ROLES:
            raise SkillInputError(f"{name}[{i}].role must be one of {', '.join(ROLES)}, got {role!r}",
                                  f"{name}.{i}.role")
        if not isinstance(message.get("content"), str):
            raise SkillInputError(f"{name}[{i}].content must be a string", f"{name}.{i}.content")
        for key in message:
            if key not in MESSAGE_KEYS:
                raise SkillInputError(f"{name}[{i}] has '{key}'; a message takes only "
                                      f"{', '.join(MESSAGE_KEYS)} (text content)", f"{name}.{i}.{key}")
        if message.get("name") is not None:
            _NAME(message["name"], f"{name}.{i}.name")


_FUNCTION = obj({"name": _NAME, "description": text(MAX_DESCRIPTION, empty=True),
                 "parameters": obj(), "strict": boolean}, required=("name",))
_NAMED = obj({"name": _NAME}, required=("name",))
_TOOL = obj({"type": one_of("function", why="built-in tools (web search, file search...) are billed "
                            "per call by the upstream, which paywire does not price"),
             "function": _FUNCTION}, required=("type", "function"))
_RESPONSE_FORMAT = obj({
    "type": one_of("text", "json_object", "json_schema"),
    "json_schema": obj({"name": _NAME, "description": text(MAX_DESCRIPTION, empty=True),
                        "schema": obj(), "strict": boolean}, required=("name",)),
}, required=("type",))

# What /v1/chat/completions accepts (request_fields.py says what the kinds mean).
CHAT_FIELDS = FieldTable("/v1/chat/completions", {
    **SAMPLING,
    "messages": Field(PRICED, _messages, required=True),  # estimated with chat framing and names
    "tools": Field(PRICED, array_of(_TOOL, MAX_TOOLS, "function tools")),
    "functions": Field(PRICED, array_of(_FUNCTION, MAX_TOOLS, "functions")),
    "tool_choice": Field(PRICED, _or_mode(("none", "auto", "required"), obj(
        {"type": one_of("function"), "function": _NAMED}, required=("type", "function")))),
    "function_call": Field(PRICED, _or_mode(("none", "auto"), _NAMED)),
    "response_format": Field(PRICED, _RESPONSE_FORMAT),
    "max_tokens": Field(BUDGET),  # (checked with the budget: token_quotes.output_budget)
    "max_completion_tokens": Field(BUDGET),
    "n": Field(BUDGET, CHOICES),
    "reasoning": Field(BUDGET, obj({"effort": one_of(*EFFORTS), "max_tokens": None,
                                    "exclude": boolean, "enabled": boolean})),
    "thinking": Field(BUDGET, obj({"type": one_of("enabled", "disabled"), "budget_tokens": None},
                                  required=("type",))),
    "reasoning_effort": Field(FREE, one_of(*EFFORTS)),
    "verbosity": Field(FREE, one_of("low", "medium", "high")),
    "logprobs": Field(FREE, boolean),
    "top_logprobs": Field(FREE, integer(0, 20)),
    "parallel_tool_calls": Field(FREE, boolean),
    "service_tier": Field(FREE, one_of("auto", "default", why="other tiers (priority, flex, scale) are "
                                       "billed at other rates, which paywire does not price")),
    "modalities": Field(FREE, _modalities),
    "store": Field(FREE, only(False, "may only be false: a stored completion would be kept on "
                                    "paywire's upstream account")),
    "safety_identifier": Field(FREE, text(256)),
    "prompt_cache_key": Field(FREE, text(256)),
    "audio": Field(REFUSED, why="audio output is billed as audio tokens"),
    "prediction": Field(REFUSED, why="a predicted output's rejected tokens are billed as output beyond "
                                     "the paid cap"),
    "web_search_options": Field(REFUSED, why="web search is billed per call by the upstream"),
    "search_parameters": Field(REFUSED, why="live search is billed per source by the upstream"),
    "plugins": Field(REFUSED, why="plugins (web search, file parsing) are billed per call by the upstream"),
    "models": Field(REFUSED, why="fallback models are billed at their own prices"),
})


def validate_chat(body: dict[str, Any], spec: ModelSpec) -> None:
    CHAT_FIELDS.check(body)
    output_budget(body, spec, inner=REASONING_BUDGETS)


def chat_inputs(body: dict[str, Any], spec: ModelSpec) -> list[Input]:
    """What the upstream bills as prompt: the messages (chat framing and names included), then the
    tools, functions, tool_choice and response_format as their JSON text."""
    parts = [Input("messages", estimate_messages(body.get("messages") or [], spec.id).tokens,
                   "shorten the messages")]
    for name, shorten in JSON_INPUTS.items():
        if isinstance(body.get(name), dict | list):
            parts.append(Input(name, json_tokens(body[name], spec.id), shorten))
    return parts


def chat_quote_parts(body: dict[str, Any], spec: ModelSpec) -> tuple[list[Input], OutputBudget]:
    """What a chat quote counts: the inputs and the paid output."""
    return chat_inputs(body, spec), output_budget(body, spec, inner=REASONING_BUDGETS)


def chat_price(body: dict[str, Any], spec: ModelSpec) -> Decimal:
    return token_quote(spec, *chat_quote_parts(body, spec))


def chat_upstream_parts(body: dict[str, Any], spec: ModelSpec
                        ) -> tuple[dict[str, Any], OutputBudget, TokenQuote]:
    """What an upstream gets: CHAT_FIELDS' fields only (the first item, the same for every upstream),
    with exactly the paid output budget, whose fields may differ per upstream: the cap in the
    caller's field, or, when it named none, in the one that upstream takes
    (`budget.upstream(target.cap_field)`); and the call's quote, which caps its charge."""
    inputs, budget = chat_quote_parts(body, spec)
    return CHAT_FIELDS.forward(body), budget, quote_of(spec, inputs, budget)


def add_message_text(text: OutputText, choice: Any, message: Any) -> None:
    """A chat choice's generated text, from its `message` (an answer) or `delta` (a stream chunk):
    content, refusal, reasoning (OpenRouter's `reasoning`, vLLM's and DeepSeek's
    `reasoning_content`), each tool call's name and arguments, a legacy function_call's."""
    if not isinstance(message, dict):
        return
    for key in ("content", "refusal", "reasoning", "reasoning_content"):
        text.add((choice, key), message.get(key))
    calls = message.get("tool_calls")
    for i, call in enumerate(calls if isinstance(calls, list) else ()):
        if isinstance(call, dict):
            where = call.get("index", i)  # (a stream's tool-call deltas name their call's index)
            _add_function(text, (choice, "tool", where if isinstance(where, Hashable) else i),
                          call.get("function"))
    _add_function(text, (choice, "function_call"), message.get("function_call"))


def _add_function(text: OutputText, part: tuple[Any, ...], function: Any) -> None:
    if isinstance(function, dict):
        text.add((*part, "name"), function.get("name"))
        text.add((*part, "arguments"), function.get("arguments"))


def answer_text(answer: dict[str, Any]) -> OutputText:
    """The text of a chat answer's choices."""
    text = OutputText()
    for i, choice in enumerate(answer.get("choices") or ()):
        if isinstance(choice, dict):
            add_message_text(text, choice.get("index", i), choice.get("message"))
    return text


def make_chat_operation(spec: ModelSpec, targets: Targets, client: Upstream) -> Operation:
    """The chat.completions endpoint of one model, on its upstreams in preference order."""

    def validate(body: dict[str, Any]) -> None:
        validate_chat(body, spec)

    def price(body: dict[str, Any]) -> Decimal:
        return chat_price(body, spec)

    async def run(body: dict[str, Any]) -> SkillResult:
        common, budget, quote = chat_upstream_parts(body, spec)
        common.pop("stream_options", None)  # (only allowed with a stream)
        common["stream"] = False
        answer, target, _ = await client.request(targets, "/chat/completions",
                                                 json_body=lambda t: {**common,
                                                                      **budget.upstream(t.cap_field)})
        if not isinstance(answer, dict) or "choices" not in answer:
            raise UpstreamError("the model provider answered without choices")
        answer["model"] = spec.id
        usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else None
        charge = token_charge(spec, quote, usage, lambda: answer_text(answer).tokens(spec.id))
        return SkillResult(body=answer, usage=usage_record(usage, target, charge),
                           upstream_cost_usd=token_cost(usage, spec), charge_usd=charge.usd)

    def stream(body: dict[str, Any]) -> MeteredStream:
        common, budget, quote = chat_upstream_parts(body, spec)
        return MeteredStream(client, targets, "/chat/completions", common, spec, quote,
                             per_upstream=lambda t: budget.upstream(t.cap_field))

    return Operation("chat.completions", run, price, validate, stream,
                     price_floor_usd=MIN_USD, price_cap_usd=MAX_USD, price_rule=TOKEN_RULE,
                     request_schema=budget_schema(spec, REASONING_BUDGETS))


def _chat_chunk_text(text: OutputText, event: dict[str, Any]) -> None:
    for i, choice in enumerate(event.get("choices") or ()):
        if isinstance(choice, dict):
            add_message_text(text, choice.get("index", i), choice.get("delta"))


ChunkText = Callable[[OutputText, dict[str, Any]], None]  # what a stream's chunk delivered
Echoed = Callable[[Hashable], str]  # a delivered part's prefix that is not output (an echo)


class MeteredStream:
    """An OpenAI token stream passed through chunk by chunk, metered on the way; `upstream` is the
    route's upstream body (paid cap included, or given per upstream by `per_upstream`). The upstream
    is always asked for its usage report (the charge and the ledger want it); the caller sees that
    report only if it asked for it. The last item is a StreamUsage for the pipeline. `used()` is
    what was used up to now, at any point: a stream closed part way (its caller left) or broken
    off is charged for the chunks it passed on, counted, as the upstream's report never came."""

    def __init__(self, client: Upstream, targets: Targets, path: str, upstream: dict[str, Any],
                 spec: ModelSpec, quote: TokenQuote, *,
                 per_upstream: Callable[[Target], dict[str, Any]] | None = None,
                 chunk_text: ChunkText = _chat_chunk_text, echoed: Echoed | None = None) -> None:
        self._spec, self._quote, self._chunk_text, self._echoed = spec, quote, chunk_text, echoed
        self._served: list[Target] = []
        self._usage: dict[str, Any] | None = None
        self._text = OutputText()
        self._events = self._metered(client, targets, path, upstream, per_upstream)

    def __aiter__(self) -> MeteredStream:
        return self

    async def __anext__(self) -> Any:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        """Cut the stream (the upstream call with it); `used()` stays readable."""
        await self._events.aclose()

    def used(self) -> StreamUsage:
        """What the stream used so far: the upstream's usage report, or (none came) the quoted input
        and the text passed on, counted; priced, and capped at the quote."""
        charge = token_charge(self._spec, self._quote, self._usage,
                              lambda: self._text.tokens(self._spec.id, self._echoed))
        record = usage_record(self._usage, self._served[0], charge) if self._served else None
        return StreamUsage(record, token_cost(self._usage, self._spec), charge_usd=charge.usd)

    async def _metered(self, client: Upstream, targets: Targets, path: str, upstream: dict[str, Any],
                       per_upstream: Callable[[Target], dict[str, Any]] | None) -> AsyncIterator[Any]:
        given = upstream.get("stream_options")
        options: dict[str, Any] = given if isinstance(given, dict) else {}
        wants_usage = options.get("include_usage") is True
        base = {**upstream, "stream": True, "stream_options": {**options, "include_usage": True}}
        upstream_body: JsonBody = base if per_upstream is None else (
            lambda target: {**base, **per_upstream(target)})
        async for event in client.stream(targets, path, upstream_body, on_start=self._served.append):
            if "model" in event:
                event["model"] = self._spec.id
            self._chunk_text(self._text, event)
            if "usage" in event:
                if isinstance(event["usage"], dict):
                    self._usage = event["usage"]
                if not wants_usage:
                    if not event.get("choices"):
                        continue  # the usage-only last chunk the caller did not ask for
                    event = {k: v for k, v in event.items() if k != "usage"}
            yield event
        if self._served:
            yield self.used()
