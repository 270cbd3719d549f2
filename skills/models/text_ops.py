"""The legacy text endpoints of a model: completions, edits (run as a chat call) and embeddings.

Quotes follow chat's rule (token_quotes.py): estimated input tokens x input price plus the paid output
(the cap: `max_tokens`, or the model's default) x output price, refused above the route's maximum with
how to bring it under, charged at least the minimum. What differs is only what is counted: a legacy
prompt is plain text (no chat framing), every prompt of a batch is counted and so is the `suffix` each
one gets; `n`/`best_of` and each prompt of an array get their own completions, so the cap is multiplied
by them; embeddings have no output. Each route's upstream body is built from its field table (what it
accepts, request_fields.py) with exactly the paid cap; anything else is refused, naming the field.
Each call is charged what it used, never more than its quote (token_quotes.token_charge).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from decimal import Decimal
from typing import Any

from ..described import NOT_BLANK
from ..errors import SkillInputError, UpstreamError
from ..json_numbers import whole
from ..skill import Operation, SkillResult
from ..tokens import estimate_messages, estimate_tokens
from .chat import MeteredStream, add_message_text
from .request_fields import (
    BUDGET,
    FREE,
    MAX_TEXT,
    PRICED,
    Check,
    Field,
    FieldTable,
    boolean,
    described,
    integer,
    one_of,
    only,
    text,
)
from .spec import ModelSpec
from .token_quotes import (
    CHOICES,
    EMBEDDINGS_RULE,
    MAX_USD,
    MIN_USD,
    SAMPLING,
    TOKEN_RULE,
    Input,
    OutputBudget,
    OutputText,
    TokenQuote,
    budget_schema,
    output_budget,
    quote_of,
    token_charge,
    token_cost,
    token_quote,
    usage_record,
)
from .upstream import Targets
from .upstream_port import Upstream

MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit on the items of one embeddings request
MAX_PROMPTS = 2048  # prompts of one completions batch


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


def _texts(max_items: int, *, allow_empty: bool, what: str) -> Check:
    """A string, or an array of 1 to `max_items` strings (`what` names them); empty ones allowed or
    not."""
    one = {"type": "string", **({} if allow_empty else {"minLength": 1})}

    @described({"anyOf": [one, {"type": "array", "items": one, "minItems": 1, "maxItems": max_items}]})
    def check(value: Any, name: str) -> None:
        items = _strings(value, name, allow_empty=allow_empty)
        if len(items) > max_items:
            raise SkillInputError(f"'{name}' has {len(items)} {what}; send at most {max_items} per "
                                  "request", name)

    return check


@described({"type": "string", "pattern": NOT_BLANK})
def _instruction(value: Any, name: str) -> None:
    if not isinstance(value, str) or not value.strip():
        raise SkillInputError(f"'{name}' is required: a non-empty string telling the model how to edit "
                              "the input", name)


@described({"if": {"properties": {"stream": {"const": True}}, "required": ["stream"]},
            "then": {"properties": {"best_of": {"enum": [None, 1]}}}})
def _best_of_not_streamed(body: Any, name: str) -> None:
    if body.get("best_of") not in (None, 1) and body.get("stream") is True:
        raise SkillInputError("'best_of' cannot be used with 'stream'", "best_of")


def _best_of_covers_n(body: Any, name: str) -> None:  # (a comparison: JSON Schema cannot say it)
    n, best_of = body.get("n") or 1, body.get("best_of")
    if best_of is not None and best_of < n:
        raise SkillInputError("'best_of' must be greater than or equal to 'n'", "best_of")


# What each route accepts (request_fields.py says what the kinds mean).
COMPLETIONS_FIELDS = FieldTable("/v1/completions", {
    **SAMPLING,
    "prompt": Field(PRICED, _texts(MAX_PROMPTS, allow_empty=True, what="prompts"),  # ("" is valid)
                    required=True),
    "suffix": Field(PRICED, text(MAX_TEXT, empty=True)),  # appended to every prompt: counted per prompt
    "max_tokens": Field(BUDGET),
    "n": Field(BUDGET, CHOICES),
    "best_of": Field(BUDGET, CHOICES),  # generates best_of completions per prompt, each up to the cap
    "echo": Field(FREE, boolean),
    "logprobs": Field(FREE, integer(0, 5)),
}, rules=(_best_of_not_streamed, _best_of_covers_n))
EDITS_FIELDS = FieldTable("/v1/edits", {
    "model": SAMPLING["model"], "temperature": SAMPLING["temperature"], "top_p": SAMPLING["top_p"],
    "user": SAMPLING["user"],
    "instruction": Field(PRICED, _instruction, required=True),  # (sent as the system message)
    "input": Field(PRICED, text(MAX_TEXT, empty=True)),  # (sent as the user message)
    "max_tokens": Field(BUDGET),
    "max_completion_tokens": Field(BUDGET),
    "n": Field(BUDGET, CHOICES),
    "stream": Field(FREE, only(False, "is not supported: /v1/edits does not stream; leave 'stream' out "
                                      "or use /v1/chat/completions")),
})
EMBEDDINGS_FIELDS = FieldTable("/v1/embeddings", {
    "model": SAMPLING["model"], "user": SAMPLING["user"],
    "input": Field(PRICED, _texts(MAX_EMBEDDING_INPUTS, allow_empty=False, what="items"), required=True),
    "encoding_format": Field(FREE, one_of("float", "base64")),
    "dimensions": Field(FREE, integer(1, 1 << 16)),
})


def _choices_of(answer: Any) -> list[Any]:
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list):
        raise UpstreamError("the model provider answered without choices")
    return choices


# ---- completions ---------------------------------------------------------------------------------


def validate_completions(body: dict[str, Any], spec: ModelSpec) -> None:
    COMPLETIONS_FIELDS.check(body)
    output_budget(body, spec)


def _prompts(body: dict[str, Any]) -> list[str]:
    prompt = body.get("prompt", "")
    return [prompt] if isinstance(prompt, str) else [p for p in prompt if isinstance(p, str)]


def completions_quote_parts(body: dict[str, Any], spec: ModelSpec) -> tuple[list[Input], OutputBudget]:
    """What the quote counts: every prompt, the suffix once per prompt; every prompt gets max(n,
    best_of) completions generated upstream, each up to the cap."""
    prompts = _prompts(body)
    suffix = body.get("suffix") if isinstance(body.get("suffix"), str) else ""
    inputs = [Input("prompt", sum(estimate_tokens(p, spec.id).tokens for p in prompts),
                    "shorten the prompt or send fewer prompts")]
    if suffix:
        inputs.append(Input("suffix", estimate_tokens(suffix, spec.id).tokens * max(1, len(prompts)),
                            "shorten the suffix"))
    return inputs, output_budget(body, spec, prompts=len(prompts))


def completions_price(body: dict[str, Any], spec: ModelSpec) -> Decimal:
    return token_quote(spec, *completions_quote_parts(body, spec))


def completions_upstream_body(body: dict[str, Any], spec: ModelSpec) -> dict[str, Any]:
    return {**COMPLETIONS_FIELDS.forward(body), **output_budget(body, spec).forward}


def _completion_chunk_text(text: OutputText, event: dict[str, Any]) -> None:
    """A legacy completion's (or stream chunk's) generated text, choice by choice."""
    for i, choice in enumerate(event.get("choices") or ()):
        if isinstance(choice, dict):
            text.add(choice.get("index", i), choice.get("text"))


def _echoed(body: dict[str, Any]) -> Callable[[Hashable], str] | None:
    """With `echo`, each choice's text starts with its prompt (choice index = prompt index x n +
    sample): not output, so not counted as output."""
    if body.get("echo") is not True:
        return None
    prompts, n = _prompts(body), whole(body.get("n") or 1)

    def prompt_of(choice: Hashable) -> str:
        at = choice // n if isinstance(choice, int) else len(prompts)
        return prompts[at] if 0 <= at < len(prompts) else ""

    return prompt_of


def make_completions_operation(spec: ModelSpec, targets: Targets, client: Upstream) -> Operation:
    """POST /v1/completions of one model: the legacy prompt API, passed through to its upstreams."""

    def validate(body: dict[str, Any]) -> None:
        validate_completions(body, spec)

    def price(body: dict[str, Any]) -> Decimal:
        return completions_price(body, spec)

    def quote(body: dict[str, Any]) -> TokenQuote:
        return quote_of(spec, *completions_quote_parts(body, spec))

    async def run(body: dict[str, Any]) -> SkillResult:
        quoted = quote(body)
        upstream_body = completions_upstream_body(body, spec)
        upstream_body.pop("stream_options", None)  # (only allowed with a stream)
        upstream_body["stream"] = False
        answer, target, _ = await client.request(targets, "/completions", json_body=upstream_body)
        _choices_of(answer)
        answer["model"] = spec.id
        usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else None

        def delivered() -> int:
            text = OutputText()
            _completion_chunk_text(text, answer)
            return text.tokens(spec.id, _echoed(body))

        charge = token_charge(spec, quoted, usage, delivered)
        return SkillResult(body=answer, usage=usage_record(usage, target, charge),
                           upstream_cost_usd=token_cost(usage, spec), charge_usd=charge.usd)

    def stream(body: dict[str, Any]) -> MeteredStream:
        return MeteredStream(client, targets, "/completions", completions_upstream_body(body, spec), spec,
                             quote(body), chunk_text=_completion_chunk_text, echoed=_echoed(body))

    return Operation("completions", run, price, validate, stream,
                     price_floor_usd=MIN_USD, price_cap_usd=MAX_USD, price_rule=TOKEN_RULE,
                     request_schema=budget_schema(spec))


# ---- edits ---------------------------------------------------------------------------------------


def validate_edits(body: dict[str, Any], spec: ModelSpec) -> None:
    EDITS_FIELDS.check(body)
    output_budget(body, spec)


def edit_messages(body: dict[str, Any]) -> list[dict[str, str]]:
    return [{"role": "system", "content": body.get("instruction") or ""},
            {"role": "user", "content": body.get("input") or ""}]  # (null means absent)


def edits_quote_parts(body: dict[str, Any], spec: ModelSpec) -> tuple[list[Input], OutputBudget]:
    # the call is a chat call: its messages are counted as chat counts them (framing included)
    input_tokens = estimate_messages(edit_messages(body), spec.id).tokens
    return [Input("input", input_tokens, "shorten the instruction or the input")], output_budget(body, spec)


def edits_price(body: dict[str, Any], spec: ModelSpec) -> Decimal:
    return token_quote(spec, *edits_quote_parts(body, spec))


def make_edits_operation(spec: ModelSpec, targets: Targets, client: Upstream) -> Operation:
    """POST /v1/edits of one model: a chat call (system: instruction, user: input), answered in the
    legacy edit shape."""

    def validate(body: dict[str, Any]) -> None:
        validate_edits(body, spec)

    def price(body: dict[str, Any]) -> Decimal:
        return edits_price(body, spec)

    async def run(body: dict[str, Any]) -> SkillResult:
        chat = {**EDITS_FIELDS.forward(body, without=("instruction", "input", "stream")),
                "messages": edit_messages(body), "stream": False}
        inputs, budget = edits_quote_parts(body, spec)  # the cap in the caller's field, else the upstream's
        quote = quote_of(spec, inputs, budget)
        answer, target, _ = await client.request(targets, "/chat/completions",
                                                 json_body=lambda t: {**chat, **budget.upstream(t.cap_field)})
        choices = []
        delivered = OutputText()
        for i, choice in enumerate(_choices_of(answer)):
            message = choice.get("message") if isinstance(choice, dict) else None
            text = message.get("content") if isinstance(message, dict) else None
            if not isinstance(text, str):
                raise UpstreamError("the model provider answered a choice without text")
            choices.append({"text": text, "index": choice.get("index", i)})
            add_message_text(delivered, i, message)
        usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else None
        created = answer.get("created")
        edit = {"object": "edit", "created": created if isinstance(created, int) else int(time.time()),
                "choices": choices,
                "usage": {k: int((usage or {}).get(k) or 0)
                          for k in ("prompt_tokens", "completion_tokens", "total_tokens")}}
        charge = token_charge(spec, quote, usage, lambda: delivered.tokens(spec.id))
        return SkillResult(body=edit, usage=usage_record(usage, target, charge),
                           upstream_cost_usd=token_cost(usage, spec), charge_usd=charge.usd)

    return Operation("edits", run, price, validate,
                     price_floor_usd=MIN_USD, price_cap_usd=MAX_USD, price_rule=TOKEN_RULE,
                     request_schema=budget_schema(spec))


# ---- embeddings ----------------------------------------------------------------------------------


def validate_embeddings(body: dict[str, Any], spec: ModelSpec) -> None:
    EMBEDDINGS_FIELDS.check(body)


def embeddings_inputs(body: dict[str, Any], spec: ModelSpec) -> list[Input]:
    raw = body.get("input", "")
    inputs = [raw] if isinstance(raw, str) else [t for t in raw if isinstance(t, str)]
    input_tokens = sum(estimate_tokens(t, spec.id).tokens for t in inputs)
    return [Input("input", input_tokens, "send fewer or shorter inputs")]


def embeddings_price(body: dict[str, Any], spec: ModelSpec) -> Decimal:
    return token_quote(spec, embeddings_inputs(body, spec), None)


def make_embeddings_operation(spec: ModelSpec, targets: Targets, client: Upstream) -> Operation:
    """POST /v1/embeddings of one model; EMBEDDINGS_FIELDS go to the upstream as given (a base64
    answer is passed through untouched), nothing else."""

    def validate(body: dict[str, Any]) -> None:
        validate_embeddings(body, spec)

    def price(body: dict[str, Any]) -> Decimal:
        return embeddings_price(body, spec)

    async def run(body: dict[str, Any]) -> SkillResult:
        quote = quote_of(spec, embeddings_inputs(body, spec), None)
        answer, target, _ = await client.request(targets, "/embeddings",
                                                 json_body=EMBEDDINGS_FIELDS.forward(body))
        if not isinstance(answer, dict) or not isinstance(answer.get("data"), list):
            raise UpstreamError("the model provider answered without embeddings")
        answer["model"] = spec.id
        usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else None
        charge = token_charge(spec, quote, usage, None)  # (no output)
        return SkillResult(body=answer, usage=usage_record(usage, target, charge),
                           upstream_cost_usd=token_cost(usage, spec),  # (prompt tokens only)
                           charge_usd=charge.usd)

    return Operation("embeddings", run, price, validate,
                     price_floor_usd=MIN_USD, price_cap_usd=MAX_USD, price_rule=EMBEDDINGS_RULE)


FACTORIES = {
    "completions": make_completions_operation,
    "edits": make_edits_operation,
    "embeddings": make_embeddings_operation,
}
