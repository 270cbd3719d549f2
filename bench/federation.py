#!/usr/bin/env python3
"""Federation (issue 24): a resold call's overhead, and importing and serving 3,000 resources.

The overhead is over calling the upstream seller directly with the same client; the import,
refresh and serving figures are at 3,000 imported resources (`--resources`).

    .venv/bin/python bench/federation.py                        # every part, SQLite and PostgreSQL
    .venv/bin/python bench/federation.py --parts overhead --calls 100 --upstream-chain evm
    .venv/bin/python bench/federation.py --parts import,gateway --db sqlite --schemas 30

Parts:
- `overhead`: one `paywire devnet` process (tests/support/devnet_world.py), seller B and reseller A
  two production-mode `paywire serve` processes with their own accounts and SQLite ledgers
  (tests/support/federation_world.py), A federating B's `/discovery/resources`. One caller, the
  x402 SDK's httpx client with an exact EVM signer (a 402, a signature, the paid retry per call),
  calls B's `token-count-508` and A's resale of it, `--calls` each, one at a time then
  `--concurrency` at a time, in interleaved halves (B, A, B, A). Per target: latency p50 / p90 /
  mean, the server's `Server-Timing` stage means, the CPU per call of A, B and the devnet, and
  how busy the box was besides. The overhead is the federated call's extra leg (A asks B its
  price, writes the intent, signs, pays B, stores the answer). A pays B on the chain of its
  federation wallet's key (`--upstream-chain`: A is restarted with the other key). `--py-spy DIR`
  samples A during its calls (bench/spy_profile.py).
- `import`: a discovery catalogue of `--resources` items in paywire's `/discovery/resources`
  shape and paging (20 items unless `limit` asks more, at most 100: federation reads the first
  page, then pages of 100), each with an exact accept on base-sepolia in the devnet's USDC and a
  bazaar extension declared with the x402 SDK (an input schema and example; `--schemas` distinct
  schemas), served from a loopback HTTP server; a real ledger (a SQLite file, a
  throwaway PostgreSQL from tests/support/postgres.py). Timed: `Federation.refresh(force=True)`
  of the new source (the import), again with nothing changed, again after 5% of the prices
  changed and 1% of the items went, and back; each split into discovery (of which HTTP),
  the ledger write, the registry sync (of which the ledger read and the skills built), and the
  longest the event loop was held meanwhile; a second replica's first `sync()` (a fresh
  Federation on the same ledger) and its `sync()` after the change.
- `gateway`: a gateway (create_app and its lifespan, uvicorn on loopback: tests/support/
  live_server.py) started on a ledger that holds the imported resources, against one on an
  empty ledger (`--rounds` each); `Federation.start` apart; then the first and a warm
  `GET /api/marketplace/apis`, `/openapi.json`, `/.well-known/agent.json`, MCP `tools/list`
  (first page) and `/discovery/resources?limit=100`.
Nothing here is asserted beyond what the figures need to mean something (every call paid and
answered, the refresh counts as planned); the tests hold the bounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

ROOT = Path(__file__).resolve().parent.parent
# ROOT ahead of bench/ (spy_profile.py's folder): `federation` is the package, not this file
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import spy_profile  # noqa: E402 - bench/spy_profile.py
from eth_account import Account  # noqa: E402
from scale_catalogue import get, timed  # noqa: E402 - bench/scale_catalogue.py
from x402 import x402Client  # noqa: E402
from x402.extensions.bazaar import (  # noqa: E402
    OutputConfig,
    bazaar_resource_server_extension,
    declare_discovery_extension,
)
from x402.http import decode_payment_response_header  # noqa: E402
from x402.http.clients.httpx import x402HttpxClient  # noqa: E402
from x402.mechanisms.evm.exact import register_exact_evm_client  # noqa: E402
from x402.mechanisms.evm.signers import EthAccountSigner  # noqa: E402

import federation.runtime as fed_runtime  # noqa: E402
from agent.app import make_engine  # noqa: E402
from federation.fetching import FetchLimits, GuardedFetch  # noqa: E402
from federation.model import Filters, ImportedResource, Margin, Source, source_id_for  # noqa: E402
from federation.paying import UpstreamPayer  # noqa: E402
from federation.runtime import Federation, RefreshReport  # noqa: E402
from federation.store import REFRESH_TURN, Caps, FederationStore  # noqa: E402
from payments.ledger import Ledger  # noqa: E402
from payments.networks import BASE_SEPOLIA  # noqa: E402
from skills.net_guard import parse_networks  # noqa: E402
from skills.registry import SkillRegistry  # noqa: E402
from tests.support.loopback_http import JSONHandler  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
LOCAL = "token-count-508"  # B's own resource: python kind, deterministic
LOCAL_PRICE = 5750  # atomic: B's price for it
MARGIN_PERCENT = Decimal(10)  # A's default margin (PAYWIRE_FEDERATION_MARGIN_PERCENT)
INPUT = {"text": "Hello, world!", "model": "gpt-4o"}
FUNDS = 50_000_000  # atomic USDC for the caller and A's wallet: far more than the runs spend
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
OWNER = "bench-refresher"  # holds the refresh turn, so a gateway started later does not refresh


def row(name: str, value: str) -> None:
    print(f"  {name:<60} {value}", flush=True)


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in
                  Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
                 platform.machine())
    memory = int(Path("/proc/meminfo").read_text().split()[1]) / 2**20
    return (f"{model}, {os.cpu_count()} cores, {memory:.0f} GiB, Python "
            f"{platform.python_version()}, load average {os.getloadavg()[0]:.1f}")


# ---------------------------------------------------------------------- CPU accounting


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a live process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def box_busy() -> float:
    """CPU seconds the whole box was busy (all cores)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / CLK_TCK


