"""The model table: which models are sold, where each is served from, and at what price.

`models.json` holds the providers (base URL, key variable, kind, the field their chat API takes the
output cap in) and the models (operations, limits, upstreams in preference order, fallback prices).
`load_catalog` validates it strictly, takes token, character and audio-hour prices from the
`genai-prices` package where it knows an upstream's model, applies the operator's margin, and leaves
out (with a warning) every model that lacks a price for an operation it lists: a model is never sold
at $0.

Some operations bill tokens besides their unit price on some models only (_TOKEN_EXTRAS): the GPT
Image models bill the prompt's text tokens and the input images' image tokens on top of the output
image, gpt-4o-transcribe bills its `prompt` as text tokens on top of the audio. Those prices are
optional (DALL-E and Whisper bill none); where a model has them, its routes price those inputs.

This module imports nothing from the rest of paywire: money is plain `Decimal`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from functools import cache
from pathlib import Path
from typing import Any

DEFAULT_PATH = Path(__file__).with_name("models.json")

OPERATIONS = frozenset({
    "chat.completions", "completions", "edits", "embeddings", "audio.speech", "audio.transcriptions",
    "audio.translations", "audio.generations", "images.generations", "images.edits",
})
# Operations whose answer is generated tokens: they need output limits and both token prices.
TOKEN_OPERATIONS = frozenset({"chat.completions", "completions", "edits"})
PROVIDER_KINDS = frozenset({"openai", "elevenlabs"})
# The only operation a non-OpenAI-shaped provider serves.
KIND_OPERATIONS = {"elevenlabs": frozenset({"audio.generations"})}

# Which price fields each operation is quoted from.
_OPERATION_FIELDS: dict[str, tuple[str, ...]] = {
    **{op: ("input_per_mtok", "output_per_mtok") for op in TOKEN_OPERATIONS},
    "embeddings": ("input_per_mtok",),
    "audio.speech": ("per_mchars",),
    "audio.transcriptions": ("per_minute",),
    "audio.translations": ("per_minute",),
    "images.generations": ("per_image",),
    "images.edits": ("per_image",),
    "audio.generations": ("per_call", "per_second"),
}
# Token prices an operation adds to its unit price on the models that bill them (optional: a model
# without them bills none): text input (an image prompt, a transcription prompt) and input images.
_TOKEN_EXTRAS: dict[str, tuple[str, ...]] = {
    "images.generations": ("input_per_mtok",),
    "images.edits": ("input_per_mtok", "input_image_per_mtok"),
    "audio.transcriptions": ("input_per_mtok",),
    "audio.translations": ("input_per_mtok",),
}
_DECIMAL_FIELDS = ("input_per_mtok", "output_per_mtok", "per_mchars", "per_minute", "per_call", "per_second",
                   "input_image_per_mtok")
_PRICE_KEYS = frozenset({*_DECIMAL_FIELDS, "per_image", "image_defaults"})
_MODEL_KEYS = frozenset({"id", "name", "family", "operations", "context_window", "default_max_tokens",
                         "max_output_tokens", "upstreams", "prices", "notes"})
_PROVIDER_KEYS = frozenset({"kind", "base_url", "api_key_env", "base_url_env", "key_required",
                            "genai_prices_provider", "cap_field"})
# The output cap's field in a chat body: OpenAI's API takes max_completion_tokens for every chat model
# (its reasoning models refuse max_tokens); OpenRouter, vLLM, Ollama and the other compatible APIs take
# max_tokens.
CAP_FIELDS = ("max_tokens", "max_completion_tokens")
# Per-minute prices derived from per-hour ones are rounded up to this step (never in the buyer's favour
# below cost; the atomic conversion rounds up again).
_PER_MINUTE_STEP = Decimal("1e-9")

Tiers = tuple[tuple[int, Decimal], ...]


@dataclass(frozen=True)
class ProviderSpec:
    """One upstream API: where it is and which environment variable holds its key."""

    key: str
    kind: str
    base_url: str
    api_key_env: str | None
    base_url_env: str | None
    key_required: bool
    genai_prices_provider: str | None = None
    # The field its chat API takes the output cap in, used when the caller names none (CAP_FIELDS).
    cap_field: str = "max_tokens"

    def resolved_base_url(self, env: Mapping[str, str]) -> str:
        """The base URL without a trailing slash; `base_url_env` overrides it (tests use a loopback)."""
        override = env.get(self.base_url_env, "").strip() if self.base_url_env else ""
        return (override or self.base_url).rstrip("/")

    def api_key(self, env: Mapping[str, str]) -> str | None:
        value = env.get(self.api_key_env, "").strip() if self.api_key_env else ""
        return value or None

    def usable(self, env: Mapping[str, str]) -> bool:
        """True when a call can be made: the key is set, or none is needed (local servers)."""
        return not self.key_required or self.api_key(env) is not None


@dataclass(frozen=True)
class Upstream:
    provider: str
    model: str


COST_STEP = Decimal("1e-10")


@dataclass(frozen=True)
class ModelPrices:
    """USD prices of one model (margin included). `source` says whether genai-prices supplied any."""

    input_per_mtok: Decimal | None = None
    output_per_mtok: Decimal | None = None
    per_mchars: Decimal | None = None
    per_minute: Decimal | None = None
    per_image: dict[str, Decimal] = field(default_factory=dict)
    per_call: Decimal | None = None
    per_second: Decimal | None = None
    # Input image tokens (GPT Image edits), per 1M; the text-input price is input_per_mtok.
    input_image_per_mtok: Decimal | None = None
    source: str = "table"
    # Cliff tiers by prompt size, (above_input_tokens, price) ascending: past a threshold the whole
    # request pays that rate (Gemini 2.5 Pro, Claude Sonnet 4.5 above 200k). The fields above are the base.
    input_tiers: Tiers = ()
    output_tiers: Tiers = ()
    # Size / quality a caller gets when it names none (the upstream's own defaults).
    image_defaults: dict[str, str] = field(default_factory=dict)

    def covers(self, operation: str) -> bool:
        """True when every price the operation is quoted from is known and > 0. A token-billed image
        model (one with a text-input price) also needs its input-image price for edits."""
        if operation == "images.edits" and self.input_per_mtok is not None \
                and not _positive(self.input_image_per_mtok):
            return False
        if operation in ("images.generations", "images.edits"):
            return bool(self.per_image) and all(p > 0 for p in self.per_image.values())
        if operation == "audio.generations":
            return _positive(self.per_call) or _positive(self.per_second)
        names = _OPERATION_FIELDS.get(operation)
        return bool(names) and all(_positive(getattr(self, n)) for n in names)

    def token_prices(self, input_tokens: int) -> tuple[Decimal | None, Decimal | None]:
        """Input and output price per 1M tokens for a prompt of `input_tokens` (tiers applied)."""
        return (_tier_price(self.input_per_mtok, self.input_tiers, input_tokens),
                _tier_price(self.output_per_mtok, self.output_tiers, input_tokens))

    def image_price(self, size: str | None = None, quality: str | None = None) -> Decimal | None:
        """Price of one image. Unset parts take the model's defaults; 'auto' (or no default) is quoted at
        the dearest matching entry, since the upstream picks after we quote. None when nothing matches."""
        size = size or self.image_defaults.get("size") or "auto"
        quality = quality or self.image_defaults.get("quality") or "auto"
        matches = []
        for key, price in self.per_image.items():
            key_size, _, key_quality = key.partition("/")
            if size != "auto" and key_size != size:
                continue
            if key_quality and quality != "auto" and key_quality != quality:
                continue
            matches.append(price)
        return max(matches) if matches else None

    def scaled(self, factor: Decimal) -> ModelPrices:
        """Every price multiplied by `factor` (the margin)."""
        def mul(value: Decimal | None) -> Decimal | None:
            return None if value is None else value * factor

        return replace(
            self, **{name: mul(getattr(self, name)) for name in _DECIMAL_FIELDS},
            per_image={k: v * factor for k, v in self.per_image.items()},
            input_tiers=tuple((t, p * factor) for t, p in self.input_tiers),
            output_tiers=tuple((t, p * factor) for t, p in self.output_tiers),
        )


@dataclass(frozen=True)
class ModelSpec:
    """One sellable model: its public id (the request's `model`), limits, upstreams and prices."""

    id: str
    name: str
    family: str
    operations: tuple[str, ...]
    context_window: int | None
    default_max_tokens: int | None
    max_output_tokens: int | None
    upstreams: tuple[Upstream, ...]
    prices: ModelPrices
    notes: str = ""
    margin_factor: Decimal = Decimal(1)  # `prices` are the upstream's times this

    def upstream_cost(self, usd_at_our_prices: Decimal) -> Decimal:
        """What the upstream charged for a usage we priced at `usd_at_our_prices`: the margin taken
        off, to 10 places (the ledger column holds 32 characters)."""
        return (usd_at_our_prices / self.margin_factor).quantize(COST_STEP)

    def price_for(self, operation: str) -> bool:
        """True when the model lists `operation` and has a price > 0 for it."""
        return operation in self.operations and self.prices.covers(operation)


@dataclass
class Catalog:
    providers: dict[str, ProviderSpec]
    models: dict[str, ModelSpec]
    warnings: list[str] = field(default_factory=list)

    def available(self, model_id: str, env: Mapping[str, str]) -> tuple[bool, list[str]]:
        """(True, []) when some upstream's provider can be called; else (False, the env variables that
        would enable it, in upstream preference order). KeyError for an unknown model."""
        needed: list[str] = []
        for upstream in self.models[model_id].upstreams:
            provider = self.providers[upstream.provider]
            if provider.usable(env):
                return True, []
            if provider.api_key_env and provider.api_key_env not in needed:
                needed.append(provider.api_key_env)
        return False, needed

    def for_operation(self, operation: str) -> list[ModelSpec]:
        return [m for m in self.models.values() if operation in m.operations]


def load_catalog(path: Path | None = None, *, margin: Decimal = Decimal("0"),
                 use_genai_prices: bool = True) -> Catalog:
    """Read and validate the model table; price it; leave out (with a warning) what cannot be priced.

    `margin` is a fraction added to every price (Decimal("0.1") = +10%). Raises ValueError naming the
    model (or provider) and field for anything malformed in the file.
    """
    factor = Decimal(1) + _margin(margin)
    path = path or DEFAULT_PATH
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the model table: {exc}") from exc
    if not isinstance(document, dict):
        raise ValueError(f"{path}: the model table must be a JSON object")
    _no_unknown(document, {"version", "notes", "providers", "models"}, f"{path}: top level")

    providers = _parse_providers(document.get("providers"))
    raw_models = document.get("models")
    if not isinstance(raw_models, list):
        raise ValueError(f"{path}: 'models' must be a list")

    lookup = _genai_lookup if use_genai_prices else None
    catalog = Catalog(providers=providers, models={})
    for raw in raw_models:
        spec = _parse_model(raw, providers)
        if spec.id in catalog.models:
            raise ValueError(f"model {spec.id!r} field 'id': duplicate id")
        priced = _price(spec, providers, lookup)
        missing = [op for op in spec.operations if not priced.covers(op)]
        if missing:
            fields_needed = sorted({f for op in missing for f in _OPERATION_FIELDS[op]}
                                   | ({"input_image_per_mtok"} if "images.edits" in missing
                                      and priced.input_per_mtok is not None else set()))
            message = (f"model {spec.id!r} is not sold: no price > 0 for {', '.join(missing)} "
                       f"(needs {' / '.join(fields_needed)})")
            catalog.warnings.append(message)  # the app logs these at startup
            continue
        catalog.models[spec.id] = replace(spec, prices=priced.scaled(factor), margin_factor=factor)
    return catalog


# --- parsing -----------------------------------------------------------------------------------------


def _parse_providers(raw: Any) -> dict[str, ProviderSpec]:
    if not isinstance(raw, dict) or not raw:
        raise ValueError("model table: 'providers' must be a non-empty object")
    providers: dict[str, ProviderSpec] = {}
    for key, entry in raw.items():
        where = f"provider {key!r}"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: must be an object")
        _no_unknown(entry, _PROVIDER_KEYS, where)
        kind = entry.get("kind")
        if kind not in PROVIDER_KINDS:
            raise ValueError(f"{where} field 'kind': must be one of {sorted(PROVIDER_KINDS)}, got {kind!r}")
        base_url = entry.get("base_url")
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"{where} field 'base_url': must be an http(s) URL, got {base_url!r}")
        api_key_env = _optional_str(entry.get("api_key_env"), where, "api_key_env")
        base_url_env = _optional_str(entry.get("base_url_env"), where, "base_url_env")
        key_required = entry.get("key_required", True)
        if not isinstance(key_required, bool):
            raise ValueError(f"{where} field 'key_required': must be true or false")
        if key_required and not api_key_env:
            raise ValueError(f"{where} field 'api_key_env': required when key_required is true")
        genai = _optional_str(entry.get("genai_prices_provider"), where, "genai_prices_provider")
        cap_field = entry.get("cap_field", "max_tokens")
        if cap_field not in CAP_FIELDS:
            raise ValueError(f"{where} field 'cap_field': must be one of {', '.join(CAP_FIELDS)}, "
                             f"got {cap_field!r}")
        providers[key] = ProviderSpec(key=key, kind=kind, base_url=base_url, api_key_env=api_key_env,
                                      base_url_env=base_url_env, key_required=key_required,
                                      genai_prices_provider=genai, cap_field=cap_field)
    return providers


