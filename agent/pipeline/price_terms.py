"""One description of what a skill's operation costs, shown identically everywhere it is listed.

The OpenAPI document (`x-payment-info`), the 402's bazaar info, the MCP tool descriptions, the
discovery metadata and the catalogue page all show `PriceTerms.as_json()` (or its `summary`), so the
four places a caller may look list the same price. The facts come from the skill itself: a fixed
price, or the bounds and rule its operation declares next to its pricer (skills/skill.py
`Operation.price_floor_usd / price_cap_usd / price_rule`, filled from the constants the pricer uses);
the networks and assets from the payment processor (what its requirements will ask for).

`as_json()` shape (all amounts as strings: exact decimal USD, and atomic units of the asset):

    {"scheme": "exact",
     "pricing": "fixed" | "free" | "per_request",
     "price": {"usd": "0.0115", "atomic": "11500"},           # fixed and free only
     "min": {...}, "max": {...},                               # per_request (max when there is one)
     "computed": "estimated input tokens x ...",               # per_request: how, one sentence
     "model_prices": "GET /v1/models",                         # per_request on a model
     "summary": "$0.0115 per call, in USDC on Base or Solana",
     "networks": ["eip155:8453", "solana:5eykt..."],           # CAIP-2
     "assets": [{"network": "eip155:8453", "asset": "0x8335...", "symbol": "USDC", "decimals": 6}]}
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from payments.money import USDC_DECIMALS, usd_text, usd_to_atomic
from payments.networks import NetworkInfo
from skills.skill import Skill

Pricing = Literal["fixed", "free", "per_request"]
MODEL_PRICES = "GET /v1/models"  # where each model's token and media prices are listed
UNDECLARED_RULE = "computed from the request; the 402 answer states the exact amount"


@dataclass(frozen=True)
class PaymentOption:
    """One way to pay: a network (CAIP-2) and the token (USDC) paid there."""

    network: str
    asset: str
    label: str = ""
    symbol: str = "USDC"
    decimals: int = USDC_DECIMALS

    @classmethod
    def of(cls, network: NetworkInfo, asset: str | None = None) -> PaymentOption:
        return cls(network.caip2, asset or network.usdc, network.label or network.v1_name,
                   decimals=network.decimals)

    def as_json(self) -> dict[str, Any]:
        return {"network": self.network, "asset": self.asset, "symbol": self.symbol,
                "decimals": self.decimals}


@dataclass(frozen=True)
class PriceTerms:
    """What one operation costs (or the range over a route's models) and how it may be paid."""

    pricing: Pricing
    price_usd: Decimal | None = None  # fixed and free
    min_usd: Decimal | None = None  # per_request (None: no declared minimum)
    max_usd: Decimal | None = None  # per_request, when there is a maximum
    rule: str | None = None  # per_request: how the price is computed from the request
    model_prices: str | None = None  # per_request on models: where the per-model prices are
    options: tuple[PaymentOption, ...] = ()

    @property
    def paid(self) -> bool:
        """False for a free operation (no payment is asked)."""
        return self.pricing != "free"

    @property
    def decimals(self) -> int:
        return self.options[0].decimals if self.options else USDC_DECIMALS

    def atomic(self, usd: Decimal) -> int:
        """USD -> the asset's atomic units, rounded up exactly as the pipeline quotes."""
        return usd_to_atomic(usd, self.decimals)

    @property
    def networks(self) -> list[str]:
        return list(dict.fromkeys(o.network for o in self.options))

    @property
    def summary(self) -> str:
        """One line for people: `$0.0115 per call, in USDC on Base Sepolia or Solana devnet`."""
        if self.pricing == "free":
            return "free"
        if self.pricing == "fixed":
            assert self.price_usd is not None
            text = f"${usd_text(self.price_usd)} per call"
        else:
            bounds = (f"from ${usd_text(self.min_usd)}" if self.min_usd is not None else "") + (
                f" to ${usd_text(self.max_usd)}" if self.max_usd is not None else "")
            text = f"priced per request ({bounds.strip() or 'no declared bounds'}): {self.rule}"
            if self.model_prices:
                text += f"; per-model prices at {self.model_prices}"
        where = " or ".join(dict.fromkeys(o.label or o.network for o in self.options))
        symbols = "/".join(dict.fromkeys(o.symbol for o in self.options)) or "USDC"
        return f"{text}, in {symbols} on {where}" if where else text

    def _amount(self, usd: Decimal) -> dict[str, str]:
        return {"usd": usd_text(usd), "atomic": str(self.atomic(usd))}

    def as_json(self) -> dict[str, Any]:
        """The one machine-readable price description every face shows (see the module doc)."""
        out: dict[str, Any] = {"scheme": "exact", "pricing": self.pricing}
        if self.price_usd is not None:
            out["price"] = self._amount(self.price_usd)
        if self.pricing == "per_request":
            if self.min_usd is not None:
                out["min"] = self._amount(self.min_usd)
            if self.max_usd is not None:
                out["max"] = self._amount(self.max_usd)
            out["computed"] = self.rule or UNDECLARED_RULE
            if self.model_prices:
                out["model_prices"] = self.model_prices
        out["summary"] = self.summary
        out["networks"] = self.networks
        out["assets"] = [o.as_json() for o in self.options]
        return out


def price_terms(skill: Skill, operation_name: str | None,
                networks: Sequence[PaymentOption]) -> PriceTerms:
    """The terms of `skill`'s operation (None: its default). SkillInputError for an unknown one."""
    op = skill.operation(operation_name)
    options = tuple(networks)
    floor, cap = op.price_floor_usd, op.price_cap_usd
    if floor is not None and floor == cap:
        return PriceTerms("free" if floor == 0 else "fixed", price_usd=floor, options=options)
    return PriceTerms("per_request", min_usd=floor, max_usd=cap, rule=op.price_rule or UNDECLARED_RULE,
                      model_prices=MODEL_PRICES if skill.kind == "model" else None, options=options)


def route_terms(terms: Iterable[PriceTerms]) -> PriceTerms | None:
    """The terms of a route served by several skills (a /v1 route over every model): the lowest
    minimum, the highest maximum (none if any has none), the rule when they share one. None: no
    skill serves it. All fixed at one price: that price."""
    listed = list(terms)
    if not listed:
        return None
    options = listed[0].options
    paid = [t for t in listed if t.paid]
    if not paid:
        return PriceTerms("free", price_usd=Decimal(0), options=options)
    fixed = {t.price_usd for t in paid if t.pricing == "fixed"}
    if len(paid) == len(listed) and len(fixed) == 1 and all(t.pricing == "fixed" for t in paid):
        return PriceTerms("fixed", price_usd=fixed.pop(), options=options)
    lows = [t.price_usd if t.pricing != "per_request" else t.min_usd for t in listed]
    highs = [t.price_usd if t.pricing != "per_request" else t.max_usd for t in listed]
    rules = list(dict.fromkeys(t.rule for t in paid if t.rule))
    return PriceTerms(
        "per_request",
        min_usd=None if any(v is None for v in lows) else min(v for v in lows if v is not None),
        max_usd=None if any(v is None for v in highs) else max(v for v in highs if v is not None),
        rule=rules[0] if len(rules) == 1 else "; or ".join(rules) if rules else UNDECLARED_RULE,
        model_prices=next((t.model_prices for t in listed if t.model_prices), None), options=options)