@dataclass
class Cpu:
    """CPU seconds of named processes (this one: `me`) and the box, summed over measured spans."""

    pids: dict[str, int]
    spent: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    wall: float = 0.0

    @contextmanager
    def span(self) -> Iterator[None]:
        before = {n: proc_cpu(p) for n, p in self.pids.items()}
        mine, box, wall = time.process_time(), box_busy(), time.perf_counter()
        try:
            yield
        finally:
            for name, pid in self.pids.items():
                self.spent[name] += proc_cpu(pid) - before[name]
            self.spent["me"] += time.process_time() - mine
            self.spent["box"] += box_busy() - box
            self.wall += time.perf_counter() - wall

    def others_pct(self) -> float:
        """Of all cores over the spans: busy with none of the named processes nor this one."""
        ours = sum(v for k, v in self.spent.items() if k != "box")
        cores = os.cpu_count() or 1
        return 100 * max(0.0, self.spent["box"] - ours) / (self.wall * cores) if self.wall else 0.0


# ---------------------------------------------------------------------- part 1: overhead


def percentile(ordered: list[float], q: float) -> float:
    """Nearest-rank percentile of sorted values."""
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def server_timing(header: str) -> dict[str, float]:
    stages: dict[str, float] = {}
    for part in header.split(","):
        name, _, rest = part.strip().partition(";dur=")
        if rest:
            stages[name] = stages.get(name, 0.0) + float(rest)
    return stages


@dataclass
class Calls:
    """One target's paid calls: latency in ms, the server's stages, the answers' bodies."""

    ms: list[float] = field(default_factory=list)
    stages: list[dict[str, float]] = field(default_factory=list)
    bodies: set[bytes] = field(default_factory=set)
    paid: set[int] = field(default_factory=set)  # the receipts' amounts (atomic)

    def line(self) -> str:
        ordered = sorted(self.ms)
        return (f"p50 {percentile(ordered, 0.5):6.1f}  p90 {percentile(ordered, 0.9):6.1f}  "
                f"mean {statistics.fmean(ordered):6.1f} ms")

    def stage_means(self) -> dict[str, float]:
        names: dict[str, None] = {}
        for s in self.stages:
            names.update(dict.fromkeys(s))
        return {n: statistics.fmean(s.get(n, 0.0) for s in self.stages) for n in names}


async def paid_call(http: httpx.AsyncClient, url: str, into: Calls) -> None:
    started = time.perf_counter()
    answer = await http.post(url, json=INPUT)
    took = (time.perf_counter() - started) * 1000
    receipt = answer.headers.get("PAYMENT-RESPONSE")
    if answer.status_code != 200 or not receipt:
        raise SystemExit(f"POST {url}: {answer.status_code} {answer.text[:300]}")
    into.ms.append(took)
    into.stages.append(server_timing(answer.headers.get("server-timing", "")))
    into.bodies.add(answer.content)
    into.paid.add(int(decode_payment_response_header(receipt).amount or 0))


