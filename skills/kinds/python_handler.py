"""Kind `python`: the resource runs Python code.

`handler` is either a module (or `module:object`) exposing `run` and optionally
`validate(payload[, context])`, `stream(payload[, context])` and `ready(context)`, or
`module:function` naming the run function alone. `run(payload)` or `run(payload, context)` (a
ResourceContext: environment, HTTP session, models) is an `async def` returning a JSON-able
object or a SkillResult. The module is imported by name, so it must be importable by the
gateway's Python: an installed package, or a folder on `PYTHONPATH` (a resource folder named by
PAYWIRE_RESOURCE_DIRS is not put on the path).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from ..described import schema_of
from ..resource_context import ResourceContext
from ..skill import Payload, SkillResult
from .base import Behaviour


def check(data: dict[str, Any]) -> list[str]:
    handler = data.get("handler")
    if not isinstance(handler, str) or not handler:
        return ["kind 'python' needs field 'handler': 'package.module' or 'package.module:function'"]
    try:
        function, _hooks = load(handler)
    except Exception as exc:  # noqa: BLE001 - explain any import problem to the author
        return [f"field 'handler' {handler!r} cannot be loaded: {exc}"]
    if not inspect.iscoroutinefunction(function):
        return [f"field 'handler' {handler!r}: run must be a coroutine function (`async def "
                "run(payload)`); a plain function would fail every paid call"]
    return []


def load(spec: str) -> tuple[Any, Any]:
    """(the run callable, the module or object holding the optional hooks, or None)."""
    module_name, _, attr = spec.partition(":")
    target: Any = importlib.import_module(module_name)
    if attr:
        target = getattr(target, attr, None)
        if target is None:
            raise ValueError(f"module '{module_name}' has no '{attr}'")
    run = getattr(target, "run", None)
    if callable(run):  # a module or object with hooks
        return run, target
    if attr and callable(target):  # module:function, the run function alone
        return target, None
    raise ValueError("it has no run(payload) function")


def build(data: dict[str, Any], context: ResourceContext) -> Behaviour:
    function, hooks = load(data["handler"])
    run_with_context = _takes_context(function)

    async def run(payload: Payload) -> SkillResult:
        result = await (function(payload, context) if run_with_context else function(payload))
        return result if isinstance(result, SkillResult) else SkillResult(body=result)

    streamer = getattr(hooks, "stream", None)
    if streamer is not None and _takes_context(streamer):
        stream_fn = streamer

        def streamer(payload: Payload) -> Any:
            return stream_fn(payload, context)

    validator = getattr(hooks, "validate", None)
    if validator is not None and _takes_context(validator):
        validate_fn = validator

        def validator(payload: Payload) -> None:
            validate_fn(payload, context)

        validator.json_schema = schema_of(validate_fn)  # type: ignore[attr-defined]  # (what it declares)

    ready_hook = getattr(hooks, "ready", None)
    return Behaviour(
        run=run,
        validator=validator,
        streamer=streamer,
        ready=(lambda: ready_hook(context)) if ready_hook is not None else None,
    )


def _takes_context(function: Any) -> bool:
    params = [p for p in inspect.signature(function).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(params) >= 2
