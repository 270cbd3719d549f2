"""The model table's values: providers, upstreams, prices and the sellable model (`ModelSpec`), and how
this gateway reaches each provider (`ProviderAccess`).

Plain frozen dataclasses, built once at startup: the catalog (catalog.py) makes them from models.json
(validated by table_file.py) and prices them; every operation of skills/models reads a ModelSpec. The
vocabulary of the table lives here too: the operations, provider kinds, the output cap's fields and
which prices each operation is quoted from.

This module imports nothing from the rest of paywire: money is plain `Decimal`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, Literal, get_args

OperationName = Literal[
    "chat.completions", "completions", "edits", "embeddings", "audio.speech", "audio.transcriptions",
    "audio.translations", "audio.generations", "images.generations", "images.edits",
]
OPERATIONS: frozenset[str] = frozenset(get_args(OperationName))
# Operations whose answer is generated tokens: they need output limits and both token prices.
TOKEN_OPERATIONS: frozenset[str] = frozenset({"chat.completions", "completions", "edits"})

ProviderKind = Literal["openai", "elevenlabs"]
# The only operations a non-OpenAI-shaped provider serves.
KIND_OPERATIONS: dict[str, frozenset[str]] = {"elevenlabs": frozenset({"audio.generations"})}

# The output cap's field in a chat body: OpenAI's API takes max_completion_tokens for every chat model
# (its reasoning models refuse max_tokens); OpenRouter, vLLM, Ollama and the other compatible APIs take
# max_tokens.
CapField = Literal["max_tokens", "max_completion_tokens"]
CAP_FIELDS: tuple[CapField, ...] = get_args(CapField)

# The prices held as one Decimal each (per_image is a table of them).
DecimalPrice = Literal["input_per_mtok", "output_per_mtok", "per_mchars", "per_minute", "per_call",
                       "per_second", "input_image_per_mtok"]
DECIMAL_PRICES: tuple[DecimalPrice, ...] = get_args(DecimalPrice)
# Which prices each operation is quoted from.
OPERATION_PRICES: dict[str, tuple[str, ...]] = {
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
TOKEN_EXTRAS: dict[str, tuple[str, ...]] = {
    "images.generations": ("input_per_mtok",),
    "images.edits": ("input_per_mtok", "input_image_per_mtok"),
    "audio.transcriptions": ("input_per_mtok",),
    "audio.translations": ("input_per_mtok",),
}

COST_STEP = Decimal("1e-10")

Tiers = tuple[tuple[int, Decimal], ...]


def prices_used(operations: Iterable[str]) -> set[str]:
    """Every price the operations may be quoted from (their own and their optional token extras)."""
    return {name for op in operations for name in (*OPERATION_PRICES[op], *TOKEN_EXTRAS.get(op, ()))}


@dataclass(frozen=True)
class ProviderAccess:
    """How this gateway reaches one provider: its API key (None: not set) and a base URL replacing the
    table's (None: the table's). The assembly builds one per provider from its settings (the catalog's
    `provider_variables()` names the variables); the model skills read nothing else."""

    api_key: str | None = field(default=None, repr=False)
    base_url: str | None = None


NO_ACCESS = ProviderAccess()


@dataclass(frozen=True)
class ProviderVariables:
    """The environment variables that configure one provider (None: the table names none)."""

    api_key: str | None
    base_url: str | None


@dataclass(frozen=True)
class ProviderSpec:
    """One upstream API as the table describes it: where it is and which variables configure it."""

    name: str
    kind: ProviderKind
    base_url: str
    api_key_env: str | None
    base_url_env: str | None
    key_required: bool = True
    genai_prices_provider: str | None = None
    # The field its chat API takes the output cap in, used when the caller names none.
    cap_field: CapField = "max_tokens"

    def usable(self, access: ProviderAccess) -> bool:
        """True when a call can be made: the key is set; for a provider that needs no key (a server
        of the operator's own: Ollama, vLLM, llama.cpp), its base URL is set: the table's is only a
        guess, and a model listed as available must not fail on a server nobody started."""
        if self.key_required:
            return bool(access.api_key)
        return bool(access.base_url)

    def enabled_by(self) -> str | None:
        """The variable that makes this provider usable (`usable`): its key's, or for a keyless
        one its base URL's."""
        return self.api_key_env if self.key_required else self.base_url_env

    def url(self, access: ProviderAccess) -> str:
        """The base URL without a trailing slash: the access's override (tests use a loopback) or the
        table's."""
        return (access.base_url or self.base_url).rstrip("/")


@dataclass(frozen=True)
class Upstream:
    provider: str
    model: str


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
    source: Literal["table", "genai-prices"] = "table"
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
                and not positive(self.input_image_per_mtok):
            return False
        if operation in ("images.generations", "images.edits"):
            return bool(self.per_image) and all(p > 0 for p in self.per_image.values())
        if operation == "audio.generations":
            return positive(self.per_call) or positive(self.per_second)
        names = OPERATION_PRICES.get(operation, ())
        return bool(names) and all(positive(getattr(self, n)) for n in names)

    def token_prices(self, input_tokens: int) -> tuple[Decimal | None, Decimal | None]:
        """Input and output price per 1M tokens for a prompt of `input_tokens` (tiers applied)."""
        return (tier_price(self.input_per_mtok, self.input_tiers, input_tokens),
                tier_price(self.output_per_mtok, self.output_tiers, input_tokens))

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

    def image_options(self) -> dict[str | None, list[str] | None]:
        """What `image_price` quotes, size by size: size (None: none given) -> the qualities it takes
        (None among them: none given; the whole None: any, the size has no quality prices); sizes it
        quotes nothing for are left out."""
        sizes = [None, *sorted({key.partition("/")[0] for key in self.per_image}), "auto"]
        qualities = sorted({key.partition("/")[2] for key in self.per_image} - {""})
        options: dict[str | None, list[str] | None] = {}
        for size in sizes:
            if self.image_price(size, "\0(any)") is not None:  # a quality no price names: any is taken
                options[size] = None
            elif taken := [q for q in (None, *qualities, "auto") if self.image_price(size, q) is not None]:
                options[size] = taken
        return options

    def scaled(self, factor: Decimal) -> ModelPrices:
        """Every price multiplied by `factor` (the margin)."""
        def mul(value: Decimal | None) -> Decimal | None:
            return None if value is None else value * factor

        updates: dict[str, Any] = {name: mul(getattr(self, name)) for name in DECIMAL_PRICES}
        return replace(
            self, **updates,
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
    operations: tuple[OperationName, ...]
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


def tier_price(base: Decimal | None, tiers: Tiers, input_tokens: int) -> Decimal | None:
    """The price for a prompt of `input_tokens`: the last tier it is above, else the base."""
    price = base
    for start, above in tiers:
        if input_tokens > start:
            price = above
    return price


def positive(value: Decimal | None) -> bool:
    return value is not None and value > 0