def _parse_model(raw: Any, providers: Mapping[str, ProviderSpec]) -> ModelSpec:
    if not isinstance(raw, dict):
        raise ValueError(f"model table: every model must be an object, got {raw!r}")
    model_id = raw.get("id")
    if not isinstance(model_id, str) or not model_id.strip() or model_id != model_id.strip():
        raise ValueError(f"model {model_id!r} field 'id': must be a non-empty string, no surrounding spaces")

    def bad(field_name: str, problem: str) -> ValueError:
        return ValueError(f"model {model_id!r} field {field_name!r}: {problem}")

    unknown = sorted(set(raw) - _MODEL_KEYS)
    if unknown:
        raise bad(unknown[0], "unknown field")
    name, family = raw.get("name"), raw.get("family")
    if not isinstance(name, str) or not name.strip():
        raise bad("name", "must be a non-empty string")
    if not isinstance(family, str) or not family.strip():
        raise bad("family", "must be a non-empty string")
    notes = raw.get("notes", "")
    if not isinstance(notes, str):
        raise bad("notes", "must be a string")

    operations = raw.get("operations")
    if not isinstance(operations, list) or not operations:
        raise bad("operations", "must be a non-empty list")
    for op in operations:
        if op not in OPERATIONS:
            raise bad("operations", f"unknown operation {op!r} (known: {', '.join(sorted(OPERATIONS))})")
    if len(set(operations)) != len(operations):
        raise bad("operations", "lists an operation twice")

    context = _optional_int(raw.get("context_window"), bad, "context_window")
    default_max = _optional_int(raw.get("default_max_tokens"), bad, "default_max_tokens")
    max_out = _optional_int(raw.get("max_output_tokens"), bad, "max_output_tokens")
    makes_tokens = any(op in TOKEN_OPERATIONS for op in operations)
    if makes_tokens or "embeddings" in operations:
        if context is None:
            raise bad("context_window", "required for token models")
    if makes_tokens:
        if default_max is None:
            raise bad("default_max_tokens", "required for models that generate tokens")
        if max_out is None:
            raise bad("max_output_tokens", "required for models that generate tokens")
        if default_max > max_out:
            raise bad("default_max_tokens", f"{default_max} exceeds max_output_tokens {max_out}")
        if context is not None and max_out > context:
            raise bad("max_output_tokens", f"{max_out} exceeds context_window {context}")
    elif default_max is not None or max_out is not None:
        raise bad("max_output_tokens" if max_out is not None else "default_max_tokens",
                  "only models that generate tokens have output limits")

    upstreams = _parse_upstreams(raw.get("upstreams"), providers, operations, bad)
    prices = _parse_prices(raw.get("prices"), operations, bad)
    return ModelSpec(id=model_id, name=name, family=family, operations=tuple(operations),
                     context_window=context, default_max_tokens=default_max, max_output_tokens=max_out,
                     upstreams=upstreams, prices=prices, notes=notes)


