"""The catalogue page (GET /, wellknown/catalogue_page/) and its JSON, on a live devnet server
selling 3,000 generated resources besides the built-in ones, and one whose author wrote markup
and quotes everywhere.

The browser part drives Debian's /usr/bin/chromium with Playwright (no browser download): the
first page of skills with the prices `PriceTerms` gives, a search answered by the server (the
request carries q=), paging, a category, a skill's snippets (its curl snippet run for real
answers 402; its `paywire pay` and Python snippets, run for real, pay and deliver the exact
example), the markup shown as text, the models with their availability, the links; the page fits
a 1280 px window. The screenshot is kept in test-artifacts/catalogue-page.png (or
$PAYWIRE_TEST_ARTIFACTS). First render and search times go to test-artifacts/catalogue-page.txt
(reported, not asserted).

A production gateway (Base and Solana, a remote facilitator) shows neither test money nor the
devnet's Solana node: its page names the real networks, its snippets pay from the payer's own key
and Solana node (the Python one, run for real against the devnet with a Solana key, pays); the
MCP configurations (remote HTTP, and `paywire mcp` over stdio) are run as an MCP client would."""

from __future__ import annotations

import ast
import json
import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from solders.keypair import Keypair

from tests.support.live_server import LiveServer, start_server
from tests.support.reports import report
from wellknown.catalogue_page import wants_html
from wellknown.snippets import FORM_FILE_FIELDS, Entry, Site, model_example, snippets

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
ROOT = Path(__file__).resolve().parent.parent
GENERATED = 3000
CATEGORIES = ("Alpha", "Beta", "Gamma", "Delta", "Epsilon")
NEEDLE = "zebra"  # in every 97th generated description: 31 matches, two pages
NASTY_ID = "nasty-quotes"
NASTY_DESCRIPTION = ("Says \"hi\" & it's <img src=x onerror=\"document.body.dataset.pwned='img'\"> "
                     "<script>document.body.dataset.pwned='script'</script> done")
NASTY_EXAMPLE = {"text": "it's a \"test\" $(touch /tmp/paywire-pwned) `id` <b>bold</b> \\n ünïcode",
                 "model": "gpt-4o"}
BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
SOLANA_MAINNET = "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp"
SOLANA_DEVNET = "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1"


