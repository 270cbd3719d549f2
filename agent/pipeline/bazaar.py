"""The x402 `bazaar` extension a 402 carries: how to call the paid route, for the facilitators that
catalog sellers from the payments they settle and the indexers that probe them (x402's
specs/extensions/bazaar.md), built with the SDK's own helpers.

A face describes each paid route once (`HttpRoute`: its path, body type, and the body schema and
example when they are the route's rather than the skill's); `Bazaar.extension` builds the
extension for a route and skill on first use and keeps it while the registry's version stands
(a skill replaced or removed moves it): a 402 costs a dictionary lookup. The description is:

- `info.input`: method, body type, an example body (the skill's first example; on a /v1 model
  route the route's example naming its first available model) and, in `schema`, the body's JSON
  Schema: the skill's input schema, or the route's request schema.
- `info.input.pathParams` on a marketplace resource (`{"resource_id": ...}`). No `routeTemplate`:
  the spec makes the template the catalog key, and every resource under the template is its own
  product (schema, price), so each is cataloged under its own URL.
- `info.output`: what comes back (type and format).
- `info.price`: `PriceTerms.as_json()` (agent/pipeline/price_terms.py), the price description every face
  shows; on a /v1 model route the route's terms (the range over its models, how a request is
  priced, where the per-model prices are).

Size: clients echo the extension in their payment header, which proxies bound (nginx: one header
line must fit 8 KiB). An extension over `MAX_BYTES` of JSON is made smaller, step by step (schema
annotations dropped, then the schema's top level only, then no schema or example); one whose
example does not validate against its schema loses the example (a facilitator must validate
before it catalogs).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, UnknownType
from referencing.exceptions import Unresolvable
from x402.extensions.bazaar import (
    BAZAAR,
    bazaar_resource_server_extension,
    declare_discovery_extension,
)

from agent.pipeline.catalogue import Catalogue, sellable
from agent.pipeline.price_terms import PriceTerms
from skills.skill import Skill
from wire import wire_json

log = logging.getLogger(__name__)

MAX_BYTES = 3072  # the extension's JSON; base64 in a payment header: ~4 KiB
# JSON Schema annotations: they help a reader, not a validator; the first thing dropped for size
_ANNOTATIONS = frozenset({"description", "title", "examples", "example", "$comment", "default",
                          "deprecated", "readOnly", "writeOnly"})

BodyType = Literal["json", "form-data"]


@dataclass(frozen=True)
class HttpRoute:
    """A face's paid HTTP route, as a 402 describes it (one per route, built when the face is).

    `path`: the route's template in Starlette's form (`/v1/marketplace/api/{resource_id}`); its
    one parameter, when it has one, is the skill's id. `shared`: one description for every skill
    the route serves (a /v1 route over all models), with the route's price range; otherwise each
    skill gets its own (a marketplace resource)."""

    path: str
    operation: str | None = None  # the skill operation the route runs (None: the default one)
    body_type: BodyType = "json"
    body_schema: Mapping[str, Any] | None = None  # None: the skill's own input schema
    example: Mapping[str, Any] | None = None  # None: the skill's first example; shared: "model" added
    output_type: str = "json"
    output_format: str | None = None
    shared: bool = False
    model_required: bool = True  # shared: the body must name its model (no default model)
    method: str = "POST"
    description: str = ""  # what the route does (shared routes: the 402's resource description)
    # how the body carries a skill's call, when it is not the skill's input itself (A2A's JSON-RPC
    # envelope): (skill, its example input) -> an example body
    wrap: Callable[[Skill, Mapping[str, Any] | None], Mapping[str, Any]] | None = None
    _param: str | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if "{" in self.path:
            name = self.path[self.path.index("{") + 1:self.path.index("}")].split(":")[0]
            object.__setattr__(self, "_param", name)

    def path_for(self, skill: Skill | None) -> str:
        """The concrete path a call for `skill` takes (the template with the skill's id)."""
        if self._param is None or skill is None:
            return self.path
        start, end = self.path.index("{"), self.path.index("}")
        return self.path[:start] + skill.id + self.path[end + 1:]

    @property
    def template(self) -> str:
        """The path with `:param` segments, the form x402's discovery documents use."""
        if self._param is None:
            return self.path
        start, end = self.path.index("{"), self.path.index("}")
        return f"{self.path[:start]}:{self._param}{self.path[end + 1:]}"

    def path_params(self, skill: Skill | None) -> dict[str, str] | None:
        return {self._param: skill.id} if self._param is not None and skill is not None else None


class Bazaar:
    """The bazaar extension of each (route, skill, operation), built once and shared (read-only)."""

    def __init__(self, catalogue: Catalogue, max_bytes: int = MAX_BYTES) -> None:
        self._catalogue = catalogue
        self._max_bytes = max_bytes
        # per registry version (a skill replaced or removed is described again)
        self._built: dict[tuple[str, str | None, str | None], dict[str, Any]] = {}
        self._built_version = catalogue.version
        # per model operation, while the registry keeps its version: its terms over all its
        # models, and the model its example names (both walk every model)
        self._routes: dict[str, tuple[int, PriceTerms | None, Skill | None]] = {}

    def extension(self, route: HttpRoute, skill: Skill | None) -> dict[str, Any]:
        """`{"bazaar": {...}}` for a 402 on `route` (for `skill`; None or a shared route: for the
        route itself). Never raises: a description that cannot be built is left out (logged)."""
        key = (route.path, None if route.shared or skill is None else skill.id, route.operation)
        if self._built_version != self._catalogue.version:
            self._built, self._built_version = {}, self._catalogue.version
        found = self._built.get(key)
        if found is None:
            try:
                found = {BAZAAR.key: self._build(route, None if route.shared else skill)}
            except Exception:  # noqa: BLE001 - a 402 without the description, never no 402
                log.exception("could not describe %s for the bazaar extension", route.path)
                found = {}
            self._built[key] = found
        return found

    def info(self, route: HttpRoute, skill: Skill | None) -> dict[str, Any] | None:
        """The extension's `info` (discovery metadata shows it), or None."""
        ext = self.extension(route, skill).get(BAZAAR.key)
        return ext["info"] if ext else None

    def terms(self, route: HttpRoute, skill: Skill | None) -> PriceTerms | None:
        """What a call on `route` costs: the skill's operation, or (shared) the route's range."""
        if route.shared or skill is None:
            return self._route(route.operation)[1] if route.operation else None
        return self._catalogue.price_terms(skill, route.operation)

    def example_model(self, operation: str | None) -> Skill | None:
        """The model a shared route's example names: its first available model, else its first."""
        return self._route(operation)[2] if operation else None

    def _route(self, operation: str) -> tuple[int, PriceTerms | None, Skill | None]:
        size = self._catalogue.version
        found = self._routes.get(operation)
        if found is None or found[0] != size:
            serving = [s for s in self._catalogue.of_kind("model") if operation in s.operations]
            model = next((s for s in serving if sellable(s)), serving[0] if serving else None)
            found = self._routes[operation] = (size, self._catalogue.route_price_terms(operation), model)
        return found

    # ---------------------------------------------------------------------------- building

    def _build(self, route: HttpRoute, skill: Skill | None) -> dict[str, Any]:
        schema = self._schema(route, skill)
        example = self._example(route, skill)
        terms = self.terms(route, skill)
        output: dict[str, Any] = {"type": route.output_type}
        if route.output_format:
            output["format"] = route.output_format
        price = terms.as_json() if terms is not None else None
        attempts: list[Callable[[], tuple[Mapping[str, Any], Mapping[str, Any] | None]]] = [
            lambda: (schema, example),
            lambda: (_without_annotations(schema), example),
            lambda: (_top_level(schema), example),
            lambda: ({"type": "object"}, None),
        ]
        built: dict[str, Any] = {}
        for attempt in attempts:
            body_schema, example_body = attempt()
            # without the example when it breaks its schema (or the schema cannot be resolved)
            for body in (example_body, None) if example_body is not None else (None,):
                built = self._declare(route, skill, body_schema, body, output, price)
                if _valid(built) and len(wire_json.dumps(built)) <= self._max_bytes:
                    return built
        log.warning("the bazaar description of %s is %d bytes, over %d even at its smallest",
                    route.path_for(skill), len(wire_json.dumps(built)), self._max_bytes)
        return built

    def _schema(self, route: HttpRoute, skill: Skill | None) -> Mapping[str, Any]:
        if route.body_schema is not None:
            return route.body_schema
        if skill is not None and skill.kind != "model":
            return skill.input_schema
        # a /v1 route's body: its field table's (as in the OpenAPI document), naming a model
        found = self._catalogue.request_schema(route.operation) if route.operation else None
        schema = found or {"type": "object", "properties": {"model": {"type": "string"}}}
        return {**schema, "required": ["model"]} if route.model_required else schema

    def _example(self, route: HttpRoute, skill: Skill | None) -> Mapping[str, Any] | None:
        if route.wrap is not None and skill is not None:
            return route.wrap(skill, skill.examples[0] if skill.examples else None)
        if route.example is not None:
            body = dict(route.example)
            if route.shared or (skill is not None and skill.kind == "model"):
                model = skill if skill is not None else self.example_model(route.operation)
                if model is not None:
                    body = {"model": model.id, **{k: v for k, v in body.items() if k != "model"}}
            return body
        return skill.examples[0] if skill is not None and skill.examples else None

    @staticmethod
    def _declare(route: HttpRoute, skill: Skill | None, schema: Mapping[str, Any],
                 example: Mapping[str, Any] | None, output: dict[str, Any],
                 price: dict[str, Any] | None) -> dict[str, Any]:
        params = route.path_params(skill)
        declared = declare_discovery_extension(
            input=dict(example) if example else None,
            input_schema=dict(schema),
            path_params_schema=None if params is None else {
                "properties": {name: {"type": "string", "const": value} for name, value in params.items()},
                "required": list(params)},
            body_type=route.body_type,
        )[BAZAAR.key]
        # The SDK's server extension adds the method (the spec requires it), as on its own routes.
        ext = bazaar_resource_server_extension.enrich_declaration(declared, _Request(route.method))
        info = ext["info"]
        if params is not None:
            info["input"]["pathParams"] = params
        info["output"] = output
        if price is not None:
            info["price"] = price
        return ext


@dataclass(frozen=True)
class _Request:
    """What the SDK's `enrich_declaration` reads of a request: its method (no route pattern: see
    the module's note on `routeTemplate`)."""

    method: str
    route_pattern: None = None


def _valid(extension: dict[str, Any]) -> bool:
    """Does `info` validate against `schema`, as a facilitator checks before it catalogs (the SDK's
    `validate_discovery_extension`, without its check of the schema against the meta-schema: 10x
    the cost; skills' schemas are checked when they load)."""
    try:
        return Draft202012Validator(extension["schema"]).is_valid(extension["info"])
    except (SchemaError, Unresolvable, UnknownType):
        return False


def _without_annotations(schema: Any) -> Any:
    if isinstance(schema, Mapping):
        return {k: _without_annotations(v) for k, v in schema.items() if k not in _ANNOTATIONS}
    if isinstance(schema, list):
        return [_without_annotations(v) for v in schema]
    return schema


def _top_level(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The schema's object level only: each property's type, what is required."""
    out: dict[str, Any] = {"type": "object"}
    properties = schema.get("properties")
    if isinstance(properties, Mapping):
        out["properties"] = {name: {"type": spec["type"]} if isinstance(spec, Mapping) and "type" in spec
                             else {} for name, spec in properties.items()}
    if isinstance(schema.get("required"), list):
        out["required"] = list(schema["required"])
    return out
