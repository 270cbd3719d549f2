"""The model table's file (`models.json`, or the operator's PAYWIRE_MODELS_FILE): its schema as pydantic
models, and `read_table`, which validates it and gives the table's values (spec.py).

Every part is strict: unknown fields are refused, numbers are JSON integers, prices are decimal strings
(a JSON number would have passed through a float). Each provider and each model is validated on its
own, then the rules between fields and entries are checked (output limits, upstream providers and
kinds, prices the model's operations use, duplicate ids), so one `CatalogError` lists every problem of
the file, each naming the provider or model, the field path and what would be accepted.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any, TypeVar, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainValidator, ValidationError
from pydantic_core import ErrorDetails, PydanticCustomError

from .spec import (
    DECIMAL_PRICES,
    KIND_OPERATIONS,
    TOKEN_OPERATIONS,
    CapField,
    ModelPrices,
    ModelSpec,
    OperationName,
    ProviderKind,
    ProviderSpec,
    Upstream,
    prices_used,
)

# A rule broken inside one entry: (field path, what is wrong and what would be accepted).
Problem = tuple[str, str]


class CatalogError(ValueError):
    """The model table cannot be used: `problems` lists everything wrong with it, each line naming the
    provider or model and the field; the message starts with the file."""

    def __init__(self, path: Path, problems: list[str]) -> None:
        self.path, self.problems = path, problems
        if len(problems) == 1:
            message = f"{path}: {problems[0]}"
        else:
            message = f"{path}: {len(problems)} problems in the model table:" + "".join(
                f"\n  - {p}" for p in problems)
        super().__init__(message)


# --- field types ----------------------------------------------------------------------------------------


def _error(message: str) -> PydanticCustomError:
    return PydanticCustomError("table", message)  # (type "table": the message says it all)


def _not_blank(value: str) -> str:
    if not value.strip():
        raise _error("must be a non-empty string")
    return value


def _model_id(value: str) -> str:
    if not value.strip() or value != value.strip():
        raise _error(f"must be a non-empty string without surrounding spaces, got {value!r}")
    return value


def _http_url(value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise _error(f"must be an http(s) URL, got {value!r}")
    return value


def _price(value: Any) -> Decimal:
    if not isinstance(value, str):
        raise _error(f'must be a decimal string such as "0.15" (not a JSON number), got {value!r}')
    try:
        amount = Decimal(value.strip())
    except InvalidOperation:
        raise _error(f'must be a decimal string such as "0.15", got {value!r}') from None
    if not amount.is_finite() or amount < 0:
        raise _error(f"must be a finite, non-negative decimal, got {value!r}")
    return amount


def _image_key(value: str) -> str:
    size, slash, quality = value.partition("/")
    width, x, height = size.partition("x")
    if not (width and x and height) or (slash and not quality):
        raise _error(f"key must be 'WIDTHxHEIGHT' or 'WIDTHxHEIGHT/quality', got {value!r}")
    return value


def _distinct(operations: list[str]) -> list[str]:
    if len(set(operations)) != len(operations):
        raise _error("lists an operation twice")
    return operations


Text = Annotated[str, AfterValidator(_not_blank)]
Price = Annotated[Decimal, PlainValidator(_price)]
PositiveInt = Annotated[int, Field(gt=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# --- the file's parts -----------------------------------------------------------------------------------


class ProviderEntry(_Strict):
    """`providers.<name>`: one upstream API."""

    kind: ProviderKind
    base_url: Annotated[str, AfterValidator(_http_url)]
    api_key_env: Text | None = None
    base_url_env: Text | None = None
    key_required: bool = True
    genai_prices_provider: Text | None = None
    cap_field: CapField = "max_tokens"

    def problems(self) -> Iterator[Problem]:
        if self.key_required and not self.api_key_env:
            yield "api_key_env", "required when key_required is true: the variable holding the key"
        if not self.key_required and not self.base_url_env:
            yield "base_url_env", ("required when key_required is false: the variable naming the "
                                   "server's URL (a keyless provider is usable once it is set)")

    def to_spec(self, name: str) -> ProviderSpec:
        return ProviderSpec(name=name, kind=self.kind, base_url=self.base_url, api_key_env=self.api_key_env,
                            base_url_env=self.base_url_env, key_required=self.key_required,
                            genai_prices_provider=self.genai_prices_provider, cap_field=self.cap_field)


class UpstreamEntry(_Strict):
    """`upstreams[i]`: a provider and the model's name there."""

    provider: Text
    model: Text


