"""The model table: which models are sold, where each is served from, and at what price.

`models.json` holds the providers (base URL, key and base-URL variables, kind, the field their chat API
takes the output cap in) and the models (operations, limits, upstreams in preference order, fallback
prices). `load_catalog` reads it (table_file.py validates it strictly: one CatalogError lists every
problem), takes token, character and audio-hour prices from the `genai-prices` package where it knows an
upstream's model, applies the operator's margin, and leaves out (with a warning) every model that lacks a
price for an operation it lists: a model is never sold at $0.

Some operations bill tokens besides their unit price on some models only (spec.TOKEN_EXTRAS): the GPT
Image models bill the prompt's text tokens and the input images' image tokens on top of the output
image, gpt-4o-transcribe bills its `prompt` as text tokens on top of the audio. Those prices are
optional (DALL-E and Whisper bill none); where a model has them, its routes price those inputs.

The catalog reads no environment: `provider_variables()` names each provider's variables, the assembly
reads them into `ProviderAccess` values, and availability is asked with those.

This module imports nothing from the rest of paywire: money is plain `Decimal`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from functools import cache
from pathlib import Path
from typing import Any

from .spec import (
    DECIMAL_PRICES,
    NO_ACCESS,
    OPERATION_PRICES,
    ModelPrices,
    ModelSpec,
    ProviderAccess,
    ProviderSpec,
    ProviderVariables,
    Tiers,
    positive,
    prices_used,
    tier_price,
)
from .table_file import CatalogError, read_table

DEFAULT_PATH = Path(__file__).with_name("models.json")
# Per-minute prices derived from per-hour ones are rounded up to this step (never in the buyer's favour
# below cost; the atomic conversion rounds up again).
_PER_MINUTE_STEP = Decimal("1e-9")


@dataclass(frozen=True)
class Catalog:
    """The model table, loaded and priced: its providers, the models sold (by id), and a warning for
    each model left out."""

    providers: dict[str, ProviderSpec]
    models: dict[str, ModelSpec]
    warnings: list[str] = field(default_factory=list)

    def provider_variables(self) -> dict[str, ProviderVariables]:
        """The environment variables each provider reads: its key's and its base URL override's."""
        return {name: ProviderVariables(api_key=p.api_key_env, base_url=p.base_url_env)
                for name, p in self.providers.items()}

    def available(self, model_id: str, providers: Mapping[str, ProviderAccess]) -> tuple[bool, list[str]]:
        """(True, []) when some upstream's provider can be called with `providers`; else (False, the
        variables that would enable it (keys; a keyless server's base URL), in upstream preference
        order). KeyError for an unknown model."""
        needed: list[str] = []
        for upstream in self.models[model_id].upstreams:
            provider = self.providers[upstream.provider]
            if provider.usable(providers.get(upstream.provider, NO_ACCESS)):
                return True, []
            variable = provider.enabled_by()
            if variable and variable not in needed:
                needed.append(variable)
        return False, needed


def load_catalog(path: Path | None = None, *, margin: Decimal = Decimal("0"),
                 use_genai_prices: bool = True) -> Catalog:
    """Read and validate the model table; price it; leave out (with a warning) what cannot be priced.

    `margin` is a fraction added to every price (Decimal("0.1") = +10%). Raises CatalogError (a
    ValueError) naming the file and, for each problem, the model (or provider) and field.
    """
    factor = Decimal(1) + _margin(margin)
    providers, specs = read_table(path or DEFAULT_PATH)
    lookup = _genai_lookup if use_genai_prices else None
    models: dict[str, ModelSpec] = {}
    warnings: list[str] = []
    for spec in specs:
        priced = _price(spec, providers, lookup)
        missing = [op for op in spec.operations if not priced.covers(op)]
        if missing:
            fields_needed = sorted({f for op in missing for f in OPERATION_PRICES[op]}
                                   | ({"input_image_per_mtok"} if "images.edits" in missing
                                      and priced.input_per_mtok is not None else set()))
            warnings.append(f"model {spec.id!r} is not sold: no price > 0 for {', '.join(missing)} "
                            f"(needs {' / '.join(fields_needed)})")  # the app logs these at startup
            continue
        models[spec.id] = replace(spec, prices=priced.scaled(factor), margin_factor=factor)
    return Catalog(providers=providers, models=models, warnings=warnings)


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


# --- pricing -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Quote:
    """One genai-prices price: a base and cliff tiers."""

    base: Decimal
    tiers: Tiers = ()

    def at(self, input_tokens: int) -> Decimal:
        price = tier_price(self.base, self.tiers, input_tokens)
        return self.base if price is None else price


def _price(spec: ModelSpec, providers: Mapping[str, ProviderSpec],
           lookup: Callable[[str, str], dict[str, _Quote]] | None) -> ModelPrices:
    """The table's prices with genai-prices' values in place wherever it knows an upstream's model.

    The call is charged once, before we know which upstream will serve it, so each price is the dearest
    of the model's upstreams: genai-prices' price for those it knows, the table's for the others.
    """
    if lookup is None:
        return spec.prices
    wanted = prices_used(spec.operations) & set(DECIMAL_PRICES)
    known: dict[str, list[_Quote]] = {name: [] for name in wanted}
    unknown: set[str] = set()
    for upstream in spec.upstreams:
        genai_provider = providers[upstream.provider].genai_prices_provider
        found = lookup(genai_provider, upstream.model) if genai_provider else {}
        for name in wanted:
            if name in found:
                known[name].append(found[name])
            else:
                unknown.add(name)
    updates: dict[str, Any] = {}
    for name, quotes in known.items():
        if not quotes:
            continue
        table = getattr(spec.prices, name)
        if name in unknown and positive(table):
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


__all__ = ["Catalog", "CatalogError", "load_catalog"]
