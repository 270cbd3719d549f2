"""The token quote shared by chat, completions and edits (embeddings: input only).

quote = estimated input tokens x input price + paid completions x output cap x output price, rounded up
by the pipeline; below MIN_USD it is the minimum, above MAX_USD the request is refused with how to bring
it under. Input is everything the upstream bills as prompt: messages (names included), tools,
functions, tool_choice, response_format schemas, every prompt of a batch, a suffix. The output budget
is one cap per completion, forwarded upstream as exactly what was paid:

- `max_tokens` or `max_completion_tokens` (null = absent = the model's default). They are aliases
  upstream (OpenAI, vLLM), so both given with different values is refused (400 naming
  `max_completion_tokens`); the cap is forwarded in one field only, so no uncapped alias reaches the
  upstream: the one the caller used (`max_completion_tokens` if sent), or, when it used none, the
  one the serving upstream takes (`Target.cap_field`, its provider's preset: OpenAI's API refuses
  `max_tokens` for its reasoning models, OpenRouter and vLLM take `max_tokens`). Chat-shaped routes
  ask `OutputBudget.upstream(cap_field)` for that; legacy completions always use `max_tokens`;
- completions: `n` (and `best_of`, which generates that many) per prompt, each up to the cap;
- reasoning budgets (`reasoning.max_tokens`, `thinking.budget_tokens`) are spent inside the cap, so
  they may not exceed it.

Quotes are a pure function of the request: identical requests get identical quotes.

A call is charged what it used (`token_charge`), priced as its quote is priced (`token_usd`: the same
per-token prices with margin, the long-context tier the input's size selects, the MIN_USD floor), and
never more than its quote: the tokens the upstream reported, or, when it reported none (a stream cut
short or left by its caller, a provider that does not report), the input as the quote counted it and
the output counted on the text delivered (`OutputText`), with the model's tokenizer.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_FLOOR, Decimal
from typing import Any

from ..errors import SkillInputError
from ..json_numbers import is_whole, whole
from ..tokens import estimate_tokens
from .request_fields import (
    FREE,
    Check,
    Field,
    boolean,
    described,
    integer,
    nullable,
    number,
    obj,
    schema_of,
    text,
    texts,
)
from .spec import CAP_FIELDS, ModelSpec
from .upstream import Target

MIN_USD = Decimal("0.0001")
MAX_USD = Decimal("0.50")
MILLION = Decimal(1_000_000)
# How the quote is computed, in one sentence, for the faces that describe a price before a request.
TOKEN_RULE = ("estimated input tokens x the model's input price, plus the output cap (max_tokens or "
              "max_completion_tokens, else the model's default) x the completions asked (n) x its "
              "output price")
EMBEDDINGS_RULE = "estimated input tokens x the model's input price"
MAX_CHOICES = 128  # OpenAI's upper bound for `n` and `best_of`
CHOICES = integer(1, MAX_CHOICES)  # `n`, `best_of`: completions generated per prompt
MAX_STOP = 4
MAX_LOGIT_BIAS = 300

log = logging.getLogger(__name__)


@described({"type": "object", "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
            "maxProperties": MAX_LOGIT_BIAS})
def _logit_bias(value: Any, name: str) -> None:
    if not isinstance(value, dict) or len(value) > MAX_LOGIT_BIAS:
        raise SkillInputError(f"'{name}' must be an object of at most {MAX_LOGIT_BIAS} token ids -> "
                              "bias", name)
    for key, bias in value.items():
        number(-100, 100)(bias, f"{name}.{key}")


# Free sampling fields of every token route (the routes add their own). Null means absent.
SAMPLING: dict[str, Field] = {
    "model": Field(FREE),  # each upstream is sent its own name for the model
    "temperature": Field(FREE, number(0, 2)),
    "top_p": Field(FREE, number(0, 1)),
    "presence_penalty": Field(FREE, number(-2, 2)),
    "frequency_penalty": Field(FREE, number(-2, 2)),
    "seed": Field(FREE, integer(-(2**63), 2**63 - 1)),
    "stop": Field(FREE, texts(MAX_STOP, 1000)),
    "logit_bias": Field(FREE, _logit_bias),
    "user": Field(FREE, text(256)),
    "stream": Field(FREE, boolean),
    "stream_options": Field(FREE, obj({"include_usage": boolean, "include_obfuscation": boolean})),
}


@dataclass(frozen=True)
class Input:
    """One priced part of the input: the field it comes from, its tokens, how to make it smaller."""

    param: str
    tokens: int
    shorten: str


@dataclass(frozen=True)
class OutputBudget:
    """What the quote pays for and the upstream is capped at."""

    field: str  # the cap's field: the caller's (max_tokens or max_completion_tokens), else max_tokens
    cap: int  # tokens per completion
    completions: int  # completions generated upstream (prompts x max(n, best_of))
    forward: dict[str, Any] = dataclasses.field(default_factory=dict)  # the upstream body's budget fields
    chosen: bool = True  # the caller named the cap's field (False: none given, the default budget)

    def upstream(self, cap_field: str) -> dict[str, Any]:
        """The budget fields for an upstream whose chat API takes the cap in `cap_field` (its
        provider's preset): the cap in the caller's field if it named one, else in `cap_field`;
        in one field either way, equal to what was paid."""
        if self.chosen or cap_field == self.field:
            return self.forward
        return {cap_field: self.cap, **{k: v for k, v in self.forward.items() if k != self.field}}


def _cap(spec: ModelSpec) -> Check:
    """An output cap (or a reasoning budget inside it) this model can be asked for."""
    maximum = spec.max_output_tokens
    assert maximum is not None  # the table requires it of token models

    @described({"type": "integer", "minimum": 1, "maximum": maximum})
    def check(value: Any, name: str) -> None:
        if not is_whole(value) or not 1 <= value <= maximum:
            raise SkillInputError(f"'{name}' must be a whole number from 1 to {maximum} for {spec.id}", name)

    return check


def budget_schema(spec: ModelSpec, inner: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What this model adds to its route's body schema: the caps (and reasoning budgets) it allows,
    as `output_budget` checks them (the route's table cannot say: they differ by model)."""
    cap = nullable(schema_of(_cap(spec)))
    return {"properties": {**{name: cap for name in CAP_FIELDS},
                           **{name: {"properties": {key: cap}} for name, key in (inner or {}).items()}}}


def output_budget(body: Mapping[str, Any], spec: ModelSpec, *, prompts: int = 1,
                  inner: Mapping[str, str] | None = None) -> OutputBudget:
    """The paid output of a request (checked: 400 naming the field when it cannot be paid for).
    `inner`: reasoning budgets spent inside the cap, field -> its budget key."""
    default = spec.default_max_tokens
    assert default is not None  # the table requires it of token models
    cap_check = _cap(spec)
    given: dict[str, Any] = {name: body[name] for name in CAP_FIELDS if body.get(name) is not None}
    for name, value in given.items():
        cap_check(value, name)
    given = {name: whole(value) for name, value in given.items()}
    if len(set(given.values())) > 1:
        raise SkillInputError(
            f"'max_tokens' ({given['max_tokens']}) and 'max_completion_tokens' "
            f"({given['max_completion_tokens']}) differ; they are the same output cap (upstreams honour "
            "either), so send one of them", "max_completion_tokens")
    cap_field = "max_completion_tokens" if "max_completion_tokens" in given else "max_tokens"
    cap: int = given[cap_field] if given else default
    forward: dict[str, Any] = {cap_field: cap}
    choices = 1
    for name in ("n", "best_of"):
        value = body.get(name)
        if value is not None:
            CHOICES(value, name)
            forward[name] = whole(value)
            choices = max(choices, forward[name])
    for name, key in (inner or {}).items():
        value = body.get(name)
        budget = value.get(key) if isinstance(value, dict) else None
        if budget is not None and (not is_whole(budget) or not 1 <= budget <= cap):
            raise SkillInputError(f"'{name}.{key}' must be a whole number from 1 to {cap}: reasoning is "
                                  f"spent inside the paid output cap ({cap_field} = {cap})",
                                  f"{name}.{key}")
        if value is not None:
            forward[name] = value if budget is None else {**value, key: whole(budget)}
    return OutputBudget(cap_field, cap, max(1, prompts) * choices, forward, chosen=bool(given))


def json_tokens(value: Any, model: str) -> int:
    """Tokens of a JSON value (tools, schemas) as the upstream receives it: its compact JSON text."""
    if value is None or isinstance(value, str) and not value:
        return 0
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return estimate_tokens(text, model).tokens


def token_usd(spec: ModelSpec, input_tokens: int, output_tokens: int) -> Decimal:
    """USD at this gateway's prices (margin included) for tokens in and out, at the tier the input's
    size selects (long prompts may cost more per token): what a quote, a charge and an upstream cost
    are all computed from, unrounded."""
    in_price, out_price = spec.prices.token_prices(input_tokens)
    return (input_tokens * (in_price or Decimal(0)) + output_tokens * (out_price or Decimal(0))) / MILLION


@dataclass(frozen=True)
class TokenQuote:
    """A token route's quote and the input it counted: the most its call is charged, and the input
    tokens charged when the upstream reports no usage."""

    usd: Decimal
    input_tokens: int


def quote_of(spec: ModelSpec, inputs: Sequence[Input], budget: OutputBudget | None) -> TokenQuote:
    """USD for `inputs` in and the paid output out (None: no output, embeddings), at least MIN_USD,
    with the input tokens counted; unchecked against the route's maximum (`token_quote` checks it: a
    call run without its own quote, a prompted resource's, is charged as priced)."""
    assert spec.prices.input_per_mtok is not None  # the catalog sells priced models only
    input_tokens = sum(part.tokens for part in inputs)
    usd = token_usd(spec, input_tokens, budget.cap * budget.completions if budget else 0)
    return TokenQuote(max(usd, MIN_USD), input_tokens)


def token_quote(spec: ModelSpec, inputs: Sequence[Input], budget: OutputBudget | None) -> Decimal:
    """The quote (`quote_of`) within the route's range. Above MAX_USD the refusal says which cap would
    fit, or which input to shorten when the input alone is over (the largest part, at its field)."""
    quote = quote_of(spec, inputs, budget)
    if quote.usd <= MAX_USD:
        return quote.usd
    input_usd = token_usd(spec, quote.input_tokens, 0)
    per_token = token_usd(spec, quote.input_tokens, budget.completions) - input_usd if budget else 0
    fit = int(((MAX_USD - input_usd) / per_token).to_integral_value(rounding=ROUND_FLOOR)) \
        if per_token and input_usd < MAX_USD else 0
    if budget is not None and fit >= 1:
        where, hint = budget.field, f"lower {budget.field} to {fit} or less"
    else:
        largest = max(inputs, key=lambda part: part.tokens)
        where, hint = largest.param, f"{largest.shorten} (about {largest.tokens} tokens)"
    raise SkillInputError(f"this request would cost ${quote.usd:.6f}, above the ${MAX_USD} maximum of "
                          f"this route; {hint}", where)


class OutputText:
    """The text a call delivered, kept by part (a choice's content, its reasoning, each tool call's
    name and arguments...): what a call without a usage report is charged for, counted part by part
    with the model's tokenizer, the one the quote counts with."""

    def __init__(self) -> None:
        self._parts: dict[Hashable, list[str]] = {}

    def add(self, part: Hashable, text: Any) -> None:
        if isinstance(text, str) and text:
            self._parts.setdefault(part, []).append(text)

    def tokens(self, model: str, echoed: Callable[[Hashable], str] | None = None) -> int:
        """The delivered tokens; `echoed(part)`: a prefix of that part that is not output (a legacy
        completion's echoed prompt), left uncounted."""
        total = 0
        for part, pieces in self._parts.items():
            text = "".join(pieces)
            prefix = echoed(part) if echoed is not None else ""
            if prefix and text.startswith(prefix):
                text = text[len(prefix):]
            total += estimate_tokens(text, model).tokens if text else 0
        return total


@dataclass(frozen=True)
class Charge:
    """What a token call is charged (`usd`, unrounded, at most its quote) and, when the upstream
    reported no usage, the tokens counted here instead (`counted`, for the ledger)."""

    usd: Decimal
    counted: dict[str, int] | None = None


def reported_tokens(usage: Mapping[str, Any] | None, *, output: bool = True) -> tuple[int, int] | None:
    """(prompt, completion) tokens of an OpenAI usage report; None when it has no usable counts.
    `output` False: a route without output (embeddings), whose report has prompt tokens only."""
    if not usage:
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens") if output else 0
    if not (_count(prompt) and _count(completion)):
        return None
    return prompt, completion


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def token_charge(spec: ModelSpec, quote: TokenQuote, usage: Mapping[str, Any] | None,
                 output_tokens: Callable[[], int] | None) -> Charge:
    """What a token call is charged: its usage priced as its quote is (`token_usd`, the MIN_USD
    floor), never above the quote. The usage is the upstream's report; without one, the input as
    the quote counted it and `output_tokens()` (the delivered text, counted; None: a route without
    output, embeddings). A call whose usage is its quote's assumptions is charged exactly its quote."""
    reported = reported_tokens(usage, output=output_tokens is not None)
    counted = None
    if reported is None:
        reported = quote.input_tokens, output_tokens() if output_tokens is not None else 0
        counted = {"prompt_tokens": reported[0], "completion_tokens": reported[1]}
    usd = max(token_usd(spec, *reported), MIN_USD)
    if usd > quote.usd:
        # more tokens than the quote counted (our input counts are estimates for some families):
        # our loss, not the payer's
        log.debug("%s used %d+%d tokens, $%s above its quote $%s: charged the quote", spec.id,
                  reported[0], reported[1], usd, quote.usd)
        usd = quote.usd
    return Charge(usd, counted)


def usage_record(usage: Mapping[str, Any] | None, target: Target,
                 charge: Charge | None = None) -> dict[str, Any]:
    """For the ledger: who served the call, then the upstream's own usage report (or the tokens
    counted here when it sent none)."""
    counted = {"counted_tokens": charge.counted} if charge is not None and charge.counted else {}
    return {"provider": target.provider, "upstream_model": target.model, **(usage or {}), **counted}


def token_cost(usage: Mapping[str, Any] | None, spec: ModelSpec) -> Decimal | None:
    """What the upstream charged for a reported usage (the margin taken off)."""
    if not usage:
        return None
    prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    return spec.upstream_cost(token_usd(spec, prompt, completion))