class ImageDefaults(_Strict):
    size: Text | None = None
    quality: Text | None = None


class PricesEntry(_Strict):
    """`prices`: the table's USD prices, used where genai-prices does not know an upstream's model."""

    input_per_mtok: Price | None = None
    output_per_mtok: Price | None = None
    per_mchars: Price | None = None
    per_minute: Price | None = None
    per_call: Price | None = None
    per_second: Price | None = None
    input_image_per_mtok: Price | None = None
    per_image: dict[Annotated[str, AfterValidator(_image_key)], Price] = {}
    image_defaults: ImageDefaults = ImageDefaults()

    def given(self) -> list[str]:
        """The prices the entry names (image_defaults is not a price)."""
        return [name for name in type(self).model_fields
                if name in self.model_fields_set and name != "image_defaults"]

    def to_prices(self) -> ModelPrices:
        return ModelPrices(**{name: getattr(self, name) for name in DECIMAL_PRICES},
                           per_image=dict(self.per_image),
                           image_defaults=self.image_defaults.model_dump(exclude_none=True))


class ModelEntry(_Strict):
    """`models[i]`: one sellable model."""

    id: Annotated[str, AfterValidator(_model_id)]
    name: Text
    family: Text
    operations: Annotated[list[OperationName], Field(min_length=1), AfterValidator(_distinct)]
    context_window: PositiveInt | None = None
    default_max_tokens: PositiveInt | None = None
    max_output_tokens: PositiveInt | None = None
    upstreams: Annotated[list[UpstreamEntry], Field(min_length=1)]
    prices: PricesEntry = PricesEntry()
    notes: str = ""

    def problems(self, providers: Mapping[str, ProviderEntry | None]) -> Iterator[Problem]:
        """The rules between fields; `providers`: every provider name, None for an invalid entry."""
        yield from self._limit_problems()
        seen: set[tuple[str, str]] = set()
        for index, upstream in enumerate(self.upstreams):
            where = f"upstreams[{index}]"
            if upstream.provider not in providers:
                yield f"{where}.provider", (f"unknown provider {upstream.provider!r} "
                                            f"(known: {', '.join(providers)})")
            elif (provider := providers[upstream.provider]) is not None:
                served = KIND_OPERATIONS.get(provider.kind)
                if served is not None and not set(self.operations) <= served:
                    yield f"{where}.provider", (f"a {provider.kind!r} provider serves only "
                                                f"{', '.join(sorted(served))}")
                if "audio.generations" in self.operations and provider.kind == "openai":
                    yield f"{where}.provider", "audio.generations needs a provider of kind 'elevenlabs'"
            if (upstream.provider, upstream.model) in seen:
                yield where, "duplicate upstream"
            seen.add((upstream.provider, upstream.model))
        used = prices_used(self.operations)
        for name in self.prices.given():
            if name not in used:
                yield f"prices.{name}", (f"not used by any of the model's operations "
                                         f"({', '.join(self.operations)}: {', '.join(sorted(used))})")
        if self.prices.image_defaults != ImageDefaults() and not self.prices.per_image:
            yield "prices.image_defaults", "only image models (with prices.per_image) have image defaults"

    def _limit_problems(self) -> Iterator[Problem]:
        makes_tokens = bool(TOKEN_OPERATIONS & set(self.operations))
        context, default, maximum = self.context_window, self.default_max_tokens, self.max_output_tokens
        if (makes_tokens or "embeddings" in self.operations) and context is None:
            yield "context_window", "required for token models (chat, completions, edits, embeddings)"
        if not makes_tokens:
            for name, value in (("default_max_tokens", default), ("max_output_tokens", maximum)):
                if value is not None:
                    yield name, ("only models that generate tokens (chat, completions, edits) have "
                                 "output limits")
            return
        if default is None:
            yield "default_max_tokens", "required for models that generate tokens"
        if maximum is None:
            yield "max_output_tokens", "required for models that generate tokens"
        if default is not None and maximum is not None and default > maximum:
            yield "default_max_tokens", f"{default} exceeds max_output_tokens {maximum}"
        if maximum is not None and context is not None and maximum > context:
            yield "max_output_tokens", f"{maximum} exceeds context_window {context}"

    def to_spec(self) -> ModelSpec:
        return ModelSpec(id=self.id, name=self.name, family=self.family, operations=tuple(self.operations),
                         context_window=self.context_window, default_max_tokens=self.default_max_tokens,
                         max_output_tokens=self.max_output_tokens,
                         upstreams=tuple(Upstream(u.provider, u.model) for u in self.upstreams),
                         prices=self.prices.to_prices(), notes=self.notes)


