"""Every sellable model of the catalog as a skill, one operation per supported endpoint."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from ..errors import UpstreamError
from ..skill import Operation, Skill
from .chat import make_chat_operation
from .media_ops import FACTORIES as MEDIA_FACTORIES
from .text_ops import FACTORIES as TEXT_FACTORIES
from .upstream import Target, UpstreamClient

# Each factory: (spec, targets, client) -> Operation.
OPERATION_FACTORIES = {"chat.completions": make_chat_operation, **TEXT_FACTORIES, **MEDIA_FACTORIES}


def build_model_skills(catalog: Any, client: UpstreamClient, env: Mapping[str, str],
                       free: frozenset[str] = frozenset()) -> list[Skill]:
    """Skills for the catalog's models, for the operations implemented so far. Models named in
    `free` (an operator's choice, e.g. a self-hosted model) cost nothing and need no payment."""
    skills = []
    for spec in catalog.models.values():
        targets = _targets_for(catalog, spec, env)
        operations: dict[str, Operation] = {
            name: OPERATION_FACTORIES[name](spec, targets, client)
            for name in spec.operations if name in OPERATION_FACTORIES
        }
        if not operations:
            continue
        if spec.id in free:
            operations = {name: _free(op, targets) for name, op in operations.items()}
        skills.append(Skill(
            id=spec.id, name=spec.name,
            description=f"{spec.name} ({spec.family}) through an OpenAI-compatible API: "
                        f"{', '.join(operations)}. Priced per request from its token prices.",
            categories=("Llm",), tags=(spec.family, *operations), kind="model",
            operations=operations, info=_info(catalog, spec, env),
            run=next(iter(operations.values())).run,
            examples=({"model": spec.id, "messages": [{"role": "user", "content": "Hello!"}],
                       "max_tokens": 64},),
        ))
    return skills


def _free(op: Operation, targets: Any) -> Operation:
    def price(body: dict[str, Any]) -> Decimal:
        targets()  # still refuse up front when no provider is configured
        return Decimal(0)

    return Operation(op.name, op.run, price, op.validator, op.streamer)


def _targets_for(catalog: Any, spec: Any, env: Mapping[str, str]) -> Any:
    def targets() -> list[Target]:
        found = []
        for upstream in spec.upstreams:
            provider = catalog.providers[upstream.provider]
            key = provider.api_key(env)
            if provider.key_required and not key:
                continue
            found.append(Target(provider.key, provider.resolved_base_url(env), upstream.model, key,
                                provider.cap_field))
        if not found:
            _, needed = catalog.available(spec.id, env)
            raise UpstreamError(f"model '{spec.id}' is not available on this gateway: set "
                                f"{' or '.join(needed)} to enable it; nothing was charged", 503)
        return found

    return targets


def _info(catalog: Any, spec: Any, env: Mapping[str, str]) -> Any:
    def info() -> dict[str, Any]:
        available, needed = catalog.available(spec.id, env)
        prices = spec.prices
        return {
            "family": spec.family,
            "operations": list(spec.operations),
            "context_window": spec.context_window,
            "available": available,
            **({} if available else {"enable_with": needed}),
            "pricing": {k: str(v) for k, v in (("input_per_mtok", prices.input_per_mtok),
                                               ("output_per_mtok", prices.output_per_mtok))
                        if v is not None},
        }

    return info
