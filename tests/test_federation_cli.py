"""`paywire federation add | list | remove | refresh | report` run in process (agent.cli.main) on a
SQLite data folder, checked against what the ledger holds; wrong options refused with exit code 2
and a line naming the option; `paywire ledger` gains a per-seller federation section once an
upstream seller was paid."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import TypeVar

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from agent.cli.main import main
from federation.model import Filters, Margin, Source, source_id_for
from federation.store import REFRESH_TURN, FederationStore, StoredAnswer
from payments.ledger import Ledger
from tests.test_federation_store import SELLER_A, SELLER_B, caller_row, imported, new_intent, offer, opened

T = TypeVar("T")
CATALOGUE = "https://facilitator.example/discovery/resources"
SELLER_URL = "http://127.0.0.1:9999/v1/marketplace/api/thing"


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("PAYWIRE_DATABASE_URL", "PAYWIRE_DATABASE_URL_FILE", "PAYWIRE_FEDERATE",
                 "PAYWIRE_FEDERATION_MARGIN_PERCENT", "PAYWIRE_FEDERATION_MARGIN_USD"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "pw"


def on_store(data_dir: Path, work: Callable[[FederationStore], Awaitable[T]]) -> T:
    """`work(store)` on the data folder's ledger, as a running gateway would see it."""
    async def run() -> T:
        engine = create_async_engine(f"sqlite+aiosqlite:///{(data_dir / 'paywire.db').resolve()}")
        ledger = Ledger(engine)
        try:
            return await work(FederationStore(ledger))
        finally:
            ledger.close()
            await engine.dispose()

    return asyncio.run(run())


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_add_list_and_remove_sources(data_dir: Path, capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    where = ("--data-dir", str(data_dir))
    monkeypatch.setenv("PAYWIRE_FEDERATION_MARGIN_PERCENT", "7")
    code, out, _ = cli(capsys, "federation", "add", CATALOGUE, "--category", "Data",
                       "--category", "AI", "--keyword", "Weather", "--network", "base-sepolia",
                       "--network", "solana-devnet", "--max-upstream-usd", "0.05",
                       "--allow-seller", "a.example", "--deny-seller", SELLER_B,
                       "--margin-usd", "$0.001", *where)
    catalogue_id = source_id_for(CATALOGUE)
    assert code == 0 and out.startswith(f"{catalogue_id}: added (catalogue {CATALOGUE}")
    code, out, _ = cli(capsys, "federation", "add", SELLER_URL, "--seller", "--margin-percent",
                       "0", *where)
    assert code == 0 and "added (seller" in out

    catalogue, seller = on_store(data_dir, lambda store: store.sources())
    assert catalogue == Source(
        catalogue_id, CATALOGUE, "catalogue",
        Filters(frozenset({"data", "ai"}), ("weather",),
                frozenset({"eip155:84532", "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1"}),
                Decimal("0.05"), frozenset({"a.example"}), frozenset({SELLER_B})),
        Margin(Decimal(7), Decimal("0.001")), origin="cli")  # the percent from the setting
    assert seller == Source(source_id_for(SELLER_URL), SELLER_URL, "seller", Filters(),
                            Margin(Decimal(0), Decimal(0)), origin="cli")

    # the same URL again replaces its filters and margin
    code, out, _ = cli(capsys, "federation", "add", CATALOGUE, "--margin-percent", "12.5", *where)
    assert code == 0 and out.startswith(f"{catalogue_id}: replaced")
    catalogue = on_store(data_dir, lambda store: store.sources())[0]
    assert (catalogue.filters, catalogue.margin) == (Filters(), Margin(Decimal("12.5"), Decimal(0)))

    # what a gateway's refresh leaves is listed: the count held now, the last refresh
    resources = [imported(catalogue_id, offer(path, 20_000), catalogue.margin)
                 for path in ("/a", "/b")]

    async def refreshed(store: FederationStore) -> None:
        await store.replace_resources(catalogue_id, resources)
        await store.note_refresh(catalogue_id, ok=True, detail="1 item skipped: no USDC", count=2)
        await store.note_refresh(seller.id, ok=False, detail="connection refused", count=0)

    on_store(data_dir, refreshed)
    code, out, _ = cli(capsys, "federation", "list", *where)
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith(f"{catalogue_id}  catalogue  {CATALOGUE}  (origin cli; "
                                             "margin 12.5% + 0 USD)")
    assert "imported: 2 resources; last refresh: " in lines[1]
    assert lines[1].endswith("ok, 2 offers imported (1 item skipped: no USDC)")
    assert lines[3].endswith("FAILED: connection refused") and "imported: 0 resources" in lines[3]

    code, out, _ = cli(capsys, "federation", "list", "--resources", *where)
    rows = out.splitlines()[1:]
    assert code == 0 and len(rows) == 2
    for row, resource in zip(rows, sorted(resources, key=lambda r: r.resource_id), strict=True):
        # upstream 0.02, sold at 0.02 x 1.125 = 0.0225
        assert row.split()[:4] == [resource.resource_id, catalogue_id, "0.02", "0.0225"]
        assert row.endswith(f"POST {resource.offer.url}")

    # removed by URL, then by id; its resources go with it
    code, out, _ = cli(capsys, "federation", "remove", CATALOGUE, *where)
    assert code == 0 and out.startswith(f"{catalogue_id}: removed")
    assert on_store(data_dir, lambda store: store.resources()) == []
    code, _, _ = cli(capsys, "federation", "remove", seller.id, *where)
    assert code == 0 and on_store(data_dir, lambda store: store.sources()) == []
    code, out, _ = cli(capsys, "federation", "list", *where)
    assert out.startswith("no source")
    code, _, err = cli(capsys, "federation", "remove", seller.id, *where)
    assert code == 2 and err.startswith(f"paywire federation remove: SOURCE_ID|URL: no source '{seller.id}'")


@pytest.mark.parametrize(("argv", "message"), [
    (["ftp://files.example/list"], "URL: 'ftp://files.example/list' is not an http:// or https:// URL"),
    (["https://"], "URL: 'https://' is not an http:// or https:// URL"),
    ([CATALOGUE, "--network", "base", "--network", "dogecoin"], "--network: unknown network 'dogecoin'"),
    ([CATALOGUE, "--margin-percent", "ten"], "--margin-percent: a decimal number from 0 to 1000"),
    ([CATALOGUE, "--margin-percent", "1000.5"], "--margin-percent: a decimal number from 0 to 1000"),
    ([CATALOGUE, "--margin-percent", "NaN"], "--margin-percent: a decimal number from 0 to 1000"),
    ([CATALOGUE, "--margin-usd", "-0.01"], "--margin-usd: a decimal number from 0 to 1000"),
    ([CATALOGUE, "--max-upstream-usd", "0"], "--max-upstream-usd: a decimal number above 0"),
    ([CATALOGUE, "--max-upstream-usd", "Infinity"], "--max-upstream-usd: a decimal number above 0"),
])
def test_wrong_options_are_refused_naming_the_option(
        data_dir: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    code, out, err = cli(capsys, "federation", "add", *argv, "--data-dir", str(data_dir))
    assert code == 2 and out == ""
    assert err.startswith(f"paywire federation add: {message}") and err.count("\n") == 1
    assert not (data_dir / "paywire.db").exists()  # refused before the database


def test_a_wrong_setting_is_a_configuration_error(data_dir: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAYWIRE_FEDERATION_MARGIN_PERCENT", "2000")
    code, _, err = cli(capsys, "federation", "add", CATALOGUE, "--data-dir", str(data_dir))
    assert code == 2 and "configuration error" in err and "PAYWIRE_FEDERATION_MARGIN_PERCENT" in err


def test_refresh_ends_the_refresh_turn(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    where = ("--data-dir", str(data_dir))
    code, out, _ = cli(capsys, "federation", "refresh", *where)
    assert code == 0 and out.startswith("no gateway has refreshed yet")
    # a gateway refreshed a moment ago: the turn is its own for the period
    assert on_store(data_dir, lambda s: s.ledger.take_turn(REFRESH_TURN, owner="gw-1", seconds=3600))
    assert not on_store(data_dir, lambda s: s.ledger.take_turn(REFRESH_TURN, owner="gw-2",
                                                               seconds=3600))
    code, out, _ = cli(capsys, "federation", "refresh", *where)
    assert code == 0 and out.startswith("refresh requested") and "within 2 s" in out
    # ... so the next replica to poll the turn takes it, and refreshes
    assert on_store(data_dir, lambda s: s.ledger.take_turn(REFRESH_TURN, owner="gw-2", seconds=3600))


async def _activity(store: FederationStore) -> None:
    """Seller A: two calls paid 0.010001, charged 0.011 each; one lost 0.02. Seller B: one call
    paid 0.25 whose caller was not charged (released); an open intent."""
    answer = StoredAnswer(200, "application/json", b"{}")
    for _ in range(2):
        row = await caller_row(store, amount=11_000, outcome="settled")
        intent = await opened(store, new_intent("0.010001", seller=SELLER_A, caller_row=row))
        await store.mark_paid(intent.id, tx_hash=None, answer=answer)
    lost = await opened(store, new_intent("0.02", seller=SELLER_A))
    await store.mark_signed(lost.id, payload="{}", chain_ref={}, valid_before=datetime.now(UTC))
    await store.mark_lost(lost.id, "moved, no answer", tx_hash=None)
    row = await caller_row(store, amount=300_000, outcome="released")
    intent = await opened(store, new_intent("0.25", seller=SELLER_B, caller_row=row))
    await store.mark_paid(intent.id, tx_hash=None, answer=answer)
    await opened(store, new_intent("0.1", seller=SELLER_B))


def _figures(line: str) -> list[str]:
    return line.split()


def test_report_and_the_ledger_report_show_each_seller(
        data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    where = ("--data-dir", str(data_dir))
    code, out, _ = cli(capsys, "federation", "report", *where)
    assert code == 0 and out.strip() == "no upstream seller was paid yet"
    code, out, _ = cli(capsys, "ledger", *where)
    assert code == 0 and "federation" not in out  # no federation activity: no section
    code, out, _ = cli(capsys, "ledger", "--json", *where)
    assert json.loads(out)["federation"] == {"by_seller": []}

    async def seeded(store: FederationStore) -> None:
        await store.ledger.create_tables()
        await _activity(store)

    on_store(data_dir, seeded)
    expected = {  # seller: calls, paid out, earned, lost, lost calls
        SELLER_A: ["2", "0.020002", "0.001998", "0.02", "1"],
        SELLER_B: ["1", "0.25", "0", "0", "0"],
        "(total)": ["3", "0.270002", "0.001998", "0.02", "1"]}
    code, out, _ = cli(capsys, "federation", "report", *where)
    assert code == 0
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:]}
    assert rows == expected

    code, out, _ = cli(capsys, "federation", "report", "--json", *where)
    assert json.loads(out)["by_seller"] == [
        {"seller": SELLER_A, "paid_out_usd": "0.020002", "earned_usd": "0.001998",
         "lost_usd": "0.02", "calls": 2, "lost_calls": 1},
        {"seller": SELLER_B, "paid_out_usd": "0.25", "earned_usd": "0", "lost_usd": "0",
         "calls": 1, "lost_calls": 0}]

    code, out, _ = cli(capsys, "ledger", *where)
    assert code == 0
    section = out[out.index("federation, per upstream seller"):].splitlines()
    assert {line.split()[0]: line.split()[1:] for line in section[2:5]} == expected
    code, out, _ = cli(capsys, "ledger", "--json", *where)
    assert [s["earned_usd"] for s in json.loads(out)["federation"]["by_seller"]] == ["0.001998", "0"]
