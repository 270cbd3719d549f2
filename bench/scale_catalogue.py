#!/usr/bin/env python3
"""Every face of a gateway selling 3,000 marketplace resources, and what one registry change costs.

    .venv/bin/python bench/scale_catalogue.py [--no-browser]

A real gateway (tests/support/live_server.py: uvicorn on a free loopback port, SQLite, its devnet)
over PAYWIRE_RESOURCE_DIRS of generated python-kind resources (tests/test_catalogue_scale.py's
generator: tests/test_catalogue_page.py's 3,000 plus ids MCP must rename). It prints, in ms:
- startup: Settings to listening (create_app loads and checks every file);
- the catalogue page: the first and a warm render in Chromium (Playwright on Debian's
  /usr/bin/chromium: from navigation to the first page of skills shown), and the first and a warm
  `GET /api/marketplace/apis` (the page's data);
- `GET /openapi.json`: first (the document built), warm, and its size;
- MCP `tools/list`: the first page (the tool table built), a warm page, every page walked;
- the agent card (1.0 and 0.3): first (built), warm, and their sizes; the help skill's answer size;
- after `registry.replace` of one skill: the first answer of each cached face again (each
  rebuilds what it cached for the old registry version).
Nothing here is asserted: tests/test_catalogue_scale.py holds the bounds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.live_server import LiveServer, start_server  # noqa: E402
from tests.test_catalogue_scale import write_catalogue  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    value = fn()
    return value, (time.perf_counter() - started) * 1000


def get(http: httpx.Client, path: str) -> httpx.Response:
    answer = http.get(path)
    answer.raise_for_status()
    return answer


def mcp(http: httpx.Client, method: str, params: dict[str, Any]) -> dict[str, Any]:
    answer = http.post("/mcp", headers=MCP_HEADERS,
                       json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    answer.raise_for_status()
    body = answer.json()
    if "error" in body:
        raise RuntimeError(f"{method}: {body['error']}")
    return body["result"]


def every_tool(http: httpx.Client) -> int:
    count, cursor = 0, None
    while True:
        page = mcp(http, "tools/list", {"cursor": cursor} if cursor else {})
        count += len(page["tools"])
        cursor = page.get("nextCursor")
        if cursor is None:
            return count


def browser_render(url: str) -> tuple[float, float] | None:
    """The catalogue page's first and warm (reloaded) render in Chromium, in ms; None without it."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if not CHROMIUM.exists():
        return None
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--no-first-run"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.set_default_timeout(30_000)
            started = time.perf_counter()
            page.goto(f"{url}/")
            page.wait_for_selector("body[data-loaded=true]")
            first = (time.perf_counter() - started) * 1000
            started = time.perf_counter()
            page.reload()
            page.wait_for_selector("body[data-loaded=true]")
            return first, (time.perf_counter() - started) * 1000
        finally:
            browser.close()


def row(name: str, value: str) -> None:
    print(f"  {name:<52} {value}")


def run(browser: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="scale-catalogue-") as tmp:
        folder, data = Path(tmp) / "resources", Path(tmp) / "data"
        folder.mkdir()
        data.mkdir()
        files = write_catalogue(folder)
        live, startup = timed(lambda: start_server(data, env={
            "PAYWIRE_RESOURCE_DIRS": str(folder),
            "LOCAL_LLM_BASE_URL": "http://127.0.0.1:9/v1",  # the local/* models count as available
        }, startup_timeout=300))
        try:
            measure(live, startup, files, browser)
        finally:
            live.stop()


def measure(live: LiveServer, startup: float, files: int, browser: bool) -> None:
    catalogue = live.runtime.gateway.catalogue
    print(f"paywire at {files} resource files ({len(catalogue)} skills, "
          f"{len(catalogue.of_kind('resource'))} resources); {platform.machine()}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}")
    row("startup (create_app to listening)", f"{startup:,.0f} ms")
    with httpx.Client(base_url=live.url, timeout=300) as http:
        rendered = browser_render(live.url) if browser else None
        if rendered is not None:
            row("catalogue page in Chromium: first / warm render",
                f"{rendered[0]:,.0f} / {rendered[1]:,.0f} ms")
        page = "/api/marketplace/apis?page=1&page_size=20"
        _, first = timed(lambda: get(http, page))
        _, warm = timed(lambda: get(http, page))
        row("GET /api/marketplace/apis (20): first / warm", f"{first:.1f} / {warm:.1f} ms")

        document, first = timed(lambda: get(http, "/openapi.json"))
        _, warm = timed(lambda: get(http, "/openapi.json"))
        row("GET /openapi.json: first / warm, size", f"{first:,.0f} / {warm:.1f} ms, "
            f"{len(document.content) / 1e6:.2f} MB")

        listed, first = timed(lambda: mcp(http, "tools/list", {}))
        _, warm = timed(lambda: mcp(http, "tools/list", {}))
        count, walk = timed(lambda: every_tool(http))
        row("MCP tools/list: first page / warm page", f"{first:,.0f} / {warm:.1f} ms "
            f"({len(listed['tools'])} tools a page)")
        row(f"MCP tools/list: all {count} tools, every page", f"{walk:,.0f} ms")

        card, first = timed(lambda: get(http, "/.well-known/agent-card.json"))
        _, warm = timed(lambda: get(http, "/.well-known/agent-card.json"))
        legacy = get(http, "/.well-known/agent.json")
        row("agent card: first / warm", f"{first:,.0f} / {warm:.1f} ms")
        row("agent card: bytes (1.0 / 0.3), skills listed",
            f"{len(card.content):,} / {len(legacy.content):,}, {len(card.json()['skills'])}")

        helped, took = timed(lambda: mcp(http, "tools/call", {"name": "help", "arguments": {}}))
        text = json.dumps(helped["structuredContent"]).encode()
        row("help (MCP tools/call): time, answer bytes, skills listed",
            f"{took:.1f} ms, {len(text):,}, {len(helped['structuredContent']['skills'])}")

        # one registry change: every cached face rebuilds on its next request
        registry = live.runtime.gateway.registry
        skill = next(s for s in registry.all() if s.kind == "resource")
        price = (skill.price_usd or Decimal(0)) + Decimal("0.001")
        registry.replace(dataclasses.replace(skill, price_usd=price))
        print(f"  after registry.replace({skill.id!r}): the first request of each face")
        _, took = timed(lambda: get(http, "/openapi.json"))
        row("  GET /openapi.json", f"{took:,.0f} ms")
        _, took = timed(lambda: mcp(http, "tools/list", {}))
        row("  MCP tools/list (first page)", f"{took:,.0f} ms")
        _, took = timed(lambda: get(http, "/.well-known/agent-card.json"))
        row("  agent card", f"{took:,.0f} ms")
        _, took = timed(lambda: get(http, "/discovery/resources?limit=100"))
        row("  GET /discovery/resources?limit=100", f"{took:,.0f} ms")
        _, took = timed(lambda: get(http, "/.well-known/x402"))
        row("  GET /.well-known/x402", f"{took:,.0f} ms")
        _, took = timed(lambda: get(http, page))
        row("  GET /api/marketplace/apis (20, not cached)", f"{took:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-browser", action="store_true", help="skip the Chromium render")
    args = parser.parse_args()
    run(not args.no_browser)


if __name__ == "__main__":
    main()