def _parse_upstreams(raw: Any, providers: Mapping[str, ProviderSpec], operations: list[str],
                     bad: Callable[[str, str], ValueError]) -> tuple[Upstream, ...]:
    if not isinstance(raw, list) or not raw:
        raise bad("upstreams", "must be a non-empty list")
    upstreams: list[Upstream] = []
    for index, entry in enumerate(raw):
        where = f"upstreams[{index}]"
        if not isinstance(entry, dict):
            raise bad(where, "must be an object with 'provider' and 'model'")
        unknown = sorted(set(entry) - {"provider", "model"})
        if unknown:
            raise bad(f"{where}.{unknown[0]}", "unknown field")
        provider, model = entry.get("provider"), entry.get("model")
        if provider not in providers:
            raise bad(f"{where}.provider", f"unknown provider {provider!r} (known: {', '.join(providers)})")
        if not isinstance(model, str) or not model.strip():
            raise bad(f"{where}.model", "must be the upstream's model name")
        served = KIND_OPERATIONS.get(providers[provider].kind)
        if served is not None and not set(operations) <= served:
            raise bad(f"{where}.provider", f"a {providers[provider].kind!r} provider serves only "
                                           f"{', '.join(sorted(served))}")
        if "audio.generations" in operations and providers[provider].kind == "openai":
            raise bad(f"{where}.provider", "audio.generations needs a provider of kind 'elevenlabs'")
        upstream = Upstream(provider=provider, model=model)
        if upstream in upstreams:
            raise bad(where, "duplicate upstream")
        upstreams.append(upstream)
    return tuple(upstreams)