async def call_block(http: httpx.AsyncClient, url: str, calls: int, concurrency: int,
                     into: Calls) -> None:
    left = iter(range(calls))

    async def worker() -> None:
        for _ in left:
            await paid_call(http, url, into)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def measure_overhead(direct_url: str, resale_url: str, caller_key: str, calls: int,
                           levels: list[int], cpu_of: Callable[[], Cpu], a_pid: int,
                           spy_to: Path | None) -> None:
    client = x402Client()
    client.set_spend_controls(False)
    register_exact_evm_client(client, EthAccountSigner(Account.from_key(caller_key)))
    async with x402HttpxClient(client, timeout=120) as http:
        warm = Calls()
        for _ in range(3):  # first calls: connections, caches, the signer's first use
            await paid_call(http, direct_url, warm)
            await paid_call(http, resale_url, warm)
        for concurrency in levels:
            direct, resale = Calls(), Calls()
            cpu = {"B": cpu_of(), "A": cpu_of()}
            half = calls // 2
            spied = spy_to.with_name(f"{spy_to.name}-c{concurrency}") if spy_to else None
            for number, size in enumerate((half, calls - half)):  # interleaved: B, A, B, A
                with cpu["B"].span():
                    await call_block(http, direct_url, size, concurrency, direct)
                spy = (spy_profile.start(a_pid, spied.with_suffix(f".{number}.txt"))
                       if spied else None)
                with cpu["A"].span():
                    await call_block(http, resale_url, size, concurrency, resale)
                if spy is not None:
                    await asyncio.to_thread(spy_profile.stop, spy)
            if direct.bodies != resale.bodies or len(direct.bodies) != 1:
                raise SystemExit("A's answers are not B's answer")
            resale_price = int(Margin(MARGIN_PERCENT).price(Decimal(LOCAL_PRICE).scaleb(-6))
                               .scaleb(6))
            if direct.paid != {LOCAL_PRICE} or resale.paid != {resale_price}:
                raise SystemExit(f"paid {direct.paid} to B and {resale.paid} to A, not "
                                 f"{LOCAL_PRICE} and {resale_price}")
            print(f"  concurrency {concurrency}, {calls} calls each")
            row("direct to B", direct.line())
            row("resold by A", resale.line())
            extra = [statistics.median(resale.ms) - statistics.median(direct.ms),
                     statistics.fmean(resale.ms) - statistics.fmean(direct.ms)]
            row("overhead of the federated call", f"p50 +{extra[0]:.1f}  mean +{extra[1]:.1f} ms")
            for name, made in (("B direct", direct), ("A resale", resale)):
                stages = made.stage_means()
                row(f"{name}: Server-Timing means (ms)",
                    ", ".join(f"{k} {v:.1f}" for k, v in stages.items()))
            row("paid per call (atomic): B direct / A resale",
                f"{sorted(direct.paid)} / {sorted(resale.paid)}")
            for name, n in (("B", direct), ("A", resale)):
                used = cpu[name]
                per = {k: 1000 * v / len(n.ms) for k, v in used.spent.items()}
                row(f"CPU per call while calling {name} (ms)",
                    f"A {per['A']:.1f}, B {per['B']:.1f}, devnet {per['devnet']:.1f}, "
                    f"client {per['me']:.1f}; others {used.others_pct():.0f}% of the box")
            if spied is not None:  # A's samples over both halves: µs per federated call
                folded = spied.with_suffix(".txt")
                folded.write_text("".join(spied.with_suffix(f".{n}.txt").read_text()
                                          for n in range(2)))
                spied.with_suffix(".summary.txt").write_text(
                    spy_profile.summary(folded, len(resale.ms), top=40) + "\n")
                row("py-spy of A", str(spied.with_suffix(".summary.txt")))


