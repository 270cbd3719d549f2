"""Every sellable model of the catalog as a skill, one operation per endpoint.

Each model's upstream targets (where, with which key, under which name) are built once, here, from the
`ProviderAccess` the assembly gives per provider; the operations price and run on them as they are. A
model none of whose providers is configured is still a skill (GET /v1/models/{model} and the catalogue
say which variable would enable it), and each of its operations answers 503 naming that variable,
before any quote.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Mapping
from decimal import Decimal
from typing import Any

from ..errors import SkillUnavailableError
from ..skill import Operation, Payload, Skill, SkillResult
from ..tokens import counting_may_block
from .catalog import Catalog
from .chat import CHAT_FIELDS, make_chat_operation
from .media_ops import FACTORIES as MEDIA_FACTORIES
from .media_ops import (
    GENERATION_FIELDS,
    IMAGE_EDIT_FIELDS,
    IMAGE_FIELDS,
    SPEECH_FIELDS,
    TRANSCRIPTION_FIELDS,
    TRANSLATION_FIELDS,
)
from .request_fields import FieldTable
from .spec import NO_ACCESS, ModelSpec, ProviderAccess
from .text_ops import COMPLETIONS_FIELDS, EDITS_FIELDS, EMBEDDINGS_FIELDS
from .text_ops import FACTORIES as TEXT_FACTORIES
from .upstream import Target, Targets
from .upstream_port import Upstream

OperationFactory = Callable[[ModelSpec, Targets, Upstream], Operation]
# One per operation of the table (spec.OPERATIONS).
OPERATION_FACTORIES: dict[str, OperationFactory] = {
    "chat.completions": make_chat_operation, **TEXT_FACTORIES, **MEDIA_FACTORIES}
# What each operation's route accepts (request_fields.py), for the faces that describe the routes.
OPERATION_FIELDS: dict[str, FieldTable] = {
    "chat.completions": CHAT_FIELDS, "completions": COMPLETIONS_FIELDS, "edits": EDITS_FIELDS,
    "embeddings": EMBEDDINGS_FIELDS, "audio.speech": SPEECH_FIELDS,
    "audio.transcriptions": TRANSCRIPTION_FIELDS, "audio.translations": TRANSLATION_FIELDS,
    "audio.generations": GENERATION_FIELDS, "images.generations": IMAGE_FIELDS,
    "images.edits": IMAGE_EDIT_FIELDS}


def build_model_skills(catalog: Catalog, client: Upstream, providers: Mapping[str, ProviderAccess],
                       free: frozenset[str] = frozenset()) -> list[Skill]:
    """A skill per model of the catalog. `providers`: how to reach each provider (a provider left out
    has no key and the table's base URL). Models named in `free` (an operator's choice, e.g. a
    self-hosted model) cost nothing and need no payment."""
    skills = []
    for spec in catalog.models.values():
        targets = model_targets(catalog, spec, providers)
        operations: dict[str, Operation] = {
            name: _priced_off_the_loop_when_slow(OPERATION_FACTORIES[name](spec, targets, client), spec)
            for name in spec.operations}
        enable_with = None if targets else catalog.available(spec.id, providers)[1]
        if enable_with is not None:
            operations = {name: _unavailable(op, spec, enable_with) for name, op in operations.items()}
        elif spec.id in free:
            operations = {name: _free(op) for name, op in operations.items()}
        skills.append(Skill(
            id=spec.id, name=spec.name,
            description=f"{spec.name} ({spec.family}) through an OpenAI-compatible API: "
                        f"{', '.join(operations)}. Priced per request from its token prices.",
            categories=("Llm",), tags=(spec.family, *operations), kind="model",
            operations=operations, info=_info(spec, enable_with),
            run=next(iter(operations.values())).run,
            examples=({"model": spec.id, "messages": [{"role": "user", "content": "Hello!"}],
                       "max_tokens": 64},),
        ))
    return skills


def model_targets(catalog: Catalog, spec: ModelSpec, providers: Mapping[str, ProviderAccess]
                  ) -> tuple[Target, ...]:
    """The model's callable upstreams, in preference order: those whose provider has its key (or needs
    none), at the provider's base URL (the access's override, else the table's)."""
    targets = []
    for upstream in spec.upstreams:
        provider = catalog.providers[upstream.provider]
        access = providers.get(upstream.provider, NO_ACCESS)
        if provider.usable(access):
            targets.append(Target(upstream.provider, provider.url(access), upstream.model, access.api_key,
                                  provider.cap_field, provider.base_url_env))
    return tuple(targets)


def _priced_off_the_loop_when_slow(op: Operation, spec: ModelSpec) -> Operation:
    """`op` priced in a worker thread when its token count may be slow: the model's tokenizer is not
    loaded yet (0.1-3 s, once per process), or the request's text is long."""
    def blocks(body: Payload) -> bool:
        return counting_may_block(spec.id, text_chars(body))

    return dataclasses.replace(op, pricer_blocks=blocks)


def text_chars(value: Any) -> int:
    """The characters of every string in a JSON-like value, keys included (a bound on what a
    pricer counts); the value is a parsed request body, already bounded in depth and size."""
    total, pending = 0, [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
    return total


def _unavailable(op: Operation, spec: ModelSpec, needed: list[str]) -> Operation:
    """The operation of a model no provider of which is configured: validated as usual, then refused
    (503 naming what enables it) before any quote, and if run directly (a resource's model)."""
    def refused() -> SkillUnavailableError:
        return SkillUnavailableError(f"model '{spec.id}' is not available on this gateway: set "
                                     f"{' or '.join(needed)} to enable it; nothing was charged")

    def price(body: Payload) -> Decimal:
        raise refused()

    async def run(body: Payload) -> SkillResult:
        raise refused()

    def stream(body: Payload) -> AsyncIterator[Any]:
        raise refused()

    # (the declared price facts stay: the listing shows what it will cost once enabled)
    return dataclasses.replace(op, run=run, pricer=price, streamer=stream if op.streamer else None,
                               pricer_blocks=None)


def _free(op: Operation) -> Operation:
    def price(body: Payload) -> Decimal:
        return Decimal(0)

    return dataclasses.replace(op, pricer=price, price_floor_usd=Decimal(0), price_cap_usd=Decimal(0),
                               price_rule=None, pricer_blocks=None)


def _info(spec: ModelSpec, enable_with: list[str] | None) -> Callable[[], dict[str, Any]]:
    """GET /v1/models' facts; `enable_with`: the variables that would enable an unavailable model."""
    prices = spec.prices
    pricing = {name: str(value) for name, value in (("input_per_mtok", prices.input_per_mtok),
                                                    ("output_per_mtok", prices.output_per_mtok))
               if value is not None}

    def info() -> dict[str, Any]:
        return {
            "family": spec.family,
            "operations": list(spec.operations),
            "context_window": spec.context_window,
            "available": enable_with is None,
            **({} if enable_with is None else {
                "enable_with": list(enable_with),
                "reason": f"not configured on this gateway: set {' or '.join(enable_with)} to enable it"}),
            "pricing": dict(pricing),
        }

    return info