def artifacts() -> Path:
    folder = Path(os.environ.get("PAYWIRE_TEST_ARTIFACTS") or ROOT / "test-artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _write_resources(folder: Path) -> None:
    """3,000 fixed-price resources (the token counter's handler: it quotes with no upstream), and
    the nasty one (the test handler that echoes its input)."""
    for i in range(GENERATED):
        (folder / f"gen-{i:04d}.json").write_text(json.dumps({
            "id": f"gen-{i:04d}", "name": f"Generated {i:04d}",
            "description": f"Generated resource number {i}" + (f", with a {NEEDLE}" if i % 97 == 0 else ""),
            "categories": [CATEGORIES[i % len(CATEGORIES)]],
            "price": str(Decimal("0.001") + Decimal(i) / 1_000_000),
            "method": "POST", "kind": "python", "handler": "skills.resources.token_count",
            "input_schema": {"type": "object", "properties": {"text": {"type": "string"},
                                                              "model": {"type": "string"}},
                             "required": ["model"]},
            "examples": [{"text": f"example {i}", "model": "gpt-4o"}],
        }))
    (folder / f"{NASTY_ID}.json").write_text(json.dumps({
        "id": NASTY_ID, "name": "<b>Nasty</b> \"quoted\" name", "description": NASTY_DESCRIPTION,
        "categories": ["Test"], "price": "0.003", "method": "POST", "kind": "python",
        "handler": "tests.support.hooked_resources:Hooked", "input_schema": {"type": "object"},
        "examples": [NASTY_EXAMPLE],
    }))


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    folder = tmp_path_factory.mktemp("many-resources")
    _write_resources(folder)
    started = time.perf_counter()
    live = start_server(tmp_path_factory.mktemp("catalogue-page"), env={
        "PAYWIRE_RESOURCE_DIRS": str(folder),
        "LOCAL_LLM_BASE_URL": "http://127.0.0.1:9/v1",  # the local/* models count as available
    })
    report("catalogue-page", f"server start with {GENERATED + 1} extra resources: "
                             f"{time.perf_counter() - started:.2f} s")
    yield live
    live.stop()


@pytest.fixture(scope="module")
def production(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A production gateway paid on Base and Solana through a remote facilitator (never reached:
    the catalogue needs none)."""
    live = start_server(tmp_path_factory.mktemp("production-page"), env={
        "PAYWIRE_NETWORKS": "base,solana", "PAYWIRE_EVM_PAY_TO": "0x" + "12" * 20,
        "PAYWIRE_SOLANA_PAY_TO": str(Keypair().pubkey()), "PAYWIRE_FACILITATOR_URL": "http://127.0.0.1:9",
    })
    yield live
    live.stop()


def _terms(live: LiveServer, skill_id: str, operation: str | None = None) -> dict[str, Any]:
    catalogue = live.runtime.gateway.catalogue
    skill = catalogue.get(skill_id)
    assert skill is not None
    return catalogue.price_terms(skill, operation).as_json()


# -- without a browser ----------------------------------------------------------------------------

@pytest.mark.parametrize(("accept", "html"), [
    (BROWSER_ACCEPT, True), ("text/html", True), ("*/*", False), ("", False),
    ("application/json", False), ("application/json, text/html;q=0.5", False),
    ("text/html;q=0.9, application/json;q=0.9", True), ("text/html;q=0", False),
    ("text/html;q=bogus", False), ("TEXT/HTML", True),
])
def test_a_browser_gets_the_page_and_others_json(accept: str, html: bool) -> None:
    assert wants_html(accept) is html


def test_the_front_door_answers_each_client_in_its_language(big: LiveServer) -> None:
    page = httpx.get(f"{big.url}/", headers={"Accept": BROWSER_ACCEPT})
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["vary"] == "Accept"
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe-inline" not in csp
    assert '<script src="/catalogue/app.js" defer></script>' in page.text
    assert "<script>" not in page.text  # no inline script: the CSP forbids it anyway

    about = httpx.get(f"{big.url}/")  # httpx sends */*, as curl does
    assert about.status_code == 200 and about.headers["content-type"] == "application/json"
    links = about.json()["links"]
    assert links["openapi"] == f"{big.url}/openapi.json" and links["mcp"] == f"{big.url}/mcp"
    assert about.json()["counts"]["resources"] == GENERATED + 1 + len(list(
        (ROOT / "skills" / "builtin").glob("*.json")))
    for path in ("/catalogue/app.js", "/catalogue/style.css"):
        asset = httpx.get(big.url + path)
        assert asset.status_code == 200 and asset.headers["x-content-type-options"] == "nosniff"
    assert httpx.post(f"{big.url}/").status_code == 405
    missing = httpx.get(f"{big.url}/catalogue/skills/no-such-skill")
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "skill_id"
    assert httpx.get(f"{big.url}/catalogue/skills/" + "x" * 300).status_code == 404


def test_snippets_keep_hostile_examples_intact() -> None:
    entry = Entry("http://127.0.0.1:8000", f"/v1/marketplace/api/{NASTY_ID}", NASTY_EXAMPLE, "resource",
                  most_usd=Decimal("0.25"))
    made = snippets(entry)
    words = shlex.split(made["pay"])
    assert words[:3] == ["paywire", "pay", f"http://127.0.0.1:8000/v1/marketplace/api/{NASTY_ID}"]
    assert json.loads(words[words.index("--data") + 1]) == NASTY_EXAMPLE
    assert words[-2:] == ["--max", "0.25"]  # a fixed price above `paywire pay`'s default cap
    assert shlex.split(made["curl"])[-2:] == ["-d", "{}"]
    tree = ast.parse(made["python"])  # a program that compiles, its BODY exactly the example
    body = next(n.value for n in tree.body if isinstance(n, ast.Assign)
                and getattr(n.targets[0], "id", "") == "BODY")
    assert ast.literal_eval(body) == NASTY_EXAMPLE
    assert json.loads(made["mcp"]) == {"mcpServers": {"paywire": {
        "type": "http", "url": "http://127.0.0.1:8000/mcp"}}}
    stdio = json.loads(made["mcp_stdio"])["mcpServers"]["paywire"]
    assert stdio["args"] == ["mcp", "--server", "http://127.0.0.1:8000/mcp"]
    assert stdio["env"]["PAYWIRE_PAYER_KEY_FILE"] and "PAYWIRE_SOLANA_RPC_URL" not in stdio["env"]
    devnet = Entry("http://127.0.0.1:8000", "/v1/x", {}, "resource", site=Site(devnet_dir="/srv/pw"))
    assert json.loads(snippets(devnet)["mcp_stdio"])["mcpServers"]["paywire"]["env"] == {
        "PAYWIRE_DATA_DIR": "/srv/pw"}

    model = Entry("http://h", "/v1/chat/completions", {**NASTY_EXAMPLE, "messages": [
        {"role": "user", "content": "'; rm -rf / #"}]}, "model", operation="chat.completions")
    curl = shlex.split(snippets(model)["curl"])
    assert json.loads(curl[-1])["messages"][0]["content"] == "'; rm -rf / #"
    ast.parse(snippets(model)["python"])


def test_every_model_snippet_body_is_a_valid_request(big: LiveServer) -> None:
    """The page's example for each model's first operation passes that operation's own checks."""
    checked = 0
    for skill in big.runtime.gateway.catalogue.of_kind("model"):
        operation = next(iter(skill.operations))
        if operation in FORM_FILE_FIELDS:  # multipart: the file is the user's
            continue
        body = model_example(skill.id, operation, dict(skill.examples[0]) if skill.examples else None)
        skill.validate(body, operation)
        checked += 1
    assert checked > 90


# -- in the browser -------------------------------------------------------------------------------

def _browser() -> Any:
    if not CHROMIUM.exists():
        if os.environ.get("CI") == "true":  # CI must have it: `make test` installs it (`make chromium`)
            raise RuntimeError(f"{CHROMIUM} is missing: `make chromium` installs Debian's chromium")
        pytest.skip(f"{CHROMIUM} is missing: `make chromium` (apt-get install chromium) installs it")
    return pytest.importorskip("playwright.sync_api", reason="pip install -e '.[test]' installs playwright")


def _shell(command: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    """Run a snippet as a user pastes it into bash; its output."""
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}",
                               **(env or {})}, cwd=cwd)
    return done.stdout + done.stderr


