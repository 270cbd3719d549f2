"""The operator's federation settings, read from plain values (agent/settings.py holds the
variables; this module knows their formats): the sources named in PAYWIRE_FEDERATE, the filters
and margin they are imported with, the wallet that pays upstream, the caps."""

from __future__ import annotations

import re
from decimal import Decimal
from urllib.parse import urlsplit

from payments.networks import lookup_network
from payments.payer import PayerKeys, PayError

from .model import Filters, Margin, Source, source_id_for

_SPLIT = re.compile(r"[,\s]+")
SELLER_PREFIX = "seller:"


def words(text: str | None) -> tuple[str, ...]:
    """A comma- or space-separated list, empty items dropped."""
    return tuple(w for w in _SPLIT.split(text or "") if w)


def url_problem(url: str) -> str | None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url[:200]!r} is not an http:// or https:// URL"
    return None


def filters_of(*, categories: str | None = None, keywords: str | None = None,
               networks: str | None = None, max_upstream_usd: Decimal | None = None,
               allow_sellers: str | None = None, deny_sellers: str | None = None) -> Filters:
    """Filters from the settings' texts; ValueError naming a network that is not one."""
    caip2 = frozenset(lookup_network(n).caip2 for n in words(networks))
    return Filters(frozenset(c.lower() for c in words(categories)),
                   tuple(k.lower() for k in words(keywords)), caip2, max_upstream_usd,
                   frozenset(words(allow_sellers)), frozenset(words(deny_sellers)))


def env_sources(federate: str | None, filters: Filters, margin: Margin) -> list[Source]:
    """The sources PAYWIRE_FEDERATE names: catalogue URLs, and `seller:URL` for one seller.
    ValueError naming the first entry that is not an http(s) URL."""
    sources = []
    for entry in words(federate):
        seller = entry.startswith(SELLER_PREFIX)
        url = entry[len(SELLER_PREFIX):] if seller else entry
        problem = url_problem(url)
        if problem:
            raise ValueError(f"PAYWIRE_FEDERATE: {problem}")
        sources.append(Source(source_id_for(url), url, "seller" if seller else "catalogue",
                              filters, margin, origin="env"))
    return sources


def payer_keys(secret: str) -> PayerKeys:
    """PAYWIRE_FEDERATION_PAYER_KEY: one key per chain family, comma separated. ValueError
    saying what is wrong (never quoting the key)."""
    keys = PayerKeys()
    for number, part in enumerate(words(secret), 1):
        try:
            found = PayerKeys.from_secret(part)
        except PayError:
            raise ValueError(f"PAYWIRE_FEDERATION_PAYER_KEY: key {number} is neither an EVM "
                             "private key (0x + 64 hex digits) nor a Solana secret key (base58, "
                             "64 bytes)") from None
        if (found.evm_key and keys.evm_key) or (found.solana_key and keys.solana_key):
            raise ValueError("PAYWIRE_FEDERATION_PAYER_KEY: two keys of one chain family; give "
                             "at most one EVM key and one Solana key")
        keys = PayerKeys(keys.evm_key or found.evm_key, keys.solana_key or found.solana_key)
    if not (keys.evm_key or keys.solana_key):
        raise ValueError("PAYWIRE_FEDERATION_PAYER_KEY is empty")
    return keys