def _parse_prices(raw: Any, operations: list[str], bad: Callable[[str, str], ValueError]) -> ModelPrices:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise bad("prices", "must be an object")
    unknown = sorted(set(raw) - _PRICE_KEYS)
    if unknown:
        raise bad(f"prices.{unknown[0]}", "unknown price field")
    used = {f for op in operations for f in (*_OPERATION_FIELDS[op], *_TOKEN_EXTRAS.get(op, ()))}
    for name in raw:
        if name != "image_defaults" and name not in used:
            raise bad(f"prices.{name}", "not used by any of the model's operations")
    values: dict[str, Any] = {}
    for name in _DECIMAL_FIELDS:
        if name in raw:
            values[name] = _decimal(raw[name], f"prices.{name}", bad)
    per_image = raw.get("per_image", {})
    if not isinstance(per_image, dict):
        raise bad("prices.per_image", "must be an object of 'size' or 'size/quality' -> price")
    images: dict[str, Decimal] = {}
    for key, value in per_image.items():
        size, _, quality = key.partition("/")
        if not size or "x" not in size or (key.endswith("/") and not quality):
            raise bad(f"prices.per_image.{key}", "key must be 'WIDTHxHEIGHT' or 'WIDTHxHEIGHT/quality'")
        images[key] = _decimal(value, f"prices.per_image.{key}", bad)
    defaults = raw.get("image_defaults", {})
    if not isinstance(defaults, dict) or set(defaults) - {"size", "quality"} or not all(
            isinstance(v, str) and v for v in defaults.values()):
        raise bad("prices.image_defaults", "must map 'size' and/or 'quality' to strings")
    if defaults and not images:
        raise bad("prices.image_defaults", "only image models have image defaults")
    return ModelPrices(**values, per_image=images, image_defaults=dict(defaults))


