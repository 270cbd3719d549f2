"""Federation's discovery (federation/discovery.py) and its guarded HTTP client
(federation/fetching.py), against real HTTP servers on loopback.

- A stand-in facilitator catalogue (`/discovery/resources` pages built with the SDK's
  `DiscoveryResource`), a `/.well-known/x402` manifest with complete entries and bare pointers,
  a v2 seller (its 402 built with the SDK: `declare_discovery_extension`, the SDK's header
  encoding), a v1 seller (body only) and a GET-only seller: what each offers, read exactly.
- Untrusted descriptions: schemas with an external `$ref` or nested too deep replaced, control
  characters stripped, long text cut, unpayable options skipped, an example that breaks its
  schema dropped; each noted as a problem.
- Hostile servers: an oversized catalogue, a server that never answers, a redirect (never
  followed), loopback refused unless allowed, the metadata address refused even when allowed.
- A real paywire's own `/discovery/resources`: every marketplace resource it sells comes back as
  an offer at its price in atomic units, on both devnet networks, with its input schema.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from http.server import ThreadingHTTPServer
from ipaddress import ip_network
from typing import Any

import httpx
import pytest
from x402.extensions.bazaar import (
    DiscoveryResource,
    bazaar_resource_server_extension,
    declare_discovery_extension,
)
from x402.http import encode_payment_required_header
from x402.schemas import PaymentRequired, PaymentRequirements, ResourceInfo

from federation.discovery import Discovered, discover, offer_from_402
from federation.fetching import FetchError, FetchLimits, FetchTimeout, GuardedFetch
from federation.model import Accept, Offer, Source, source_id_for
from payments.money import usd_to_atomic
from payments.networks import BASE_SEPOLIA, SOLANA_DEVNET
from tests.support.hostile_seller import HostileSeller
from tests.support.live_server import LiveServer
from tests.support.loopback_http import JSONHandler

LOOPBACK = (ip_network("127.0.0.1/32"),)
PAY_TO = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
SOL_PAY_TO = "9WzDXwBbmkg8ZTbNMqUxvQRAyrZzDsGYdLVL9zYtAWWM"
EVM_EXTRA = {"name": "USDC", "version": "2"}
SCHEMA = {"type": "object", "properties": {"text": {"type": "string", "minLength": 1}},
          "required": ["text"], "additionalProperties": False}
EXAMPLE = {"text": "hello"}


def usdc(amount: str, *, network: str = BASE_SEPOLIA.caip2, asset: str = BASE_SEPOLIA.usdc,
         scheme: str = "exact") -> dict[str, Any]:
    """One `accepts` entry as the wire carries it (v2 names)."""
    requirement = PaymentRequirements(scheme=scheme, network=network, asset=asset, amount=amount,
                                      pay_to=PAY_TO, max_timeout_seconds=60, extra=EVM_EXTRA)
    return requirement.model_dump(by_alias=True)


def bazaar(schema: Any = SCHEMA, example: dict[str, Any] | None = EXAMPLE,
           method: str = "POST") -> dict[str, Any]:
    """The bazaar extension a seller built with the SDK declares (the method added by the
    SDK's server extension, as on its own routes)."""
    if method == "GET":
        declared = declare_discovery_extension(input=example, input_schema=schema)
    else:
        declared = declare_discovery_extension(input=example, input_schema=schema, body_type="json")
    enriched = bazaar_resource_server_extension.enrich_declaration(declared["bazaar"], _Request(method))
    return {"bazaar": enriched}


@dataclass(frozen=True)
class _Request:
    """What the SDK's `enrich_declaration` reads of a request."""

    method: str
    route_pattern: None = None


def item(base: str, path: str, accepts: list[dict[str, Any]], extensions: dict[str, Any] | None = None,
         description: str = "does a thing", kind: str = "http", **extra: Any) -> dict[str, Any]:
    """A `/discovery/resources` item as the SDK writes one (`DiscoveryResource.to_dict`)."""
    found = DiscoveryResource(resource=base + path, type=kind, x402_version=2, accepts=accepts,
                              description=description, mime_type="application/json",
                              extensions=extensions).to_dict()
    return {**found, **extra}


def deep_schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


class Site:
    """One loopback host playing every part: catalogue, manifest, sellers, hostile answers.
    `routes` maps a path to what answers it; `hits` counts requests by path."""

    def __init__(self) -> None:
        self.routes: dict[str, Callable[[JSONHandler], None]] = {}
        self.hits: dict[str, int] = {}
        self.release = threading.Event()  # lets a hanging answer go when the tests are done
        self.lock = threading.Lock()
        self.in_flight = 0
        self.most_in_flight = 0
        self.crowd = threading.Event()
        site = self

        class Handler(JSONHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                self._route()

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._route()

            def _route(self) -> None:
                path = self.path.split("?", 1)[0]
                with site.lock:
                    site.hits[path] = site.hits.get(path, 0) + 1
                answer = site.routes.get(path)
                if answer is None:
                    self.answer(404, {"error": "not found"})
                else:
                    answer(self)

        self.server = _Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def json(self, path: str, doc: Any, status: int = 200,
             headers: dict[str, str] | None = None) -> None:
        data = json.dumps(doc).encode()

        def answer(handler: JSONHandler) -> None:
            handler.send_response(status)
            for name, value in {"Content-Type": "application/json", **(headers or {}),
                                "Content-Length": str(len(data))}.items():
                handler.send_header(name, value)
            handler.end_headers()
            handler.wfile.write(data)

        self.routes[path] = answer

    def quote(self, path: str, required: PaymentRequired, method: str = "POST") -> None:
        """A v2 seller: 402 with the SDK-encoded PAYMENT-REQUIRED header (405 on another method)."""
        header = encode_payment_required_header(required)

        def answer(handler: JSONHandler) -> None:
            if handler.command != method:
                handler.answer(405, {"error": "method not allowed"})
                return
            data = b"{}"
            handler.send_response(402)
            handler.send_header("PAYMENT-REQUIRED", header)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data)

        self.routes[path] = answer

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # the stdlib's backlog is 5: eight probes connecting at once would see a SYN dropped and
    # retried a second later
    request_queue_size = 64


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    found = Site()
    yield found
    found.stop()


@pytest.fixture
def fetch() -> GuardedFetch:
    return GuardedFetch(LOOPBACK, FetchLimits(timeout_seconds=5))


def source(url: str, kind: str = "catalogue") -> Source:
    return Source(source_id_for(url), url, kind)  # type: ignore[arg-type]


def by_path(found: Discovered, base: str) -> dict[str, Offer]:
    return {o.url.removeprefix(base): o for o in found.offers}


def problem_about(found: Discovered, path: str) -> str:
    lines = [p for p in found.problems if path in p]
    assert len(lines) == 1, found.problems
    return lines[0]


# ----------------------------------------------------------------------------------- catalogue

async def test_a_catalogue_of_several_pages_is_read_whole_and_untrusted_text_is_bounded(
        site: Site, fetch: GuardedFetch) -> None:
    base = site.url
    control = "Bad\x1b[31m name\u202e\x00 here"
    items = [
        item(base, "/sell/plain", [usdc("2500"), usdc("1", network="eip155:1")], bazaar(),
             metadata={"name": control, "categories": ["Text", "t" * 50, "", *"abcdef"]}),
        item(base, "/sell/external-ref", [usdc("10")],
             bazaar({"type": "object", "properties": {"a": {"$ref": "https://evil.example/s.json"}}},
                    None)),
        item(base, "/sell/deep", [usdc("20")], bazaar(deep_schema(25), None)),
        item(base, "/sell/long", [usdc("30")], bazaar(), description="d" * 5000 + "\x07"),
        item(base, "/sell/not-usdc", [usdc("40", asset="0x" + "1" * 40),
                                      usdc("40", network="eip155:999999"),
                                      usdc("40", scheme="upto"), usdc("0")]),
        item(base, "/sell/bad-example", [usdc("50")], bazaar(example=EXAMPLE)),
        item(base, "/sell/mcp", [usdc("60")], kind="mcp"),
        item("ftp://files.example", "/x", [usdc("70")]),
        item(base, "/sell/query", [usdc("80")], bazaar({"type": "object", "properties": {
            "city": {"type": "string"}}}, {"city": "Oslo"}, method="GET")),
    ]
    # an example the seller's own schema refuses (the SDK does not check it)
    items[5]["extensions"]["bazaar"]["info"]["input"]["body"] = {"text": 42}
    per_page = 2

    def pages(handler: JSONHandler) -> None:
        query = httpx.URL(handler.path).params
        offset = int(query.get("offset", "0"))
        limit = min(int(query.get("limit", str(per_page))), per_page)  # the catalogue's own cap
        handler.answer(200, {"x402Version": 2, "items": items[offset:offset + limit],
                             "pagination": {"limit": limit, "offset": offset, "total": len(items)}})

    site.routes["/pages/discovery/resources"] = pages
    found = await discover(source(base + "/pages/discovery/resources"), fetch)

    assert site.hits["/pages/discovery/resources"] == 5  # 9 items, 2 a page
    offers = by_path(found, base)
    assert set(offers) == {"/sell/plain", "/sell/external-ref", "/sell/deep", "/sell/long",
                           "/sell/bad-example", "/sell/query"}
    plain = offers["/sell/plain"]
    assert plain.method == "POST" and plain.seller == base
    assert plain.name == "Bad[31m name here"  # ESC, NUL and the bidi override removed
    assert plain.categories == ("Text", "t" * 31 + "…", "a", "b", "c")
    assert plain.input_schema == SCHEMA and plain.example == EXAMPLE
    assert plain.accepts == (Accept("exact", BASE_SEPOLIA.caip2, BASE_SEPOLIA.usdc, 2500, PAY_TO,
                                    60, EVM_EXTRA),)  # the mainnet option is not USDC there
    assert plain.upstream_usd == Decimal("0.0025")

    assert offers["/sell/external-ref"].input_schema == {"type": "object"}
    assert "$ref outside the schema" in problem_about(found, "/sell/external-ref")
    assert offers["/sell/deep"].input_schema == {"type": "object"}
    assert "deeper than 20" in problem_about(found, "/sell/deep")
    long = offers["/sell/long"]
    assert len(long.description) == 2000 and long.description.endswith("…")
    assert "\x07" not in long.description
    assert long.name == "long"  # no name given: the URL's last segment
    bad = offers["/sell/bad-example"]
    assert bad.example is None and bad.input_schema == SCHEMA
    assert "example dropped" in problem_about(found, "/sell/bad-example")
    query = offers["/sell/query"]
    assert query.method == "GET" and query.example == {"city": "Oslo"}
    assert query.input_schema["properties"] == {"city": {"type": "string"}}

    refused = problem_about(found, "/sell/not-usdc")
    for why in ("is not USDC", "is not one paywire pays on", "is not exact", "positive whole"):
        assert why in refused
    assert "only http resources" in problem_about(found, "/sell/mcp")
    assert "not an http:// or https:// URL" in problem_about(found, "ftp://files.example/x")


async def test_a_catalogue_is_read_up_to_max_offers_items(site: Site) -> None:
    items = [item(site.url, f"/many/{n}", [usdc(str(n + 1))]) for n in range(7)]
    site.json("/many/discovery/resources", {"x402Version": 2, "items": items,
                                            "pagination": {"limit": 7, "offset": 0, "total": 7}})
    found = await discover(source(site.url + "/many/discovery/resources"),
                         GuardedFetch(LOOPBACK), max_offers=3)
    assert [o.accepts[0].amount_atomic for o in found.offers] == [1, 2, 3]
    assert any("more than 3 items" in p for p in found.problems)


# ------------------------------------------------------------------------------------ sellers

def v2_quote(base: str, path: str, amount: str = "1234") -> PaymentRequired:
    return PaymentRequired(
        x402_version=2, resource=ResourceInfo(url=base + path, description="Summarises text",
                                              service_name="Summariser"),
        accepts=[PaymentRequirements.model_validate(usdc("7", network="eip155:8453",
                                                         asset="0x" + "2" * 40)),
                 PaymentRequirements.model_validate(usdc(amount)),
                 PaymentRequirements(scheme="exact", network=SOLANA_DEVNET.caip2,
                                     asset=SOLANA_DEVNET.usdc, amount=amount, pay_to=SOL_PAY_TO,
                                     max_timeout_seconds=10**9, extra={"feePayer": SOL_PAY_TO})],
        extensions=bazaar())


V1_BODY = {"x402Version": 1, "error": "X-PAYMENT header is required", "accepts": [{
    "scheme": "exact", "network": "base-sepolia", "maxAmountRequired": "1000",
    "resource": "http://elsewhere.example/v1", "description": "An old\x00 seller",
    "mimeType": "application/json", "payTo": PAY_TO, "maxTimeoutSeconds": 60,
    "asset": BASE_SEPOLIA.usdc.lower(), "extra": EVM_EXTRA}]}


async def test_a_manifest_uses_complete_entries_and_probes_bare_pointers(
        site: Site, fetch: GuardedFetch) -> None:
    base = site.url
    site.quote("/m/v2", v2_quote(base, "/m/v2"))
    site.json("/m/v1", V1_BODY, status=402)
    site.quote("/m/weather", PaymentRequired(
        x402_version=2, accepts=[PaymentRequirements.model_validate(usdc("99"))],
        extensions=bazaar({"type": "object", "properties": {"city": {"type": "string"}}},
                          {"city": "Oslo"}, method="GET")), method="GET")
    site.json("/m/free", {"answer": 42})
    site.json("/.well-known/x402", {"x402Version": 2, "kind": "resource-server", "resources": [
        {"url": base + "/m/complete", "type": "http", "accepts": [usdc("5")],
         "description": "complete entry", "extensions": bazaar()},
        {"url": base + "/m/v2", "method": "POST", "description": "pointer"},
        base + "/m/v1",
        {"url": base + "/m/weather", "method": "GET"},
        {"url": base + "/m/free"},
        {"url": base + "/m/missing"},
        {"url": "http://other.example/x", "method": "POST"},
        {"url": base + "/m/put", "method": "PUT"},
    ]})
    found = await discover(source(base + "/.well-known/x402"), fetch)
    offers = by_path(found, base)
    assert set(offers) == {"/m/complete", "/m/v2", "/m/v1", "/m/weather"}
    assert offers["/m/complete"].accepts[0].amount_atomic == 5
    assert offers["/m/complete"].input_schema == SCHEMA
    assert site.hits.get("/m/complete") is None  # complete: not probed

    v2 = offers["/m/v2"]
    assert (v2.name, v2.description, v2.method) == ("Summariser", "Summarises text", "POST")
    assert v2.input_schema == SCHEMA and v2.example == EXAMPLE
    assert [(a.network, a.amount_atomic) for a in v2.accepts] == [
        (BASE_SEPOLIA.caip2, 1234), (SOLANA_DEVNET.caip2, 1234)]
    assert v2.accepts[1].max_timeout_seconds == 3600  # 31 years asked, an hour kept
    v1 = offers["/m/v1"]
    assert v1.accepts == (Accept("exact", BASE_SEPOLIA.caip2, BASE_SEPOLIA.usdc.lower(), 1000,
                                 PAY_TO, 60, EVM_EXTRA),)
    assert v1.description == "An old seller" and v1.name == "v1"
    assert v1.url == base + "/m/v1"  # the probed URL, not the one the 402 names
    weather = offers["/m/weather"]
    assert weather.method == "GET" and weather.example == {"city": "Oslo"}

    assert "answered 200, not 402" in problem_about(found, "/m/free")
    assert "answered 404" in problem_about(found, "/m/missing")
    assert "not on the manifest's own host" in problem_about(found, "resource 7")
    assert "method 'PUT'" in problem_about(found, "/m/put")


async def test_a_seller_is_probed_with_post_then_get_and_its_402_read_with_the_sdk(
        site: Site, fetch: GuardedFetch) -> None:
    site.quote("/s/post", v2_quote(site.url, "/s/post", amount="500"))
    site.quote("/s/get", v2_quote(site.url, "/s/get", amount="600"), method="GET")
    post = await discover(source(site.url + "/s/post", "seller"), fetch)
    assert [(o.method, o.accepts[0].amount_atomic) for o in post.offers] == [("POST", 500)]
    get = await discover(source(site.url + "/s/get", "seller"), fetch)
    assert [(o.method, o.accepts[0].amount_atomic) for o in get.offers] == [("GET", 600)]
    assert post.problems == [] and get.problems == []

    # a large description (aiohttp's header line default is 8 KiB): read whole
    fields = {f"field_{n}": {"type": "string", "description": "d" * 60} for n in range(100)}
    large = v2_quote(site.url, "/s/large")
    large.extensions = bazaar({"type": "object", "properties": fields}, None)
    site.quote("/s/large", large)
    assert 8 * 1024 < len(encode_payment_required_header(large)) < 16 * 1024
    [offer] = (await discover(source(site.url + "/s/large", "seller"), fetch)).offers
    assert offer.input_schema["properties"] == fields

    site.json("/s/broken", {"error": "down"}, status=503)
    with pytest.raises(FetchError, match=r"answered 503"):
        await discover(source(site.url + "/s/broken", "seller"), fetch)


async def test_offer_from_402_says_why_an_answer_is_no_offer(site: Site, fetch: GuardedFetch) -> None:
    site.quote("/o/quote", v2_quote(site.url, "/o/quote"))
    fetched = await fetch.request("POST", site.url + "/o/quote", body=b"{}")
    offer = offer_from_402(site.url + "/o/quote", "POST", fetched, hint={"name": "From the catalogue"})
    assert isinstance(offer, Offer) and offer.name == "From the catalogue"
    assert offer.accepts[0].amount_atomic == 1234

    site.json("/o/junk", {"x402Version": 2, "accepts": "nope"}, status=402)
    junk = await fetch.request("POST", site.url + "/o/junk", body=b"{}")
    assert "without an x402 quote" in str(offer_from_402(site.url + "/o/junk", "POST", junk))
    site.json("/o/btc", {"x402Version": 1, "accepts": [{**V1_BODY["accepts"][0], "network": "bitcoin"}]},
              status=402)
    btc = await fetch.request("POST", site.url + "/o/btc", body=b"{}")
    assert "'bitcoin' is not one paywire pays on" in str(offer_from_402(site.url + "/o/btc", "POST", btc))


async def test_pointers_are_probed_eight_at_a_time(site: Site, fetch: GuardedFetch) -> None:
    header = encode_payment_required_header(v2_quote(site.url, "/c/x"))

    def crowded(handler: JSONHandler) -> None:
        with site.lock:
            site.in_flight += 1
            site.most_in_flight = max(site.most_in_flight, site.in_flight)
            if site.in_flight >= 8:
                site.crowd.set()
        site.crowd.wait(timeout=3)  # the first eight wait for each other: all eight at once
        with site.lock:
            site.in_flight -= 1
        handler.send_response(402)
        handler.send_header("PAYMENT-REQUIRED", header)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    paths = [f"/c/{n}" for n in range(20)]
    for path in paths:
        site.routes[path] = crowded
    site.json("/c/manifest", {"x402Version": 2, "resources": [site.url + p for p in paths]})
    found = await discover(source(site.url + "/c/manifest"), fetch)
    assert len(found.offers) == 20 and site.crowd.is_set()
    assert site.most_in_flight == 8


# --------------------------------------------------------------------------- hostile servers

async def test_an_oversized_catalogue_is_refused_as_it_is_read(site: Site) -> None:
    small = GuardedFetch(LOOPBACK, FetchLimits(max_catalogue_bytes=64 * 1024))
    padding = {"x402Version": 2, "items": [], "padding": "x" * 100_000}
    site.json("/big/declared", padding)

    def undeclared(handler: JSONHandler) -> None:  # no Content-Length: read until the close
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.wfile.write(json.dumps(padding).encode())
        handler.close_connection = True

    site.routes["/big/streamed"] = undeclared
    with pytest.raises(FetchError, match=r"GET http://127\.0\.0\.1:\d+/big/declared: the answer is "
                                         r"100\d+ bytes, over the 65536-byte limit"):
        await discover(source(site.url + "/big/declared"), small)
    with pytest.raises(FetchError, match=r"/big/streamed: the answer is over the 65536-byte limit"):
        await discover(source(site.url + "/big/streamed"), small)


async def test_the_hostile_seller_floods_and_nests_in_vain() -> None:
    seller = HostileSeller().start()
    try:
        guarded = GuardedFetch(LOOPBACK, FetchLimits(max_catalogue_bytes=2**20))
        with pytest.raises(FetchError, match="over the 1048576-byte limit"):
            await discover(source(seller.url + "/quote-flood", "seller"), guarded)
        assert seller.sent < 32 * 2**20  # (socket buffers aside) the rest of the 300 MiB was never read
        with pytest.raises(FetchError, match=r"/header-flood: malformed HTTP answer"):
            await discover(source(seller.url + "/header-flood", "seller"), guarded)
        deep = await discover(source(seller.url + "/deep-body", "seller"), guarded)
        assert deep.offers == [] and "without an x402 quote" in deep.problems[0]
    finally:
        seller.stop()


async def test_a_server_that_never_answers_times_out(site: Site) -> None:
    site.routes["/hang"] = lambda handler: site.release.wait(timeout=30)
    guarded = GuardedFetch(LOOPBACK, FetchLimits(timeout_seconds=0.3))
    with pytest.raises(FetchTimeout, match=r"GET http://127\.0\.0\.1:\d+/hang: no complete answer "
                                           r"within 0\.3 s"):
        await guarded.request("GET", site.url + "/hang?token=s3cret")
    with pytest.raises(FetchTimeout):
        await discover(source(site.url + "/hang", "seller"), guarded)


async def test_a_redirect_is_returned_not_followed(site: Site, fetch: GuardedFetch) -> None:
    site.json("/moved", {}, status=302, headers={"Location": site.url + "/target"})
    site.json("/target", {"x402Version": 2, "items": []})
    answer = await fetch.request("GET", site.url + "/moved")
    assert answer.status == 302 and answer.headers["location"] == site.url + "/target"
    with pytest.raises(FetchError, match="answered 302, not a catalogue"):
        await discover(source(site.url + "/moved"), fetch)
    assert site.hits.get("/target") is None


async def test_loopback_needs_the_allow_list_and_metadata_is_never_allowed(site: Site) -> None:
    site.json("/ok", {"fine": True})
    public_only = GuardedFetch()
    with pytest.raises(FetchError, match=r"127\.0\.0\.1 is a loopback address; not fetched") as refused:
        await public_only.request("GET", site.url + "/ok?key=s3cret",
                                  headers={"Authorization": "Bearer s3cret"})
    assert "s3cret" not in refused.value.message
    port = site.url.rsplit(":", 1)[1]
    with pytest.raises(FetchError, match=r"localhost resolves to .*, which is a loopback address"):
        await public_only.request("GET", f"http://localhost:{port}/ok")
    assert site.hits.get("/ok") is None

    allowed = await GuardedFetch(LOOPBACK).request("GET", site.url + "/ok")
    assert (allowed.status, json.loads(allowed.body), allowed.media_type) == (
        200, {"fine": True}, "application/json")

    everything = GuardedFetch((ip_network("0.0.0.0/0"), ip_network("169.254.0.0/16")))
    for url in ("http://169.254.169.254/latest/meta-data/", "http://[::ffff:169.254.169.254]/",
                "http://metadata.google.internal/computeMetadata/v1/"):
        with pytest.raises(FetchError, match="metadata"):
            await everything.request("GET", url)
    for url in ("ftp://127.0.0.1/x", "http://user:pw@127.0.0.1/x", "not a url"):
        with pytest.raises(FetchError) as bad:
            await everything.request("GET", url)
        assert "pw" not in bad.value.message


# ------------------------------------------------------------------------------ a real paywire

async def test_a_paywire_catalogue_comes_back_as_offers_at_its_prices(server: LiveServer) -> None:
    sold = await marketplace(server)
    assert len(sold) >= 3
    found = await discover(source(server.url + "/discovery/resources"),
                         GuardedFetch(LOOPBACK, FetchLimits(timeout_seconds=30)))
    offers = {o.url: o for o in found.offers}
    for resource_id, listed in sold.items():
        url = f"{server.url}/v1/marketplace/api/{resource_id}"
        offer = offers[url]
        atomic = int(listed["price"]["price"]["atomic"])
        assert atomic == usd_to_atomic(Decimal(listed["price_usd"])) > 0
        assert offer.method == "POST" and offer.seller == server.url
        assert {(a.network, a.asset, a.amount_atomic) for a in offer.accepts} == {
            (BASE_SEPOLIA.caip2, BASE_SEPOLIA.usdc, atomic),
            (SOLANA_DEVNET.caip2, SOLANA_DEVNET.usdc, atomic)}, resource_id
        skill = server.runtime.gateway.registry.get(resource_id)
        assert skill is not None and offer.name == skill.name
        wanted = set(skill.input_schema.get("properties", {}))
        assert wanted, resource_id  # a schema with fields, not {"type": "object"}
        assert set(offer.input_schema.get("properties", {})) == wanted, resource_id
        assert offer.example is None or offer.example == skill.examples[0], resource_id
    assert not [p for p in found.problems if "/v1/marketplace/api/" in p]


async def marketplace(server: LiveServer) -> dict[str, dict[str, Any]]:
    """Every resource the marketplace face sells now (available: its model or key is
    configured here), with its price, page by page."""
    sold: dict[str, dict[str, Any]] = {}
    async with httpx.AsyncClient(timeout=30) as client:
        for page in range(1, 100):
            answer = (await client.get(f"{server.url}/api/marketplace/apis",
                                       params={"page_size": 100, "page": page})).json()["data"]
            sold |= {i["resource_id"]: i for i in answer["items"] if i["available"]}
            if len(answer["items"]) < 100:
                break
    return sold