def _rendered(page: Any, expected: str) -> None:
    page.wait_for_function("(q) => document.body.dataset.skillsQuery === q", arg=expected)


def test_a_visitor_finds_a_skill_and_pays_for_it(big: LiveServer, tmp_path: Path) -> None:
    sync_api = _browser()
    problems: list[str] = []
    asked: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("request", lambda r: asked.append(r.url) if "/api/marketplace/apis" in r.url else None)
            page.set_default_timeout(15_000)

            started = time.perf_counter()
            page.goto(f"{big.url}/")
            page.wait_for_selector("body[data-loaded=true]")
            first_render = time.perf_counter() - started

            # the first page: 20 skills, each with the price PriceTerms gives
            total = len(big.runtime.gateway.catalogue.of_kind("resource"))
            assert page.locator("#skill-list li.skill").count() == 20
            assert page.text_content("#skills-status") == f"{total} skills, showing 1–20"
            for item in page.locator("#skill-list li.skill").all()[:20]:
                skill_id = item.get_attribute("data-id")
                price = _terms(big, skill_id)["price"]  # type: ignore[arg-type]
                shown = item.locator(".price")
                assert (shown.get_attribute("data-usd"), shown.get_attribute("data-atomic")) == (
                    price["usd"], price["atomic"])
                assert shown.text_content() == f"${price['usd']} per call"
            assert asked and "page=1" in asked[-1] and "page_size=20" in asked[-1]

            # a search, answered by the server: 31 of 3,000, on two pages
            started = time.perf_counter()
            page.fill("#q", NEEDLE)
            page.press("#q", "Enter")
            _rendered(page, f"q={NEEDLE}&page=1&page_size=20")
            search_time = time.perf_counter() - started
            assert f"q={NEEDLE}" in asked[-1]
            found = page.locator("#skill-list li.skill")
            assert found.count() == 20
            assert all(NEEDLE in d for d in found.locator(".description").all_text_contents())
            assert page.text_content("#skills-status") == "31 skills found, showing 1–20"
            assert page.text_content("#page-info") == "page 1 of 2"
            page.click("#next")
            _rendered(page, f"q={NEEDLE}&page=2&page_size=20")
            assert found.count() == 11 and "page=2" in asked[-1]
            assert page.evaluate("location.search") == f"?q={NEEDLE}&page=2"  # a link to this view

            # a category, with the search cleared
            page.fill("#q", "")
            page.press("#q", "Enter")
            _rendered(page, "page=1&page_size=20")
            page.select_option("#category", "Gamma")
            _rendered(page, "category=Gamma&page=1&page_size=20")
            assert "category=Gamma" in asked[-1]
            assert set(found.locator(".tag").all_text_contents()) == {"Gamma"}
            assert page.text_content("#skills-status") == f"{GENERATED // 5} skills found, showing 1–20"

            # the nasty skill: its markup is text, nothing ran
            page.select_option("#category", "")
            page.fill("#q", "nasty")
            page.press("#q", "Enter")
            _rendered(page, "q=nasty&page=1&page_size=20")
            nasty = page.locator(f'li.skill[data-id="{NASTY_ID}"]')
            assert nasty.locator(".description").text_content() == NASTY_DESCRIPTION
            assert nasty.locator("h3").text_content() == "<b>Nasty</b> \"quoted\" name"
            assert page.locator("#skill-list img, #skill-list script, #skill-list b").count() == 0

            # its snippets
            nasty.locator("button.details").click()
            nasty.locator("pre[data-snippet=mcp_stdio]").wait_for()
            snippet = {name: nasty.locator(f"pre[data-snippet={name}]").text_content()
                       for name in ("curl", "pay", "python", "mcp", "mcp_stdio")}
            assert nasty.locator("pre.example").text_content() == json.dumps(NASTY_EXAMPLE, indent=2,
                                                                             ensure_ascii=False)
            assert nasty.locator(".tool code").text_content() == NASTY_ID
            assert page.evaluate("document.body.dataset.pwned") is None

            # a resource this gateway cannot sell (no NANSEN_API_KEY): listed, unavailable, why
            page.fill("#q", "smart-money")
            page.press("#q", "Enter")
            _rendered(page, "q=smart-money&page=1&page_size=20")
            nansen = page.locator("li.skill").first
            assert nansen.get_attribute("data-available") == "false"
            assert nansen.locator(".badge.off").text_content() == "unavailable"
            assert "set NANSEN_API_KEY to enable it" in (nansen.locator(".reason").text_content() or "")

            # the models: availability and price terms
            page.wait_for_selector("body[data-models-loaded=true]")
            models = big.runtime.gateway.catalogue.of_kind("model")
            rows = page.locator("#model-table tr.model")
            assert rows.count() == len(models)
            gpt = page.locator('#model-table tr.model[data-id="gpt-4o"]')
            assert gpt.get_attribute("data-available") == "false"
            assert "needs OPENAI_API_KEY or OPENROUTER_API_KEY" in gpt.inner_text()
            assert "set OPENAI_API_KEY or OPENROUTER_API_KEY to enable it" in (
                gpt.locator(".badge.off").get_attribute("title") or "")
            terms = _terms(big, "gpt-4o", "chat.completions")
            assert gpt.locator(".price").get_attribute("data-min-usd") == terms["min"]["usd"]
            assert gpt.locator(".price").get_attribute("data-max-usd") == terms["max"]["usd"]
            local = [m.id for m in models if m.id.startswith("local/")]
            page.check("#available-only")
            assert rows.count() == len(local) > 0
            assert set(rows.evaluate_all("rows => rows.map(r => r.dataset.id)")) == set(local)
            assert set(rows.locator(".badge").all_text_contents()) == {"available"}
            page.fill("#model-filter", local[0])
            assert rows.count() >= 1
            page.uncheck("#available-only")
            page.fill("#model-filter", "")

            # the links, and the MCP configuration
            hrefs = page.locator("#links a").evaluate_all("links => links.map(a => a.getAttribute('href'))")
            assert {"/.well-known/agent-card.json", "/openapi.json", "/discovery/resources",
                    "/.well-known/x402"} <= set(hrefs)
            assert json.loads(page.text_content('pre[data-snippet="connect-mcp"]')  # type: ignore[arg-type]
                              ) == {"mcpServers": {"paywire": {"type": "http", "url": f"{big.url}/mcp"}}}
            stdio = json.loads(page.text_content('pre[data-snippet="connect-mcp-stdio"]')  # type: ignore[arg-type]
                               )["mcpServers"]["paywire"]
            assert stdio["env"] == {"PAYWIRE_DATA_DIR": str(big.data_dir.resolve())}
            assert page.text_content("#payments-note") == (
                "Devnet payments use test USDC with no value (Base Sepolia and Solana devnet: chains "
                "this gateway runs).")

            page.fill("#q", "token")  # the picture: a search, one skill open
            page.press("#q", "Enter")
            _rendered(page, "q=token&page=1&page_size=20")
            page.locator("li.skill button.details").first.click()
            page.locator("li.skill pre[data-snippet=mcp_stdio]").first.wait_for()
            # nothing overflows sideways at 1280 px, the models table included
            widths = page.evaluate("[document.scrollingElement.scrollWidth, window.innerWidth]")
            assert widths[0] <= widths[1] == 1280, f"the page is {widths[0]} px wide"
            page.locator("#models").screenshot(path=str(artifacts() / "catalogue-page-models.png"))
            page.evaluate("window.scrollTo(0, 0)")
            shot = artifacts() / "catalogue-page.png"
            page.set_viewport_size({"width": 1280, "height": 1700})
            page.screenshot(path=str(shot))
        finally:
            browser.close()
    assert not problems, problems  # no script error, no CSP violation
    assert shot.stat().st_size > 20_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report("catalogue-page", f"{total} resources, {len(models)} models: first render "
                             f"{first_render * 1000:.0f} ms, search ({NEEDLE!r}, 31 found) "
                             f"{search_time * 1000:.0f} ms")

    # the snippets, pasted into a shell: curl answers 402; paywire pay and the Python program pay
    # and the resource receives exactly the example
    assert snippet["curl"].startswith("curl -i -X POST ")
    assert _shell(snippet["curl"]).startswith("HTTP/1.1 402")  # type: ignore[arg-type]
    assert json.loads(snippet["mcp"]) == {"mcpServers": {"paywire": {  # type: ignore[arg-type]
        "type": "http", "url": f"{big.url}/mcp"}}}
    keys = json.loads((big.data_dir / "devnet-keys.json").read_text())
    paid = _shell(f"{snippet['pay']} --json", env={"PAYWIRE_DATA_DIR": str(big.data_dir)})
    result = json.loads(paid[paid.index("{"):])
    assert result["status"] == 200 and result["result"]["echo"] == NASTY_EXAMPLE, paid
    program = tmp_path / "pay.py"
    program.write_text(snippet["python"])  # type: ignore[arg-type]
    ran = _shell(f"python {program}", env={"PAYWIRE_PAYER_KEY": keys["evm_payer"]}, cwd=tmp_path)
    assert ran.startswith("200 ") and "paid on eip155:84532: transaction 0x" in ran, ran
    assert json.loads(ran.split(" ", 1)[1].splitlines()[0])["echo"] == NASTY_EXAMPLE
    assert not Path("/tmp/paywire-pwned").exists()
    settled = [r for r in big.ledger_rows() if r["skill_id"] == NASTY_ID and r["state"] == "settled"]
    assert len(settled) == 2 and {r["amount_atomic"] for r in settled} == {3000}


