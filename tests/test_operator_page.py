"""The operator page (GET /admin/, agent/operator/operator_page/) in headless Chromium: Debian's
/usr/bin/chromium driven by Playwright (the python package; no browser download). After real
paid calls, one failure and one pending settlement on a live devnet server, the page asks for the
token, then shows revenue and calls per day (an SVG with a point per day), the margin per skill,
the recent payments with their transactions, the failures and the pending settlements, and
exports the month's revenue. The screenshot is kept in test-artifacts/ (or
$PAYWIRE_TEST_ARTIFACTS)."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.support.live_server import LiveServer
from tests.support.operator_ledger import (
    BODY,
    CHANNEL_TOKEN,
    FAILURE,
    PENDING_TX,
    SKILL,
    add_channels,
    add_failure_and_pending,
    admin_token,
    pay_calls,
    start_admin_server,
)
from tests.support.paying import EVM_NET, SOL_NET, client_for, header, post_paid, quote, receipt, sign

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
ROOT = Path(__file__).resolve().parent.parent
TOKEN = admin_token()

if not CHROMIUM.exists():
    if os.environ.get("CI") == "true":  # CI must have it: `make test` installs it (`make chromium`)
        raise RuntimeError(f"{CHROMIUM} is missing: `make chromium` installs Debian's chromium")
    pytest.skip(f"{CHROMIUM} is missing: `make chromium` (apt-get install chromium) installs it",
                allow_module_level=True)

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[test]' installs playwright")


def artifacts() -> Path:
    folder = Path(os.environ.get("PAYWIRE_TEST_ARTIFACTS") or ROOT / "test-artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, list[str]]]:
    live = start_admin_server(tmp_path_factory.mktemp("operator-page"), TOKEN)
    try:
        transactions = pay_calls(live, 3)
        add_failure_and_pending(live)
        yield live, transactions
    finally:
        live.stop()


def test_the_operator_watches_revenue_and_failures(watched: tuple[LiveServer, list[str]],
                                                   tmp_path: Path) -> None:
    live, transactions = watched
    problems: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1200, "height": 1000},
                                          accept_downloads=True)
            page = context.new_page()
            page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.set_default_timeout(15_000)
            page.goto(f"{live.url}/admin/")

            # the shell asks for the token and shows nothing else
            assert page.locator("#token").is_visible() and page.locator("#board").is_hidden()
            page.fill("#token", "0" * 48)
            page.click("#login button[type=submit]")
            page.wait_for_function("document.getElementById('login-error').textContent.length > 0")
            assert "refused" in page.text_content("#login-error")  # type: ignore[operator]
            problems.clear()  # the browser logs the refused requests' 401s as errors
            page.fill("#token", TOKEN)
            page.click("#login button[type=submit]")
            page.wait_for_selector("body[data-loaded=true]")
            assert page.locator("#login").is_hidden() and page.locator("#board").is_visible()
            assert page.evaluate("sessionStorage.getItem('paywire.adminToken')") == TOKEN
            assert TOKEN not in page.content()

            # revenue and calls over time: a bar and a point per day, today's with the calls
            today = datetime.now(UTC).strftime("%Y-%m-%d")
            points = page.locator("#chart svg circle.point")
            assert points.count() >= 30
            assert page.get_attribute(f'#chart circle.point[data-day="{today}"]', "data-calls") == "3"
            assert page.get_attribute(f'#chart rect.bar[data-day="{today}"]',
                                      "data-revenue") == "0.01725"
            assert float(page.get_attribute(f'#chart rect.bar[data-day="{today}"]', "height")) > 100  # type: ignore[arg-type]

            cards = page.text_content("#cards") or ""
            assert "$0.01725" in cards and "failures (24 h)1" in cards.replace(" ", " ")
            margin = page.inner_text("#margin")
            assert SKILL in margin and "$0.01725" in margin
            payments = page.inner_text("#payments")
            for tx in transactions:
                assert tx in payments
            failures = page.inner_text("#failures")
            assert FAILURE in failures and "$0.0042" in failures  # the markup shown as text
            assert page.locator("#failures script").count() == 0
            pending = page.inner_text("#pending")
            assert PENDING_TX in pending and "facilitator timed out" in pending

            # the month's revenue, exported from the page
            with page.expect_download() as download:
                page.click("#export")
            month = datetime.now(UTC).strftime("%Y-%m")
            assert download.value.suggested_filename == f"revenue-{month}.csv"
            exported = tmp_path / "revenue.csv"
            download.value.save_as(exported)
            rows = list(csv.DictReader(io.StringIO(exported.read_text())))
            assert rows[-1]["skill"] == "(total)" and rows[-1]["revenue_usd"] == "0.01725"

            shot = artifacts() / "operator-page.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert not problems, problems  # no script error, no CSP violation
    assert shot.exists() and shot.stat().st_size > 20_000
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _pay_on_solana(live: LiveServer) -> str:
    """One paid call on the devnet's Solana: its transaction, an 86-88 character signature."""
    url = f"{live.url}/v1/marketplace/api/{SKILL}"
    _, required = quote(url, BODY)
    client = client_for(live.url, sol_key=live.devnet.keys.sol_payer)
    paid = post_paid(url, BODY, header(sign(client, required, SOL_NET)))
    assert paid.status_code == 200, paid.text
    return str(receipt(paid)["transaction"])


