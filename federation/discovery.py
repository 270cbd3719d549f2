"""What a source offers, read from what it publishes: a facilitator's (or a paywire's)
`/discovery/resources` pages, a host's `/.well-known/x402` manifest, or one seller's 402.

Formats (docs/notes/issue-24-federation.md §4):

- a discovery page `{x402Version, items, pagination{limit, offset, total}}`: every page is
  followed (`offset`/`limit`), at most `MAX_PAGES` pages and `max_offers` items;
- a manifest `{x402Version, resources}`: a complete entry (one with `accepts`, read as a
  discovery item) is used as it is; a bare pointer `{url, method?}` is probed (at most
  `MAX_POINTERS`, `PROBES_AT_ONCE` at a time). Its URLs must be on the manifest's own host (the
  discovery spec's rule: a manifest speaks for its own host only);
- a seller: probed unpaid (POST `{}`; GET when the seller refuses POST with 405), its 402 read
  as the outgoing leg reads it (`payments.payer.parse_402`: the v2 `PAYMENT-REQUIRED` header,
  else the JSON body).

Everything published is untrusted. Only the options paywire can pay are kept (`exact`, a known
network, that network's USDC, a positive whole amount, a well-formed pay-to address). Text is
bounded and stripped of control characters. The input schema (the bazaar extension's
`schema.properties.input.properties.body`; `queryParams` for a GET) must be small, shallow, a
valid Draft 2020-12 schema and self-contained (no `$ref`/`$id`/`$schema` pointing anywhere a
validator would fetch): otherwise `{"type": "object"}`, the reason noted. The example is kept
only if it is small and valid against the schema kept.

A source that cannot be read (unreachable, too large, not a catalogue, a server error) raises
FetchError: its resources stay as they were, since a partial catalogue would withdraw the rest.
A single item that cannot be used is skipped, and `problems` says which and why."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from yarl import URL

from payments.payer import Answer, PayError, parse_402
from wire import wire_json

from .fetching import Fetched, FetchError, GuardedFetch, shown
from .model import Accept, Offer, Source, network_info

MAX_PAGES = 100
PAGE_LIMIT = 100          # items asked for per page after the first (a catalogue may give fewer)
MAX_POINTERS = 100        # a manifest's bare pointers probed
PROBES_AT_ONCE = 8
MAX_PROBLEMS = 100        # problem lines kept (then a count of the rest)
MAX_URL_CHARS = 2048
NAME_CHARS = 80
DESCRIPTION_CHARS = 2000
MAX_CATEGORIES = 5
CATEGORY_CHARS = 32
SCHEMA_BYTES = 32 * 1024
SCHEMA_DEPTH = 20
EXAMPLE_BYTES = 8 * 1024
EXTRA_BYTES = 2048        # an accept's `extra` (an EVM token's EIP-712 name and version...)
MAX_TIMEOUT_SECONDS = 3600
OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}
META_SCHEMAS = frozenset({"https://json-schema.org/draft/2020-12/schema",
                          "https://json-schema.org/draft/2020-12/schema#"})

_EVM_ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}")
_SOLANA_ADDRESS = re.compile(r"[1-9A-HJ-NP-Za-km-z]{32,44}")
_PROBE_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}
_CATALOGUE_HEADERS = {"Accept": "application/json"}


@dataclass(frozen=True)
class Discovered:
    offers: list[Offer]
    problems: list[str]  # one line per skipped item: what and why (bounded count)


@dataclass
class _Problems:
    lines: list[str] = field(default_factory=list)
    more: int = 0

    def add(self, line: str) -> None:
        if len(self.lines) < MAX_PROBLEMS:
            self.lines.append(_text(line, 500))  # it quotes untrusted text
        else:
            self.more += 1

    def extend(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.add(line)

    def done(self) -> list[str]:
        return self.lines + ([f"... and {self.more} more problems"] if self.more else [])


async def discover(source: Source, fetch: GuardedFetch, *, max_offers: int = 5000) -> Discovered:
    """The offers `source` publishes now, and what was skipped. FetchError when the source
    itself cannot be read (module docstring)."""
    problems = _Problems()
    if source.kind == "seller":
        offer = await _probe_seller(source.url, fetch, problems)
        return Discovered([offer] if offer is not None else [], problems.done())
    doc = await _catalogue(fetch, source.url)
    if isinstance(doc.get("items"), list):
        offers = await _pages(source.url, doc, fetch, problems, max_offers)
    elif isinstance(doc.get("resources"), list):
        offers = await _manifest(source.url, doc, fetch, problems, max_offers)
    else:
        raise FetchError(f"GET {shown(source.url)}: neither a discovery page (no 'items' list) "
                         "nor an x402 manifest (no 'resources' list)")
    unique: dict[tuple[str, str], Offer] = {}
    for offer in offers:
        unique.setdefault((offer.method, offer.url), offer)
    return Discovered(list(unique.values()), problems.done())


def offer_from_402(url: str, method: str, fetched: Fetched, *,
                   hint: dict[str, Any] | None = None) -> Offer | str:
    """The offer a seller's unpaid answer makes (its 402: v2 header, else v1 body), or why
    there is none. `hint`: what a catalogue said of the resource (name, description,
    categories), used where the 402 says nothing."""
    offer, notes = _offer_from_402(url, method, fetched, hint or {})
    return offer if offer is not None else notes[0]


# --- catalogues ---------------------------------------------------------------------------------

async def _catalogue(fetch: GuardedFetch, url: str) -> dict[str, Any]:
    """One catalogue page or manifest: a JSON object answered 200, else FetchError."""
    fetched = await fetch.request("GET", url, headers=_CATALOGUE_HEADERS)
    where = f"GET {shown(url)}"
    if fetched.status != 200:
        raise FetchError(f"{where}: answered {fetched.status}, not a catalogue")
    try:
        doc = wire_json.loads(fetched.body)
    except (ValueError, UnicodeDecodeError):
        raise FetchError(f"{where}: the answer is not JSON") from None
    if not isinstance(doc, dict):
        raise FetchError(f"{where}: the answer is not a JSON object")
    return doc


async def _pages(url: str, first: dict[str, Any], fetch: GuardedFetch, problems: _Problems,
                 max_offers: int) -> list[Offer]:
    """Every page of a `/discovery/resources` listing, from `first` on."""
    offers: list[Offer] = []
    page, seen, offset = first, 0, _whole(_query(url, "offset")) or 0
    limit = _whole(_query(url, "limit")) or PAGE_LIMIT
    for number in range(1, MAX_PAGES + 1):
        items = page.get("items")
        if not isinstance(items, list):
            raise FetchError(f"GET {shown(url)}: page {number} has no 'items' list")
        taken = items[:max_offers - seen]
        # in a thread: checking a schema costs ~1 ms, a page of new ones would hold the loop
        offers += await asyncio.to_thread(_offers_from_items, taken, problems)
        seen += len(taken)
        if len(taken) < len(items):
            problems.add(f"{shown(url)}: more than {max_offers} items; the rest not read")
            return offers
        paging = page.get("pagination") if isinstance(page.get("pagination"), dict) else {}
        at = _whole(paging.get("offset"))
        following = (at if at is not None else offset) + len(items)
        total = _whole(paging.get("total"))
        more = following < total if total is not None else len(items) >= (
            _whole(paging.get("limit")) or limit)
        if not items or not more or following <= offset:
            return offers  # the last page (or a catalogue that does not move on)
        if number == MAX_PAGES:
            problems.add(f"{shown(url)}: stopped after {MAX_PAGES} pages ({seen} items read)")
            return offers
        offset = following
        page = await _catalogue(fetch, str(URL(url).update_query(offset=offset, limit=limit)))
    return offers


async def _manifest(url: str, doc: dict[str, Any], fetch: GuardedFetch, problems: _Problems,
                    max_offers: int) -> list[Offer]:
    """A `/.well-known/x402` manifest: complete entries as they are, bare pointers probed."""
    host = (urlsplit(url).hostname or "").lower()
    complete: list[dict[str, Any]] = []
    pointers: list[tuple[str, str, dict[str, Any]]] = []
    entries = doc["resources"]
    if len(entries) > max_offers:
        problems.add(f"{shown(url)}: {len(entries)} resources listed; the first {max_offers} read")
    for number, listed in enumerate(entries[:max_offers], 1):
        entry = {"url": listed} if isinstance(listed, str) else listed
        if not isinstance(entry, dict):
            problems.add(f"{shown(url)}: resource {number} is not an object")
            continue
        target, why = _checked_url(_resource_url(entry))
        if why is None and (urlsplit(target).hostname or "").lower() != host:
            why = "is not on the manifest's own host"
        if why is not None:
            problems.add(f"{shown(url)}: resource {number} {why}")
            continue
        if isinstance(entry.get("accepts"), list):  # complete: read as a discovery item is
            complete.append(entry)
            continue
        method = str(entry.get("method") or "POST").upper()
        if method not in ("POST", "GET"):
            problems.add(f"{shown(target)}: method {str(method)[:10]!r} (only POST and GET are sold)")
            continue
        pointers.append((target, method, entry))
    if len(pointers) > MAX_POINTERS:
        problems.add(f"{shown(url)}: {len(pointers)} bare pointers; the first {MAX_POINTERS} probed")
    offers = await asyncio.to_thread(_offers_from_items, complete, problems)
    slots = asyncio.Semaphore(PROBES_AT_ONCE)

    async def probe(target: str, method: str, entry: dict[str, Any]) -> Offer | None:
        async with slots:
            try:
                fetched = await _probe(fetch, target, method)
            except FetchError as exc:
                problems.add(exc.message)
                return None
        offer, notes = _offer_from_402(target, method, fetched, entry)
        problems.extend(notes)
        return offer

    probed = await asyncio.gather(*(probe(*p) for p in pointers[:MAX_POINTERS]))
    return offers + [o for o in probed if o is not None]


# --- sellers ------------------------------------------------------------------------------------

async def _probe(fetch: GuardedFetch, url: str, method: str) -> Fetched:
    """An unpaid request: a POST with `{}` (a seller answers 402 before reading input), a GET
    with nothing."""
    if method == "GET":
        return await fetch.request("GET", url, headers={"Accept": "application/json"})
    return await fetch.request("POST", url, body=b"{}", headers=_PROBE_HEADERS)


async def _probe_seller(url: str, fetch: GuardedFetch, problems: _Problems) -> Offer | None:
    """One seller: POST, or GET when it refuses POST. A seller that fails (5xx, 429) raises:
    whether it still sells is unknown, and its resource stays as it was."""
    method = "POST"
    fetched = await _probe(fetch, url, method)
    if fetched.status == 405:
        method = "GET"
        fetched = await _probe(fetch, url, method)
    if fetched.status >= 500 or fetched.status == 429:
        raise FetchError(f"{method} {shown(url)}: answered {fetched.status}; try again later")
    offer, notes = _offer_from_402(url, method, fetched, {})
    problems.extend(notes)
    return offer


def _offer_from_402(url: str, method: str, fetched: Fetched,
                    hint: dict[str, Any]) -> tuple[Offer | None, list[str]]:
    where = f"{method} {shown(url)}"
    checked, why = _checked_url(url)
    if why is not None:
        return None, [f"{where}: {why}"]
    if fetched.status != 402:
        return None, [f"{where}: answered {fetched.status}, not 402 (not an x402 seller)"]
    try:
        required = parse_402(Answer(fetched.status, httpx.Headers(dict(fetched.headers)),
                                    fetched.body))
    except PayError as exc:
        return None, [f"{where}: {exc}"]
    accepts = [a.model_dump(by_alias=True) for a in required.accepts]
    described = dict(hint.get("metadata") or {}) if isinstance(hint.get("metadata"), dict) else {}
    texts: dict[str, Any] = {"description": hint.get("description"),
                             "name": described.get("name") or hint.get("name"),
                             "categories": described.get("categories") or described.get("category")}
    extensions = None
    if required.x402_version == 2:
        extensions = getattr(required, "extensions", None)
        resource = getattr(required, "resource", None)
        if resource is not None:
            texts |= {"description": resource.description or texts["description"],
                      "name": texts["name"] or resource.service_name, "tags": resource.tags}
    elif accepts:
        texts["description"] = accepts[0].get("description") or texts["description"]
    return _offer(checked, method, accepts, extensions, texts, described)


# --- items --------------------------------------------------------------------------------------

def _offers_from_items(items: list[Any], problems: _Problems) -> list[Offer]:
    return [o for o in (_offer_from_item(i, problems) for i in items) if o is not None]


def _offer_from_item(item: Any, problems: _Problems) -> Offer | None:
    """A discovery item (a `/discovery/resources` item, or a manifest's complete entry)."""
    if not isinstance(item, dict):
        problems.add("an item that is not an object")
        return None
    target = _resource_url(item)
    checked, why = _checked_url(target)
    if why is not None:
        problems.add(f"{shown(target) if isinstance(target, str) and target else 'an item'}: {why}")
        return None
    kind = item.get("type", "http")
    if kind != "http":
        problems.add(f"{shown(checked)}: type {str(kind)[:20]!r} (only http resources are sold)")
        return None
    extensions = item.get("extensions") if isinstance(item.get("extensions"), dict) else None
    metadata = item.get("metadata") if isinstance(item.get("metadata"), dict) else {}
    method = _method(item, extensions, metadata)
    if method not in ("POST", "GET"):
        problems.add(f"{shown(checked)}: method {method[:10]!r} (only POST and GET are sold)")
        return None
    resource = item.get("resource") if isinstance(item.get("resource"), dict) else {}
    texts = {"description": item.get("description") or resource.get("description"),
             "name": metadata.get("name") or item.get("serviceName") or resource.get("serviceName"),
             "categories": metadata.get("categories") or metadata.get("category"),
             "tags": item.get("tags") or resource.get("tags")}
    accepts = item.get("accepts") if isinstance(item.get("accepts"), list) else []
    offer, notes = _offer(checked, method, accepts, extensions, texts, metadata)
    problems.extend(notes)
    return offer


def _offer(url: str, method: str, accepts: list[Any], extensions: Any,
           texts: dict[str, Any], metadata: dict[str, Any]) -> tuple[Offer | None, list[str]]:
    """An offer from what a catalogue or a 402 says, and notes on what was dropped."""
    where = f"{method} {shown(url)}"
    kept: list[Accept] = []
    refused: list[str] = []
    for raw in accepts[:20]:
        accept = _accept(raw)
        if isinstance(accept, str):
            refused.append(accept)
        elif accept not in kept:
            kept.append(accept)
    if not kept:
        why = "; ".join(dict.fromkeys(refused)) or "none offered"
        return None, [f"{where}: no option paywire can pay (exact, USDC, a known network): "
                      f"{why}"[:500]]
    notes: list[str] = []
    schema_raw, example_raw = _bazaar_input(extensions, method)
    schema, why = _checked_schema(schema_raw)
    if why:
        notes.append(f"{where}: input schema {why}; replaced by {{\"type\": \"object\"}}")
    if example_raw is None and isinstance(metadata.get("input"), dict):  # a paywire's metadata
        example_raw = metadata["input"].get("queryParams" if method == "GET" else "body")
    example, why = _checked_example(example_raw, schema)
    if why:
        notes.append(f"{where}: example dropped ({why})")
    parts = urlsplit(url)
    name = (_text(texts.get("name"), NAME_CHARS)
            or _text(unquote(parts.path.rstrip("/").rsplit("/", 1)[-1]), NAME_CHARS)
            or _text(parts.hostname, NAME_CHARS))
    return Offer(url=url, method=method, seller=f"{parts.scheme}://{parts.netloc}".lower(),
                 name=name, description=_text(texts.get("description"), DESCRIPTION_CHARS,
                                              newlines=True),
                 categories=_categories(texts.get("categories") or texts.get("tags")),
                 input_schema=schema, example=example, accepts=tuple(kept)), notes


def _method(item: dict[str, Any], extensions: dict[str, Any] | None,
            metadata: dict[str, Any]) -> str:
    """How the resource is called: the bazaar description's method, else the metadata's route
    (a paywire's `POST /v1/...`), else the item's own, else POST."""
    info = _get(extensions, "bazaar", "info", "input")
    for found in (_get(info, "method"), str(metadata.get("route") or "").split(" ", 1)[0] or None,
                  item.get("method")):
        if isinstance(found, str) and found:
            return found.upper()
    return "POST"


def _resource_url(entry: dict[str, Any]) -> Any:
    resource = entry.get("resource", entry.get("url"))
    return resource.get("url") if isinstance(resource, dict) else resource


def _checked_url(url: Any) -> tuple[str, str | None]:
    """The URL as sold (its fragment dropped), or why it cannot be one ("" and a reason)."""
    if not isinstance(url, str) or not url:
        return "", "has no resource URL"
    if len(url) > MAX_URL_CHARS or any(c.isspace() or unicodedata.category(c) in ("Cc", "Cf")
                                       for c in url):
        return "", "is not a usable URL (too long, or with spaces or control characters)"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not one
    except ValueError:
        return "", "is not a URL"
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return "", "is not an http:// or https:// URL"
    if parts.username is not None or parts.password is not None:
        return "", "carries credentials"
    return url.split("#", 1)[0], None


# --- payment options ----------------------------------------------------------------------------

def _accept(raw: Any) -> Accept | str:
    """One of `accepts` (v2 or v1 names) if paywire can pay it, else why not."""
    if not isinstance(raw, dict):
        return "an option that is not an object"
    scheme, network, asset = raw.get("scheme"), raw.get("network"), raw.get("asset")
    if scheme != "exact":
        return f"scheme {str(scheme)[:20]!r} is not exact"
    info = network_info(network) if isinstance(network, str) else None
    if info is None:
        return f"network {str(network)[:40]!r} is not one paywire pays on"
    if not isinstance(asset, str) or (asset.lower() != info.usdc.lower() if info.family == "evm"
                                      else asset != info.usdc):
        return f"asset {str(asset)[:50]!r} is not USDC on {info.v1_name}"
    amount = _whole(raw.get("amount", raw.get("maxAmountRequired")))
    if not amount:
        return "the amount is not a positive whole number of atomic units"
    pay_to = raw.get("payTo")
    pattern = _EVM_ADDRESS if info.family == "evm" else _SOLANA_ADDRESS
    if not isinstance(pay_to, str) or not pattern.fullmatch(pay_to):
        return f"payTo is not an address on {info.v1_name}"
    timeout = _whole(raw.get("maxTimeoutSeconds", 60))
    if not timeout:
        return "maxTimeoutSeconds is not a positive whole number"
    extra = raw.get("extra") or {}
    if not isinstance(extra, dict) or len(wire_json.dumps(extra)) > EXTRA_BYTES:
        return f"extra is not an object of at most {EXTRA_BYTES} bytes"
    return Accept("exact", info.caip2, asset, amount, pay_to,
                  min(timeout, MAX_TIMEOUT_SECONDS), extra)


def _whole(value: Any) -> int | None:
    """A non-negative whole number given as a JSON integer or a decimal text (30 digits at
    most), else None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if 0 <= value < 10**30 else None
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 30:
        return int(value)
    return None


# --- the input schema and example ----------------------------------------------------------------

def _bazaar_input(extensions: Any, method: str) -> tuple[Any, Any]:
    """The body's schema and example of a bazaar description (a GET's: its query's)."""
    key = "queryParams" if method == "GET" else "body"
    bazaar = _get(extensions, "bazaar")
    return (_get(bazaar, "schema", "properties", "input", "properties", key),
            _get(bazaar, "info", "input", key))


def _checked_schema(raw: Any) -> tuple[dict[str, Any], str | None]:
    """The schema if it is one paywire can use, else `{"type": "object"}` and why."""
    if raw is None:
        return dict(OBJECT_SCHEMA), None
    if not isinstance(raw, dict):
        return dict(OBJECT_SCHEMA), "is not an object"
    try:
        text = wire_json.dumps(raw).decode()
    except (TypeError, ValueError):
        return dict(OBJECT_SCHEMA), "is not JSON"
    why = _schema_problem(text)
    return (dict(OBJECT_SCHEMA), why) if why else (_without_patterns(json.loads(text)), None)


# Keywords whose values map names to subschemas: their keys are names, not keywords.
_NAME_MAPS = frozenset({"properties", "$defs", "definitions", "dependentSchemas"})


def _without_patterns(node: Any, names: bool = False) -> Any:
    """The schema without its regular expressions (`pattern`, `patternProperties`): a seller's
    pattern is untrusted code for Python's `re`, which has no time limit (a catastrophic
    backtracking pattern would hold the event loop on every call). The seller still checks its
    own input; paywire checks the rest of the schema before quoting."""
    if isinstance(node, list):
        return [_without_patterns(v) for v in node]
    if not isinstance(node, dict):
        return node
    return {k: _without_patterns(v, names=k in _NAME_MAPS and not names)
            for k, v in node.items()
            if names or k not in ("pattern", "patternProperties")}


# Verdicts by the schema's digest (not its text: 32 KiB each), enough for a whole catalogue:
# a refresh reads thousands of schemas again in the same order, which an LRU smaller than the
# catalogue would never hit (~1.2 ms each against the meta-schema, all on the event loop's GIL).
_VERDICTS_KEPT = 20_000
_verdicts: OrderedDict[bytes, str | None] = OrderedDict()
_verdicts_lock = threading.Lock()


def _schema_problem(text: str) -> str | None:
    """Why the schema (as JSON text) is refused (remembered by its digest)."""
    key = hashlib.sha256(text.encode()).digest()
    with _verdicts_lock:  # pages are read in worker threads
        if key in _verdicts:
            _verdicts.move_to_end(key)
            return _verdicts[key]
    verdict = _checked_schema_text(text)
    with _verdicts_lock:
        _verdicts[key] = verdict
        if len(_verdicts) > _VERDICTS_KEPT:
            _verdicts.popitem(last=False)
    return verdict


def _checked_schema_text(text: str) -> str | None:
    if len(text.encode()) > SCHEMA_BYTES:
        return f"is over {SCHEMA_BYTES} bytes"
    schema = json.loads(text)
    if _depth(schema) > SCHEMA_DEPTH:
        return f"nests deeper than {SCHEMA_DEPTH} levels"
    why = _reference_problem(schema, schema)
    if why:
        return why
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        return f"is not a valid JSON Schema ({_text(exc.message, 120)})"
    return None


def _depth(node: Any) -> int:
    if isinstance(node, dict):
        return 1 + max((_depth(v) for v in node.values()), default=0)
    if isinstance(node, list):
        return 1 + max((_depth(v) for v in node), default=0)
    return 0


def _reference_problem(node: Any, root: Any) -> str | None:
    """A validator must never fetch anything: every `$ref` (and `$dynamicRef`) is a JSON pointer
    into the schema itself that resolves, no `$id` changes the base, `$schema` is 2020-12."""
    if isinstance(node, list):
        return next((why for v in node if (why := _reference_problem(v, root))), None)
    if not isinstance(node, dict):
        return None
    for key in ("$ref", "$dynamicRef"):
        if key in node:
            ref = node[key]
            if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
                return f"has a {key} outside the schema ({str(ref)[:80]!r})"
            if not _resolves(root, ref):
                return f"has a {key} that does not resolve ({ref[:80]!r})"
    if "$id" in node and node["$id"] not in ("", "#"):
        return f"has an $id ({str(node['$id'])[:80]!r})"
    if "$schema" in node and node["$schema"] not in META_SCHEMAS:
        return f"names a meta-schema other than Draft 2020-12 ({str(node['$schema'])[:80]!r})"
    return next((why for v in node.values() if (why := _reference_problem(v, root))), None)


def _resolves(root: Any, ref: str) -> bool:
    node = root
    for token in ref[2:].split("/") if ref != "#" else ():
        token = unquote(token).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return False
    return isinstance(node, dict | bool)


def _checked_example(example: Any, schema: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    if example is None:
        return None, None
    if not isinstance(example, dict):
        return None, "not an object"
    if len(wire_json.dumps(example)) > EXAMPLE_BYTES:
        return None, f"over {EXAMPLE_BYTES} bytes"
    try:
        valid = Draft202012Validator(schema).is_valid(example)
    except Exception:  # noqa: BLE001 - a schema the validator cannot apply: no example
        valid = False
    return (example, None) if valid else (None, "it does not validate against the input schema")


# --- text ---------------------------------------------------------------------------------------

def _text(value: Any, most: int, *, newlines: bool = False) -> str:
    """Untrusted text as shown: control and format characters removed (a description keeps its
    line breaks), runs of spaces made one, at most `most` characters."""
    if not isinstance(value, str):
        return ""
    kept = "".join(c for c in value if (newlines and c == "\n")
                   or unicodedata.category(c) not in ("Cc", "Cf"))
    lines = (" ".join(line.split()) for line in kept.split("\n"))
    text = "\n".join(lines).strip() if newlines else " ".join(kept.split())
    return text if len(text) <= most else text[:most - 1].rstrip() + "…"


def _categories(value: Any) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, list) else []
    found = dict.fromkeys(t for t in (_text(v, CATEGORY_CHARS) for v in items[:20]) if t)
    return tuple(found)[:MAX_CATEGORIES]


def _get(node: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def _query(url: str, name: str) -> str | None:
    try:
        return URL(url).query.get(name)
    except ValueError:
        return None