# -- production, and the MCP configurations as a client runs them ----------------------------------

def _detail(live: LiveServer, skill_id: str) -> dict[str, Any]:
    detail = httpx.get(f"{live.url}/catalogue/skills/{skill_id}")
    assert detail.status_code == 200, detail.text
    return detail.json()  # type: ignore[no-any-return]


def test_production_snippets_pay_from_the_payers_own_key_and_solana_node(
        production: LiveServer, big: LiveServer, tmp_path: Path) -> None:
    """No demo payer and no /devnet/solana on a production gateway (it has neither): the Python
    program takes PAYWIRE_PAYER_KEY and builds Solana payments on PAYWIRE_SOLANA_RPC_URL, the
    payer's own node. Run for real with a Solana key and the devnet's node as "the payer's own"
    (PAYWIRE_URL pointing at the devnet gateway), it pays on Solana."""
    about = httpx.get(f"{production.url}/").json()
    assert about["payments"] == {"devnet": False, "note": "Payments are in USDC on Base and Solana.",
                                 "networks": ["eip155:8453", SOLANA_MAINNET]}
    made = _detail(production, "token-count-508")["snippets"]
    python = made["python"]
    assert "/devnet" not in python and "devnet-keys" not in python
    assert 'KEY = os.environ["PAYWIRE_PAYER_KEY"]' in python
    assert 'SOLANA_RPC = os.environ.get("PAYWIRE_SOLANA_RPC_URL") or None' in python
    stdio = json.loads(made["mcp_stdio"])["mcpServers"]["paywire"]
    assert stdio["args"] == ["mcp", "--server", f"{production.url}/mcp"]
    assert stdio["env"] == {"PAYWIRE_PAYER_KEY_FILE": "/path/to/your/payer-key",
                            "PAYWIRE_SOLANA_RPC_URL": "https://api.mainnet-beta.solana.com",
                            "PAYWIRE_MCP_MAX_PER_CALL": "0.10", "PAYWIRE_MCP_MAX_PER_DAY": "1.00"}
    assert json.loads(about["mcp_config"]["stdio"])["mcpServers"]["paywire"] == stdio
    assert json.loads(made["mcp"])["mcpServers"]["paywire"] == {
        "type": "http", "url": f"{production.url}/mcp"}

    program = tmp_path / "pay.py"
    program.write_text(python)
    keys = json.loads((big.data_dir / "devnet-keys.json").read_text())
    ran = _shell(f"python {program}", cwd=tmp_path, env={
        "PAYWIRE_URL": big.url, "PAYWIRE_PAYER_KEY": keys["sol_payer"],
        "PAYWIRE_SOLANA_RPC_URL": f"{big.url}/devnet/solana"})
    assert ran.startswith("200 ") and f"paid on {SOLANA_DEVNET}: transaction " in ran, ran