def overhead(args: argparse.Namespace) -> None:
    from tests.support.devnet_world import new_gateway_accounts, new_payer, running_devnet
    from tests.support.federation_world import LOOPBACK, ServedGateway, imported, until
    from tests.support.paying import EVM_NET, SOL_NET

    print(f"== overhead: a federated call against the upstream called directly; {machine()}")
    with tempfile.TemporaryDirectory(prefix="bench-federation-") as tmp:
        folder = Path(tmp)
        with running_devnet(folder / "devnet") as devnet:
            b_accounts = new_gateway_accounts(devnet.url)
            wallet = new_payer(devnet.url, FUNDS)
            caller = new_payer(devnet.url, FUNDS)
            (folder / "a").mkdir()
            (folder / "b").mkdir()
            b = ServedGateway("b", folder / "b", dict(b_accounts.env))
            a = ServedGateway("a", folder / "a", {
                **devnet.env, "PAYWIRE_FEDERATE": f"{b.url}/discovery/resources",
                "PAYWIRE_FEDERATION_ALLOW_NETWORKS": LOOPBACK,
                "PAYWIRE_FEDERATION_MARGIN_PERCENT": str(MARGIN_PERCENT)})
            try:
                b.start().wait()
                for chain in args.upstream_chain:
                    # A's wallet holds one key: A pays B on that chain
                    a.env["PAYWIRE_FEDERATION_PAYER_KEY"] = (
                        wallet.evm_key if chain == "evm" else wallet.sol_key)
                    a.stop()
                    a.start().wait()
                    found = until(lambda: imported(a, LOCAL), "A to import B's resources")
                    print(f"A pays B on {chain} (the caller pays A and B on EVM)")
                    assert a.proc is not None and b.proc is not None
                    pids = {"A": a.proc.pid, "B": b.proc.pid, "devnet": devnet.proc.pid}
                    network = EVM_NET if chain == "evm" else SOL_NET
                    held = devnet.balance(network, wallet.address(network))
                    asyncio.run(measure_overhead(
                        f"{b.url}/v1/marketplace/api/{LOCAL}",
                        f"{a.url}/v1/marketplace/api/{found['resource_id']}", caller.evm_key,
                        args.calls, args.concurrency, lambda p=pids: Cpu(dict(p)),
                        a.proc.pid, args.py_spy / f"a-{chain}" if args.py_spy else None))
                    # A's wallet paid B once per resold call (the 3 warm-up calls too)
                    resold = 3 + args.calls * len(args.concurrency)
                    spent = held - devnet.balance(network, wallet.address(network))
                    if spent != resold * LOCAL_PRICE:
                        raise SystemExit(f"A's wallet paid {spent}, not {resold} x {LOCAL_PRICE}")
                    row(f"A's wallet paid B on {chain}", f"{resold} x {LOCAL_PRICE} atomic, exactly")
            finally:
                a.stop()
                b.stop()


# ---------------------------------------------------------------------- the catalogue

TOPICS = ("weather", "search", "geocode", "translate", "summarize", "price", "news", "stocks",
          "ocr", "sentiment", "whois", "tokens")
VERBS = ("lookup", "query", "daily", "batch", "detail", "latest", "history", "score")
CATEGORIES = ("Data", "Search", "AI", "Finance", "Weather", "Utilities", "Media", "Security")
SELLERS = 100