def _decimal(value: Any, field_name: str, bad: Callable[[str, str], ValueError]) -> Decimal:
    """A price given as a decimal string: a JSON number would have passed through a float."""
    if not isinstance(value, str):
        raise bad(field_name, f"must be a decimal string such as \"0.15\", got {value!r}")
    try:
        amount = Decimal(value.strip())
    except InvalidOperation as exc:
        raise bad(field_name, f"not a decimal: {value!r}") from exc
    if not amount.is_finite() or amount < 0:
        raise bad(field_name, f"must be a finite, non-negative decimal, got {value!r}")
    return amount


def _margin(margin: Decimal | int | str) -> Decimal:
    if isinstance(margin, float | bool) or not isinstance(margin, Decimal | int | str):
        raise TypeError(f"margin must be a Decimal (or a decimal string), never a float: {margin!r}")
    try:
        value = Decimal(str(margin).strip())
    except InvalidOperation as exc:
        raise ValueError(f"margin: not a decimal: {margin!r}") from exc
    if not value.is_finite() or value < 0:
        raise ValueError(f"margin must be a finite fraction >= 0 (0.1 = +10%), got {margin!r}")
    return value


def _optional_int(value: Any, bad: Callable[[str, str], ValueError], field_name: str) -> int | None:
    if value is None:
        return None
    if type(value) is not int or value <= 0:
        raise bad(field_name, f"must be a positive integer, got {value!r}")
    return value


def _optional_str(value: Any, where: str, field_name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where} field {field_name!r}: must be a non-empty string or null")
    return value


def _no_unknown(entry: Mapping[str, Any], known: Iterable[str], where: str) -> None:
    unknown = sorted(set(entry) - set(known))
    if unknown:
        raise ValueError(f"{where} field {unknown[0]!r}: unknown field")


# --- pricing -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Quote:
    """One genai-prices price: a base and cliff tiers."""

    base: Decimal
    tiers: Tiers = ()

    def at(self, input_tokens: int) -> Decimal:
        price = self.base
        for start, tier_price in self.tiers:
            if input_tokens > start:
                price = tier_price
        return price