async def test_the_mcp_configurations_connect_as_written(big: LiveServer) -> None:
    """The remote form (`"type": "http"`) is reached at its URL; the `paywire mcp` form, started as
    a desktop agent starts it (its command, args and env; `paywire` given its full path, as the
    docs/mcp.md says when it is not on the agent's PATH), pays for a tool from the demo payer its env
    points at."""
    made = _detail(big, "token-count-508")
    remote = json.loads(made["snippets"]["mcp"])["mcpServers"]["paywire"]
    assert remote["type"] == "http"
    async with streamable_http_client(remote["url"]) as (read, write, _):
        async with ClientSession(read, write) as mcp:
            await mcp.initialize()
            assert (await mcp.list_tools()).tools[0].name == "help"

    local = json.loads(made["snippets"]["mcp_stdio"])["mcpServers"]["paywire"]
    assert local["command"] == "paywire" and set(local["env"]) == {"PAYWIRE_DATA_DIR"}
    params = StdioServerParameters(command=str(ROOT / ".venv" / "bin" / "paywire"), args=local["args"],
                                   env=local["env"], cwd=str(Path("/")))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as mcp:
            await mcp.initialize()
            paid = await mcp.call_tool("token-count-508", made["example"])
    text = "\n".join(getattr(c, "text", "") for c in paid.content)
    assert not paid.isError, text
    receipt = (paid.meta or {})["x402/payment-response"]
    assert receipt["success"] is True and receipt["amount"] == "5750"
    [row] = big.ledger_rows(tx_hash=receipt["transaction"])
    assert row["state"] == "settled" and row["skill_id"] == "token-count-508"


def test_the_production_page_names_the_real_networks_and_fits_1280_px(production: LiveServer) -> None:
    sync_api = _browser()
    problems: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
            page.set_default_timeout(15_000)
            page.goto(f"{production.url}/")
            page.wait_for_selector("body[data-loaded=true]")
            page.wait_for_selector("body[data-models-loaded=true]")
            assert page.text_content("footer p") == (
                "Served by paywire. Payments are in USDC on Base and Solana.")
            body = page.inner_text("body")
            assert "test USDC" not in body and "/devnet" not in body and "devnet-keys" not in body
            stdio = json.loads(page.text_content('pre[data-snippet="connect-mcp-stdio"]') or "")
            assert "PAYWIRE_PAYER_KEY_FILE" in stdio["mcpServers"]["paywire"]["env"]
            widths = page.evaluate("[document.scrollingElement.scrollWidth, window.innerWidth]")
            page.screenshot(path=str(artifacts() / "catalogue-page-production.png"))
        finally:
            browser.close()
    assert not problems, problems
    assert widths[0] <= widths[1] == 1280, f"the page is {widths[0]} px wide"