def test_the_board_fits_a_1280_px_window_with_a_solana_signature(
        watched: tuple[LiveServer, list[str]]) -> None:
    """A Solana signature and network id are long: the page does not overflow sideways at a
    1280 px window; the cells are clipped with the whole value in their title (and their text)."""
    live, _ = watched
    signature = _pay_on_solana(live)
    assert len(signature) >= 86
    problems: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
            page.set_default_timeout(15_000)
            page.goto(f"{live.url}/admin/")
            page.fill("#token", TOKEN)
            page.click("#login button[type=submit]")
            page.wait_for_selector("body[data-loaded=true]")
            cell = page.locator("#payments td.mono", has_text=signature)
            assert cell.count() == 1 and cell.text_content() == signature
            assert cell.get_attribute("title") == signature
            network = page.locator("#payments td", has_text=SOL_NET).first
            assert network.get_attribute("title") == SOL_NET
            widths = page.evaluate("[document.scrollingElement.scrollWidth, window.innerWidth]")
            shot = artifacts() / "operator-page-1280.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert not problems, problems
    assert widths[0] <= widths[1], f"the page is {widths[0]} px wide in a {widths[1]} px window"


def test_the_operator_sees_the_channels_and_what_is_not_claimed_yet(
        watched: tuple[LiveServer, list[str]]) -> None:
    """Channels in the server's ledger (a deposit with calls and a claim, a withdrawal, an empty
    one): their totals and the channels with the most unclaimed first, ids shortened with the
    whole id in the title, still within a 1280 px window."""
    live, _ = watched
    written = add_channels(live)
    problems: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
            page.set_default_timeout(15_000)
            page.goto(f"{live.url}/admin/")
            page.fill("#token", TOKEN)
            page.click("#login button[type=submit]")
            page.wait_for_selector("body[data-loaded=true]")
            heads = page.eval_on_selector_all("#channel-totals th", "cells => cells.map(c => c.textContent)")
            assert heads == ["network", "token", "channels", "balance", "charged", "claimed",
                             "unclaimed", "escrow", "next claim (UTC)", "oldest read"]
            [totals] = page.eval_on_selector_all(
                "#channel-totals tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))")
            assert totals[:8] == [EVM_NET, CHANNEL_TOKEN[:6] + "…" + CHANNEL_TOKEN[-4:],
                                  "1 open, 1 closing, 1 closed", "$1.05", "$0.02875", "$0.00575",
                                  "$0.023", "$1.02125"]
            assert totals[8].startswith(datetime.now(UTC).strftime("%Y-%m-%d"))
            assert totals[9].endswith(" ago")
            rows = page.eval_on_selector_all(
                "#channels tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))")
            assert [row[2:7] for row in rows] == [
                ["open", "$1", "$0.023", "$0.00575", "$0.01725"],
                ["closing", "$0.05", "$0.00575", "$0", "$0.00575"],
                ["closed", "$0", "$0", "$0", "$0"]]
            assert rows[2][7] == "-"  # nothing to claim: no next claim
            first = page.locator("#channels tbody tr").first.locator("td").first
            assert first.text_content() == written.busy[:6] + "…" + written.busy[-4:]
            assert first.get_attribute("title") == written.busy
            widths = page.evaluate("[document.scrollingElement.scrollWidth, window.innerWidth]")
            board = page.evaluate("[document.getElementById('channel-totals').offsetWidth, "
                                  "document.getElementById('board').offsetWidth]")
            page.screenshot(path=str(artifacts() / "operator-page-channels.png"), full_page=True)
        finally:
            browser.close()
    assert not problems, problems
    assert widths[0] <= widths[1], f"the page is {widths[0]} px wide in a {widths[1]} px window"
    assert board[0] <= board[1], f"the channel totals are {board[0]} px wide on a {board[1]} px board"