class TableHead(_Strict):
    """The top level; each provider and model is validated on its own (ProviderEntry, ModelEntry)."""

    version: int | None = None
    notes: str | None = None
    providers: Annotated[dict[str, Any], Field(min_length=1)]
    models: list[Any]


# --- reading --------------------------------------------------------------------------------------------


def read_table(path: Path) -> tuple[dict[str, ProviderSpec], list[ModelSpec]]:
    """The table's providers and models, in file order. CatalogError listing every problem."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CatalogError(path, [f"cannot read the model table: {exc}"]) from None
    if not isinstance(document, dict):
        raise CatalogError(path, ["the model table must be a JSON object {providers, models}"])
    try:
        head = TableHead.model_validate(document)
    except ValidationError as exc:
        raise CatalogError(path, [_line("top level", p) for p in _problems(exc, TableHead)]) from None

    problems: list[str] = []
    providers: dict[str, ProviderEntry | None] = {}  # None: an invalid entry (its name is still known)
    for name, raw in head.providers.items():
        label = f"provider {name!r}"
        provider = providers[name] = _validated(ProviderEntry, raw, label, problems)
        if provider is not None:
            problems += [_line(label, p) for p in provider.problems()]

    models: list[ModelSpec] = []
    ids: set[str] = set()
    for index, raw in enumerate(head.models):
        raw_id = raw.get("id") if isinstance(raw, dict) else None
        label = f"model {raw_id!r}" if isinstance(raw_id, str) and raw_id.strip() else f"models[{index}]"
        model = _validated(ModelEntry, raw, label, problems)
        if model is None:
            continue
        problems += [_line(label, p) for p in model.problems(providers)]
        if model.id in ids:
            problems.append(_line(label, ("id", "duplicate id: another model has it")))
        ids.add(model.id)
        models.append(model.to_spec())
    if problems:
        raise CatalogError(path, problems)
    return {name: entry.to_spec(name) for name, entry in providers.items() if entry is not None}, models


Entry = TypeVar("Entry", bound=BaseModel)


def _validated(cls: type[Entry], raw: Any, label: str, problems: list[str]) -> Entry | None:
    """The entry, or None with its problems added to `problems`."""
    try:
        return cls.model_validate(raw)
    except ValidationError as exc:
        problems += [_line(label, p) for p in _problems(exc, cls)]
        return None


def _line(label: str, problem: Problem) -> str:
    where, message = problem
    return f"{label} field {where!r}: {message}" if where else f"{label}: {message}"


def _problems(error: ValidationError, cls: type[BaseModel]) -> list[Problem]:
    return [(_path(e["loc"]), _message(e, cls)) for e in error.errors(include_url=False)]


def _path(loc: tuple[int | str, ...]) -> str:
    """`upstreams[0].provider`, `prices.per_image.1024x1024` (a dict key's own error: its key)."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part != "[key]":
            path += f".{part}" if path else part
    return path


def _message(error: ErrorDetails, cls: type[BaseModel]) -> str:
    kind = error["type"]
    if kind == "table":
        return error["msg"]
    if kind == "missing":
        return "required"
    if kind == "too_short":
        return "must not be empty"
    if kind in ("model_type", "dict_type"):  # (pydantic's wording names our class)
        return f"must be an object, got {_shown(error['input'])}"
    if kind == "extra_forbidden":
        known = _fields_at(cls, error["loc"][:-1])
        return f"unknown field (known: {', '.join(known)})" if known else "unknown field"
    message = error["msg"]
    return f"{message[:1].lower()}{message[1:]}, got {_shown(error['input'])}"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _fields_at(cls: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The field names of the part at `loc` (for "unknown field": what that part takes)."""
    part: Any = cls
    for step in loc:
        if isinstance(step, int):
            continue
        fields = part.model_fields if isinstance(part, type) and issubclass(part, BaseModel) else {}
        if step not in fields:
            return []
        annotation = fields[step].annotation
        part = next((a for a in (annotation, *get_args(annotation))
                     if isinstance(a, type) and issubclass(a, BaseModel)), None)
    return list(part.model_fields) if isinstance(part, type) and issubclass(part, BaseModel) else []

