"""What federation works with: a source the operator names, an offer an upstream makes, and the
resource paywire sells for it. Plain values: no I/O here."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from decimal import ROUND_CEILING, Decimal
from typing import Any, Literal
from urllib.parse import urlsplit

from payments.networks import KNOWN_NETWORKS, NetworkInfo

SourceKind = Literal["catalogue", "seller"]
USD_QUANTUM = Decimal("0.000001")  # USDC's atomic unit: every sale price is rounded up to it


@dataclass(frozen=True)
class Margin:
    """What paywire adds to an upstream's price: a percent of it, plus a fixed amount."""

    percent: Decimal = Decimal(0)
    fixed_usd: Decimal = Decimal(0)

    def price(self, upstream_usd: Decimal) -> Decimal:
        """The sale price: upstream + margin, rounded up to the atomic unit (never below cost)."""
        raw = upstream_usd * (1 + self.percent / 100) + self.fixed_usd
        return raw.quantize(USD_QUANTUM, rounding=ROUND_CEILING)


@dataclass(frozen=True)
class Filters:
    """Which of a source's offers are imported. Empty sets admit everything."""

    categories: frozenset[str] = frozenset()   # lower case; an offer needs one of them
    keywords: tuple[str, ...] = ()             # lower case; an offer's text needs one of them
    networks: frozenset[str] = frozenset()     # CAIP-2 ids; an offer needs a payable accept on one
    max_upstream_usd: Decimal | None = None
    allow_sellers: frozenset[str] = frozenset()  # seller origins or host names
    deny_sellers: frozenset[str] = frozenset()

    def refusal(self, offer: Offer) -> str | None:
        """Why `offer` is not imported (None: it is)."""
        host = urlsplit(offer.seller).hostname or ""
        if self.deny_sellers & {offer.seller, host}:
            return "seller is on the deny list"
        if self.allow_sellers and not self.allow_sellers & {offer.seller, host}:
            return "seller is not on the allow list"
        if self.categories and not self.categories & {c.lower() for c in offer.categories}:
            return "no category matches"
        text = f"{offer.name} {offer.description} {offer.url}".lower()
        if self.keywords and not any(k in text for k in self.keywords):
            return "no keyword matches"
        if self.networks and not any(a.network in self.networks for a in offer.accepts):
            return "no accepted network matches"
        if self.max_upstream_usd is not None and offer.upstream_usd > self.max_upstream_usd:
            return f"upstream price {offer.upstream_usd} is above {self.max_upstream_usd}"
        return None

    def to_json(self) -> dict[str, Any]:
        return {"categories": sorted(self.categories), "keywords": list(self.keywords),
                "networks": sorted(self.networks),
                "max_upstream_usd": None if self.max_upstream_usd is None else str(self.max_upstream_usd),
                "allow_sellers": sorted(self.allow_sellers), "deny_sellers": sorted(self.deny_sellers)}

    @staticmethod
    def from_json(data: dict[str, Any]) -> Filters:
        cap = data.get("max_upstream_usd")
        return Filters(frozenset(data.get("categories", ())), tuple(data.get("keywords", ())),
                       frozenset(data.get("networks", ())),
                       None if cap is None else Decimal(cap),
                       frozenset(data.get("allow_sellers", ())), frozenset(data.get("deny_sellers", ())))


@dataclass(frozen=True)
class Source:
    """A place resources are imported from: a discovery catalogue (a facilitator's
    `/discovery/resources`, a seller's `/.well-known/x402`) or one seller URL probed unpaid."""

    id: str      # stable: derived from the URL (source_id_for)
    url: str
    kind: SourceKind
    filters: Filters = Filters()
    margin: Margin = Margin()
    origin: Literal["env", "cli"] = "cli"


@dataclass(frozen=True)
class Accept:
    """One way an upstream takes payment (an entry of its 402's `accepts`), in USDC."""

    scheme: str
    network: str         # CAIP-2
    asset: str
    amount_atomic: int
    pay_to: str
    max_timeout_seconds: int = 60
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def usd(self) -> Decimal:
        info = network_info(self.network)
        decimals = info.decimals if info is not None else 6
        return Decimal(self.amount_atomic).scaleb(-decimals)


@dataclass(frozen=True)
class Offer:
    """One upstream resource as its catalogue or its 402 describes it (untrusted text already
    bounded and validated: federation/discovery.py)."""

    url: str             # the upstream resource, called with the caller's body unchanged
    method: str          # POST or GET
    seller: str          # scheme://host[:port] of `url`
    name: str
    description: str
    categories: tuple[str, ...] = ()
    input_schema: dict[str, Any] = field(default_factory=lambda: {"type": "object"})
    example: dict[str, Any] | None = None
    accepts: tuple[Accept, ...] = ()  # the USDC `exact` options on known networks only

    @property
    def upstream_usd(self) -> Decimal:
        """What a call costs upstream: its cheapest accepted option."""
        return min(a.usd for a in self.accepts)


@dataclass(frozen=True)
class ImportedResource:
    """A resource paywire sells for an upstream offer: its id, its sale price, where it came
    from. Stored in the ledger (`paywire_federated_resources`) as `to_json()`."""

    resource_id: str
    source_id: str
    offer: Offer
    price_usd: Decimal

    def to_json(self) -> dict[str, Any]:
        offer = asdict(self.offer)
        offer["accepts"] = [asdict(a) for a in self.offer.accepts]
        return {"resource_id": self.resource_id, "source_id": self.source_id,
                "price_usd": str(self.price_usd), "offer": offer}

    @staticmethod
    def from_json(data: dict[str, Any]) -> ImportedResource:
        o = dict(data["offer"])
        o["accepts"] = tuple(Accept(**a) for a in o.get("accepts", ()))
        o["categories"] = tuple(o.get("categories", ()))
        return ImportedResource(data["resource_id"], data["source_id"], Offer(**o),
                                Decimal(data["price_usd"]))

    def fingerprint(self) -> str:
        """Changes whenever anything sold changes (price, schema, description, accepts)."""
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()


_SLUG = re.compile(r"[^a-z0-9]+")


def resource_id_for(method: str, url: str) -> str:
    """A stable resource id for an upstream resource: readable (host and path) and unique (a
    digest of method and URL), within the resource id rule `^[a-z0-9][a-z0-9._-]{0,127}$`."""
    parts = urlsplit(url)
    digest = hashlib.sha256(f"{method.upper()} {url}".encode()).hexdigest()[:10]
    host = _SLUG.sub("-", (parts.hostname or "x").lower()).strip("-")[:40] or "x"
    path = _SLUG.sub("-", parts.path.lower()).strip("-")[-60:].strip("-")
    return ".".join(p for p in ("x402", host, path, digest) if p)


def source_id_for(url: str) -> str:
    """A source's stable id: its host and a digest of its URL."""
    host = _SLUG.sub("-", (urlsplit(url).hostname or "x").lower()).strip("-")[:40] or "x"
    return f"{host}-{hashlib.sha256(url.encode()).hexdigest()[:8]}"


def network_info(name: str) -> NetworkInfo | None:
    """A known network by CAIP-2 id or v1 name (None: one paywire cannot pay on)."""
    return next((n for n in KNOWN_NETWORKS if name in (n.caip2, n.v1_name)), None)