def schema_and_example(kind: int, variant: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """One of six input schema shapes (of the sizes sellers publish), made distinct by
    `variant`, and an example valid against it."""
    note = f"(variant {variant})"
    if kind == 0:
        return ({"type": "object", "properties": {
            "text": {"type": "string", "minLength": 1, "maxLength": 100000,
                     "description": f"The text to count {note}"},
            "model": {"type": "string", "enum": ["gpt-4o", "gpt-4o-mini", "o3", "llama-3"],
                      "description": "Whose tokenizer"}},
            "required": ["text"], "additionalProperties": False},
                {"text": "Hello, world!", "model": "gpt-4o"})
    if kind == 1:
        return ({"type": "object", "properties": {
            "query": {"type": "string", "minLength": 1, "description": f"What to search {note}"},
            "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10},
            "lang": {"type": "string", "enum": ["en", "de", "fr", "es", "ja"]},
            "safe": {"type": "boolean"}},
            "required": ["query"]}, {"query": "x402 payments", "limit": 5})
    if kind == 2:
        return ({"type": "object", "properties": {
            "city": {"type": "string", "description": f"City name {note}"},
            "country": {"type": "string", "pattern": "^[A-Z]{2}$"},
            "units": {"type": "string", "enum": ["metric", "imperial"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14}},
            "required": ["city"]}, {"city": "Lisbon", "country": "PT", "days": 3})
    if kind == 3:
        return ({"type": "object", "properties": {
            "url": {"type": "string", "format": "uri", "description": f"Page to read {note}"},
            "selectors": {"type": "array", "items": {"type": "string"}, "maxItems": 20},
            "timeout_ms": {"type": "integer", "minimum": 100, "maximum": 30000}},
            "required": ["url"]}, {"url": "https://example.com/", "selectors": ["h1"]})
    if kind == 4:
        return ({"type": "object", "properties": {
            "address": {"type": "string", "description": f"An account {note}"},
            "chain": {"type": "string", "enum": ["base", "ethereum", "solana", "polygon"]},
            "from": {"type": "string", "format": "date"},
            "to": {"type": "string", "format": "date"}},
            "required": ["address", "chain"]},
                {"address": "0x209693Bc6afc0C5328bA36FaF03C514EF312287C", "chain": "base"})
    return ({"type": "object", "properties": {
        "filters": {"type": "object", "properties": {
            "category": {"type": "string"}, "min_score": {"type": "number", "minimum": 0},
            "tags": {"type": "array", "items": {"type": "string"}}},
            "additionalProperties": False},
        "page": {"type": "integer", "minimum": 1, "description": f"Page {note}"},
        "sort": {"type": "string", "enum": ["score", "date", "name"]}}},
            {"filters": {"category": "news"}, "page": 1})


def catalogue_item(i: int, schemas: int, amount: int) -> dict[str, Any]:
    """Item `i` as paywire's `/discovery/resources` lists a resource (wellknown/discovery.py)."""
    topic, verb = TOPICS[i % len(TOPICS)], VERBS[(i // len(TOPICS)) % len(VERBS)]
    seller = i % SELLERS
    url = f"https://api.seller{seller}.example/v1/{topic}/{verb}-{i}"
    variant = i % schemas
    schema, example = schema_and_example(variant % 6, variant)
    declared = declare_discovery_extension(input=example, input_schema=schema, body_type="json",
                                           output=OutputConfig(example={"ok": True, "items": []}))
    bazaar = bazaar_resource_server_extension.enrich_declaration(declared["bazaar"], _Post())
    categories = [CATEGORIES[i % len(CATEGORIES)], CATEGORIES[(i // 7) % len(CATEGORIES)]]
    return {
        "resource": url, "type": "http", "x402Version": 2,
        "accepts": [{"scheme": "exact", "network": BASE_SEPOLIA.caip2, "asset": BASE_SEPOLIA.usdc,
                     "amount": str(amount), "payTo": "0x" + f"{seller + 1:040x}",
                     "maxTimeoutSeconds": 60, "extra": {"name": "USDC", "version": "2"}}],
        "lastUpdated": "2026-11-29T00:00:00Z",
        "description": (f"{topic.title()} {verb} from seller {seller}: answers JSON for one request; "
                        f"endpoint {i} of a larger API, billed per call in USDC."),
        "mimeType": "application/json", "extensions": {"bazaar": bazaar},
        "metadata": {"name": f"{topic.title()} {verb} {i}", "category": ", ".join(categories),
                     "categories": categories, "tags": [topic, verb], "route": f"POST {url}"},
    }


@dataclass(frozen=True)
class _Post:
    """What the SDK's `enrich_declaration` reads of a request."""

    method: str = "POST"
    route_pattern: None = None


class Catalogue:
    """A facilitator-like `/discovery/resources` on loopback (paywire's paging: limit 20 by
    default, 100 at most), its pages encoded ahead so serving costs little of the GIL."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.pages: dict[tuple[int, int], bytes] = {}
        self.set(items)
        catalogue = self

        class Handler(JSONHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                query = parse_qs(urlsplit(self.path).query)
                limit = min(int(query.get("limit", ["20"])[0]), 100)
                offset = int(query.get("offset", ["0"])[0])
                self.answer(200, catalogue.page(offset, limit))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/discovery/resources"

    def set(self, items: list[dict[str, Any]]) -> None:
        self.items = items
        self.pages = {(o, 100): self._encode(o, 100) for o in range(20, len(items), 100)}
        self.pages[(0, 20)] = self._encode(0, 20)

    def _encode(self, offset: int, limit: int) -> bytes:
        return json.dumps({"x402Version": 2, "items": self.items[offset:offset + limit],
                           "pagination": {"limit": limit, "offset": offset,
                                          "total": len(self.items)}}).encode()

    def page(self, offset: int, limit: int) -> bytes:
        return self.pages.get((offset, limit)) or self._encode(offset, limit)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def amounts(count: int) -> list[int]:
    return [1000 + (i * 7919) % 49000 for i in range(count)]


# ---------------------------------------------------------------------- part 2: import


class Parts:
    """Seconds spent in named calls of one Federation (its own methods, wrapped where they are
    looked up: on the instance, or `discover` in federation.runtime's namespace)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def timed(self, name: str, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def run(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - started
        return run

    def timed_sync(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - started
        return run

    def __getitem__(self, name: str) -> float:
        return self.seconds.get(name, 0.0)


def federation_on(ledger: Ledger) -> tuple[Federation, Parts]:
    """A Federation as agent/federated.py builds one (no wallet: nothing is paid here), with its
    parts timed."""
    fetch = GuardedFetch(parse_networks("127.0.0.1/32"), FetchLimits())
    store = FederationStore(ledger)
    payer = UpstreamPayer(store, fetch, None, Caps(Decimal(1), Decimal(10), Decimal(50)),
                          owner=OWNER, timeout_seconds=30, max_answer_bytes=10 * 2**20)
    fed = Federation(store, SkillRegistry(), fetch, payer, owner=OWNER)
    parts = Parts()
    fetch.request = parts.timed("http", fetch.request)  # type: ignore[method-assign]
    store.replace_resources = parts.timed("store", store.replace_resources)  # type: ignore[method-assign]
    store.resources = parts.timed("read", store.resources)  # type: ignore[method-assign]
    fed.sync = parts.timed("sync", fed.sync)  # type: ignore[method-assign]
    fed.skill_of = parts.timed_sync("skills", fed.skill_of)  # type: ignore[method-assign]
    return fed, parts


@contextmanager
def shared_parts_timed(parts: Parts) -> Iterator[None]:
    """`discover` (as federation.runtime calls it) and `ImportedResource.fingerprint` (the store
    and the sync each compute it for every resource) timed while the block runs."""
    discover, fingerprint = fed_runtime.discover, ImportedResource.fingerprint
    fed_runtime.discover = parts.timed("discovery", discover)  # type: ignore[assignment]
    ImportedResource.fingerprint = parts.timed_sync("fingerprints", fingerprint)  # type: ignore[method-assign]
    try:
        yield
    finally:
        fed_runtime.discover = discover  # type: ignore[assignment]
        ImportedResource.fingerprint = fingerprint  # type: ignore[method-assign]


class LoopHeld:
    """The longest the event loop went without running this ticker (every ~1 ms): how long a
    gateway serving on this loop would have answered nothing."""

    async def __aenter__(self) -> LoopHeld:
        self.worst = 0.0
        self._task = asyncio.create_task(self._tick())
        await asyncio.sleep(0)
        return self

    async def _tick(self) -> None:
        self._last = time.perf_counter()
        while True:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            self.worst = max(self.worst, now - self._last - 0.001)
            self._last = now

    async def __aexit__(self, *exc: object) -> None:
        # the gap up to now: a block that held the loop to its end ran no tick after it
        self.worst = max(self.worst, time.perf_counter() - self._last - 0.001)
        self._task.cancel()


async def timed_refresh(fed: Federation, parts: Parts, label: str,
                        expect: tuple[int, int, int]) -> None:
    parts.seconds.clear()
    with shared_parts_timed(parts):
        async with LoopHeld() as held:
            started = time.perf_counter()
            report = await fed.refresh(force=True)
            took = time.perf_counter() - started
    assert isinstance(report, RefreshReport)
    got = (report.added, report.changed, report.removed)
    if got != expect or report.failed:
        raise SystemExit(f"{label}: added/changed/removed {got}, expected {expect}; "
                         f"failed: {report.failed}")
    row(f"{label} (+{got[0]} ~{got[1]} -{got[2]})",
        f"{took:.2f} s; loop held at most {held.worst * 1000:,.0f} ms")
    row("  discovery (HTTP) / store / sync (read, skills)",
        f"{parts['discovery']:.2f} ({parts['http']:.2f}) / {parts['store']:.2f} / "
        f"{parts['sync']:.2f} ({parts['read']:.2f}, {parts['skills']:.2f}) s")
    row("  fingerprints computed (in the store and the sync)", f"{parts['fingerprints']:.2f} s")


async def timed_sync(fed: Federation, parts: Parts, label: str) -> None:
    parts.seconds.clear()
    with shared_parts_timed(parts):
        async with LoopHeld() as held:
            started = time.perf_counter()
            await fed.sync()
            took = time.perf_counter() - started
    row(label, f"{took:.2f} s (read {parts['read']:.2f}, fingerprints "
        f"{parts['fingerprints']:.2f}, skills {parts['skills']:.2f}); loop held at most "
        f"{held.worst * 1000:,.0f} ms; {len(fed.registry)} skills")


async def import_and_refresh(url: str, count: int, schemas: int, show: bool) -> None:
    """Import the catalogue into the ledger at `url` and refresh it (printed when `show`); the
    ledger is left holding all `count` items, its refresh turn held by OWNER for an hour."""
    base = amounts(count)
    items = [catalogue_item(i, schemas, base[i]) for i in range(count)]
    if show:
        sizes = [len(json.dumps(i)) for i in items]
        row("catalogue item size: mean / largest",
            f"{statistics.fmean(sizes):,.0f} / {max(sizes):,} bytes "
            f"({len({i % schemas for i in range(count)})} distinct schemas)")
    catalogue = Catalogue(items)
    engines = [make_engine(url), make_engine(url)]
    ledgers = [Ledger(e) for e in engines]
    try:
        await ledgers[0].create_tables()
        fed, parts = federation_on(ledgers[0])
        await ledgers[0].take_turn(REFRESH_TURN, owner=OWNER, seconds=3600)
        await fed.store.put_source(Source(source_id_for(catalogue.url), catalogue.url, "catalogue",
                                          Filters(), Margin(MARGIN_PERCENT), origin="cli"))
        say = timed_refresh if show else _quiet_refresh
        await say(fed, parts, f"import of {count}", (count, 0, 0))
        await say(fed, parts, "refresh, nothing changed", (0, 0, 0))
        replica, replica_parts = federation_on(ledgers[1])
        if show:
            await timed_sync(replica, replica_parts, f"second replica: first sync ({count})")
        repriced = [i for i in range(count) if i % 20 == 3]
        gone = {i for i in range(count) if i % 100 == 50}
        changed = [dict(item) for item in items]
        for i in repriced:
            accept = {**changed[i]["accepts"][0], "amount": str(base[i] * 11 // 10 + 1)}
            changed[i]["accepts"] = [accept]
        catalogue.set([item for i, item in enumerate(changed) if i not in gone])
        await say(fed, parts, "refresh, 5% repriced, 1% gone", (0, len(repriced), len(gone)))
        if show:
            await timed_sync(replica, replica_parts, "second replica: sync after it")
        catalogue.set(items)
        await say(fed, parts, "refresh back to the first catalogue", (len(gone), len(repriced), 0))
        await fed.aclose()
        await replica.aclose()
    finally:
        catalogue.stop()
        for ledger, engine in zip(ledgers, engines, strict=True):
            ledger.close()
            await engine.dispose()


async def _quiet_refresh(fed: Federation, parts: Parts, label: str,
                         expect: tuple[int, int, int]) -> None:
    report = await fed.refresh(force=True)
    assert report is not None and not report.failed, report


# ---------------------------------------------------------------------- part 3: the gateway


def tools_list(http: httpx.Client) -> dict[str, Any]:
    answer = http.post("/mcp", headers=MCP_HEADERS,
                       json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}})
    answer.raise_for_status()
    return dict(answer.json()["result"])


@contextmanager
def federation_start_timed(into: list[float]) -> Iterator[None]:
    """`Federation.start` (the lifespan's registry sync from the ledger) timed in this process."""
    original = Federation.start

    async def start(self: Federation) -> None:
        started = time.perf_counter()
        try:
            await original(self)
        finally:
            into.append(time.perf_counter() - started)

    Federation.start = start  # type: ignore[method-assign]
    try:
        yield
    finally:
        Federation.start = original  # type: ignore[method-assign]


def serve_and_read(data_dir: Path, database_url: str | None, label: str) -> None:
    from tests.support.live_server import start_server

    starts: list[float] = []
    with federation_start_timed(starts):
        live, startup = timed(lambda: start_server(data_dir, env={
            # a wallet for base-sepolia: without one, imported resources are listed unavailable
            "PAYWIRE_FEDERATION_PAYER_KEY": "0x" + bytes(Account.create().key).hex(),
        }, database_url=database_url, startup_timeout=300))
    try:
        sold = [s.id for s in live.runtime.gateway.catalogue.for_sale() if s.id.startswith("x402.")]
        row(f"{label}: startup (create_app to listening)",
            f"{startup:,.0f} ms, of which Federation.start {starts[0] * 1000:,.0f} ms; "
            f"{len(sold):,} imported resources for sale")
        with httpx.Client(base_url=live.url, timeout=300) as http:
            for path in ("/api/marketplace/apis?page=1&page_size=20", "/openapi.json",
                         "/.well-known/agent.json", "mcp tools/list",
                         "/discovery/resources?limit=100"):
                read = ((lambda: tools_list(http)) if path.startswith("mcp")
                        else (lambda p=path: get(http, p)))  # type: ignore[misc]
                answer, first = timed(read)
                _, warm = timed(read)
                size = (f"{len(answer['tools'])} tools" if isinstance(answer, dict)
                        else f"{len(answer.content) / 1000:,.0f} kB")
                row(f"  {path}: first / warm", f"{first:,.1f} / {warm:,.1f} ms ({size})")
    finally:
        live.stop()


def gateway_and_import(args: argparse.Namespace, parts: set[str]) -> None:
    pg = None
    try:
        for db in args.db:
            print(f"== {db}: import and refresh of {args.resources:,} resources, and a gateway "
                  f"serving them; {machine()}")
            with tempfile.TemporaryDirectory(prefix="bench-federation-") as tmp:
                data_dir = Path(tmp) / "data"
                data_dir.mkdir()
                if db == "postgresql":
                    if pg is None:
                        from tests.support.postgres import start_postgres

                        pg = start_postgres()
                    url: str | None = pg.fresh_url()
                else:
                    url = None
                ledger_url = url or f"sqlite+aiosqlite:///{data_dir / 'paywire.db'}"
                asyncio.run(import_and_refresh(ledger_url, args.resources, args.schemas,
                                               "import" in parts))
                if "gateway" not in parts:
                    continue
                for _ in range(args.rounds):
                    empty = Path(tmp) / f"empty-{time.monotonic_ns()}"
                    empty.mkdir()
                    serve_and_read(empty, pg.fresh_url() if pg is not None and url else None,
                                   "no imported resources")
                    serve_and_read(data_dir, url, f"{args.resources:,} imported")
    finally:
        if pg is not None:
            from tests.support.postgres import stop_postgres

            stop_postgres(pg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="overhead,import,gateway",
                        help="comma-separated: overhead, import, gateway")
    parser.add_argument("--calls", type=int, default=50, help="paid calls per target and level")
    parser.add_argument("--concurrency", default="1,4", help="comma-separated levels")
    parser.add_argument("--upstream-chain", default="evm,solana",
                        help="the chain(s) A pays B on: evm, solana")
    parser.add_argument("--resources", type=int, default=3000)
    parser.add_argument("--schemas", type=int, default=3000,
                        help="distinct input schemas among the resources")
    parser.add_argument("--db", default="sqlite,postgresql", help="sqlite, postgresql")
    parser.add_argument("--rounds", type=int, default=2, help="gateway startups of each kind")
    parser.add_argument("--py-spy", type=Path, metavar="DIR",
                        help="sample A during its calls with py-spy (bench/spy_profile.py; "
                             "PY_SPY=/path/to/py-spy) into DIR, a summary per chain and level")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.upstream_chain = args.upstream_chain.split(",")
    args.db = args.db.split(",")
    if args.py_spy:
        args.py_spy.mkdir(parents=True, exist_ok=True)
    if "overhead" in parts:
        overhead(args)
    if parts & {"import", "gateway"}:
        gateway_and_import(args, parts)


if __name__ == "__main__":
    main()