def _price(spec: ModelSpec, providers: Mapping[str, ProviderSpec],
           lookup: Callable[[str, str], dict[str, _Quote]] | None) -> ModelPrices:
    """The table's prices with genai-prices' values in place wherever it knows an upstream's model.

    The call is charged once, before we know which upstream will serve it, so each price is the dearest
    of the model's upstreams: genai-prices' price for those it knows, the table's for the others.
    """
    if lookup is None:
        return spec.prices
    wanted = {f for op in spec.operations
              for f in (*_OPERATION_FIELDS[op], *_TOKEN_EXTRAS.get(op, ()))} & set(_DECIMAL_FIELDS)
    known: dict[str, list[_Quote]] = {name: [] for name in wanted}
    unknown: set[str] = set()
    for upstream in spec.upstreams:
        genai_provider = providers[upstream.provider].genai_prices_provider
        quotes = lookup(genai_provider, upstream.model) if genai_provider else {}
        for name in wanted:
            if name in quotes:
                known[name].append(quotes[name])
            else:
                unknown.add(name)
    updates: dict[str, Any] = {}
    for name, quotes in known.items():
        if not quotes:
            continue
        table = getattr(spec.prices, name)
        if name in unknown and _positive(table):
            quotes = [*quotes, _Quote(table)]
        base, tiers = _dearest(quotes)
        updates[name] = base
        if name in ("input_per_mtok", "output_per_mtok"):
            updates[name.replace("_per_mtok", "_tiers")] = tiers
    if not updates:
        return spec.prices
    return replace(spec.prices, source="genai-prices", **updates)


def _dearest(quotes: list[_Quote]) -> tuple[Decimal, Tiers]:
    """The upper envelope of several tiered prices: at every prompt size, the highest of them."""
    base = max(q.base for q in quotes)
    tiers: list[tuple[int, Decimal]] = []
    previous = base
    for start in sorted({start for q in quotes for start, _ in q.tiers}):
        price = max(q.at(start + 1) for q in quotes)
        if price != previous:
            tiers.append((start, price))
            previous = price
    return base, tuple(tiers)


def _tier_price(base: Decimal | None, tiers: Tiers, input_tokens: int) -> Decimal | None:
    price = base
    for start, tier_price in tiers:
        if input_tokens > start:
            price = tier_price
    return price


@cache
def _genai_lookup(provider_id: str, model_ref: str) -> dict[str, _Quote]:
    """Prices genai-prices knows for one upstream model, by our field name ({} when it does not know it).

    Uses its public `calc_price` on an empty usage to resolve the model (its own matching rules and
    bundled offline data, prices in force now), then reads the matched model's unit prices.
    """
    from genai_prices import Usage, calc_price

    try:
        result = calc_price(Usage(), model_ref, provider_id=provider_id,
                            genai_request_timestamp=datetime.now(tz=UTC))
    except (LookupError, ValueError):
        return {}
    model_price = result.model_price
    quotes: dict[str, _Quote] = {}
    for ours, theirs in (("input_per_mtok", "input_mtok"), ("output_per_mtok", "output_mtok"),
                         ("per_mchars", "input_mchars"), ("input_image_per_mtok", "input_image_mtok")):
        quote = _as_quote(getattr(model_price, theirs, None))
        if quote is not None:
            quotes[ours] = quote
    hourly = _as_quote(getattr(model_price, "audio_hours", None)
                       or getattr(model_price, "input_audio_hours", None))
    if hourly is not None and not hourly.tiers:
        per_minute = (hourly.base / 60).quantize(_PER_MINUTE_STEP, rounding=ROUND_CEILING).normalize()
        quotes["per_minute"] = _Quote(per_minute)
    return quotes


def _as_quote(value: Any) -> _Quote | None:
    """A genai-prices price (a Decimal, or TieredPrices with .base and .tiers) as a positive _Quote."""
    if isinstance(value, Decimal):
        return _Quote(value) if value > 0 else None
    base = getattr(value, "base", None)
    if isinstance(base, Decimal) and base > 0:
        tiers = tuple((int(t.start), t.price) for t in sorted(value.tiers, key=lambda t: t.start))
        return _Quote(base, tiers)
    return None


def _positive(value: Decimal | None) -> bool:
    return value is not None and value > 0


__all__ = [
    "Catalog", "ModelPrices", "ModelSpec", "OPERATIONS", "ProviderSpec", "TOKEN_OPERATIONS", "Upstream",
    "load_catalog",
]
