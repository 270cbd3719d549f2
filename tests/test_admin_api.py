"""The operator API (agent/operator/admin.py): absent unless PAYWIRE_ADMIN_TOKEN is set, every route behind
the bearer token, parameters checked, and the same figures as `paywire ledger` after real paid
calls on a live devnet server."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from agent.cli.main import main
from agent.settings import ConfigError, Settings
from tests.support.live_server import LiveServer
from tests.support.operator_ledger import (
    CHANNEL_TOKEN,
    FAILURE,
    PENDING_TX,
    SKILL,
    Watched,
    add_channels,
    add_failure_and_pending,
    admin_token,
    pay_calls,
    start_admin_server,
)
from tests.support.paying import EVM_NET

TOKEN = admin_token()


@pytest.fixture(scope="module")
def operated(tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[LiveServer, list[str], Watched]]:
    live = start_admin_server(tmp_path_factory.mktemp("admin"), TOKEN)
    try:
        transactions = pay_calls(live, 3)
        yield live, transactions, add_failure_and_pending(live)
    finally:
        live.stop()


def get(live: LiveServer, path: str, token: str | None = TOKEN, **params: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return httpx.get(f"{live.url}/admin{path}", params=params, headers=headers, timeout=30)


def cli(capsys: pytest.CaptureFixture[str], live: LiveServer, *args: str) -> str:
    assert main(["ledger", *args, "--data-dir", str(live.data_dir)]) == 0
    return capsys.readouterr().out


def test_nothing_under_admin_without_a_token(server: LiveServer) -> None:
    """The session's default server: no PAYWIRE_ADMIN_TOKEN, no operator API nor page."""
    for path in ("/admin/summary", "/admin/", "/admin", "/admin/revenue.csv"):
        answer = httpx.get(server.url + path, headers={"Authorization": "Bearer " + TOKEN}, timeout=30)
        assert answer.status_code == 404, path
        assert answer.json()["error"]["code"] == "not_found"


def test_every_route_needs_the_token(operated: tuple[LiveServer, list[str], Watched]) -> None:
    live, _, _ = operated
    routes = ["/summary", "/revenue", "/revenue.csv", "/payments", "/payments.csv", "/pending",
              "/failures", "/skills/disabled", "/no-such-route"]
    wrong = "f" * len(TOKEN)  # the same length: only the digests' comparison tells them apart
    for path in routes:
        for token, code in ((None, "missing_token"), (wrong, "invalid_token")):
            answer = get(live, path, token=token)
            assert answer.status_code == 401, (path, token)
            assert answer.headers["WWW-Authenticate"] == "Bearer"
            error = answer.json()["error"]
            assert error["code"] == code and error["param"] == "Authorization"
            assert "Authorization: Bearer" in error["message"] or "PAYWIRE_ADMIN_TOKEN" in error["message"]
            assert TOKEN not in answer.text and wrong not in answer.text
    basic = httpx.get(f"{live.url}/admin/summary", headers={"Authorization": f"Basic {TOKEN}"})
    assert basic.status_code == 401 and basic.json()["error"]["code"] == "missing_token"
    prefixed = httpx.get(f"{live.url}/admin/summary", headers={"Authorization": f"Bearer {TOKEN}x"})
    assert prefixed.status_code == 401
    ok = get(live, "/summary")
    assert ok.status_code == 200 and ok.headers["Cache-Control"] == "no-store"
    assert get(live, "/no-such-route").status_code == 404  # known token: an ordinary 404

    # the page's static shell needs no token and holds no figure and no token
    page = httpx.get(f"{live.url}/admin/", timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]
    assert page.headers["Cache-Control"] == "no-store"
    assert TOKEN not in page.text and "0.00575" not in page.text and SKILL not in page.text
    script = httpx.get(f"{live.url}/admin/app.js", timeout=30)
    assert script.status_code == 200 and "innerHTML" not in script.text
    assert httpx.get(f"{live.url}/admin", timeout=30, follow_redirects=True).url.path == "/admin/"


def test_the_figures_are_the_clis(operated: tuple[LiveServer, list[str], Watched],
                                  capsys: pytest.CaptureFixture[str]) -> None:
    live, transactions, watched = operated
    revenue = get(live, "/revenue", by="skill,network").json()
    assert revenue == json.loads(cli(capsys, live, "revenue", "--by", "skill,network",
                                     "--format", "json"))
    paid = next(line for line in revenue["lines"] if line["skill"] == SKILL)
    assert paid["calls"] == 3 and paid["revenue_atomic"] == 3 * 5750 and paid["revenue_usd"] == "0.01725"
    assert paid["pending_calls"] == 1 and paid["pending_atomic"] == 5750
    failed = next(line for line in revenue["lines"] if line["failed_calls"])
    assert failed["unbilled_cost_usd"] == "0.0042" and failed["calls"] == 0
    assert revenue["total"]["margin_usd"] == str(
        Decimal("0.01725") - Decimal(revenue["total"]["upstream_cost_usd"]) - Decimal("0.0042"))

    by_day = get(live, "/revenue.csv", by="skill,network,day")
    assert by_day.headers["content-type"].startswith("text/csv")
    assert by_day.headers["Content-Disposition"] == 'attachment; filename="revenue.csv"'
    assert by_day.text == cli(capsys, live, "revenue", "--by", "skill,network,day", "--format", "csv")
    assert list(csv.DictReader(io.StringIO(by_day.text)))[-1]["revenue_usd"] == "0.01725"

    page = get(live, "/payments", limit="3").json()
    rest = get(live, "/payments", limit="3", after=page["next"]).json()
    listed = page["payments"] + rest["payments"]
    assert rest["next"] is None and len(listed) == 5
    assert listed == json.loads(cli(capsys, live, "payments", "--format", "json"))["payments"]
    assert {p["tx_hash"] for p in listed if p["state"] == "settled"} == set(transactions)
    [mine] = get(live, "/payments", tx=transactions[0]).json()["payments"]
    assert mine["amount_usd"] == "0.00575" and mine["skill"] == SKILL
    export = get(live, "/payments.csv", state="settled")
    assert export.text == cli(capsys, live, "payments", "--state", "settled", "--all", "--format", "csv")
    assert len(list(csv.DictReader(io.StringIO(export.text)))) == 3

    summary = get(live, "/summary").json()
    assert summary["totals"]["revenue_usd"] == "0.01725" and summary["totals"]["calls"] == 3
    assert summary["failures_24h"] == 1 and summary["pending"] == {
        "count": 1, "stuck": 0, "oldest_age_seconds": summary["pending"]["oldest_age_seconds"]}
    assert summary["by_state"]["settled"] == 3 and summary["by_state"]["released"] == 1
    [pending] = get(live, "/pending").json()["pending"]
    assert pending["id"] == watched.pending_row and pending["tx_hash"] == PENDING_TX
    assert pending["stuck"] is False and pending["lease_left_seconds"] > 3000
    [failure] = get(live, "/failures").json()["failures"]
    assert failure["id"] == watched.failed_row and failure["error"] == FAILURE
    assert failure["upstream_cost_usd"] == "0.0042"
    month = get(live, "/revenue.csv", month="2026-11", by="skill")
    assert month.headers["Content-Disposition"] == 'attachment; filename="revenue-2026-11.csv"'


@pytest.mark.parametrize(("path", "params", "param"), [
    ("/revenue", {"by": "week"}, "by"),
    ("/revenue", {"since": "yesterday"}, "since"),
    ("/revenue", {"since": "2026-11-02", "until": "2026-11-01"}, "until"),
    ("/revenue", {"month": "2026-13"}, "month"),
    ("/revenue", {"group": "skill"}, "group"),
    ("/payments", {"limit": "0"}, "limit"),
    ("/payments", {"limit": "1001"}, "limit"),
    ("/payments", {"after": "bm90IGEgY3Vyc29y"}, "after"),
    ("/payments", {"state": "paid"}, "state"),
    ("/payments", {"order": "random"}, "order"),
    ("/payments", {"skill": "x" * 201}, "skill"),
    ("/summary", {"days": "400"}, "days"),
    ("/failures", {"limit": "-1"}, "limit"),
])
def test_parameters_are_checked_and_named(operated: tuple[LiveServer, list[str], Watched], path: str,
                                          params: dict[str, str], param: str) -> None:
    live, _, _ = operated
    answer = get(live, path, **params)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and param in error["message"]


def test_a_repeated_parameter_is_refused(operated: tuple[LiveServer, list[str], Watched]) -> None:
    live, _, _ = operated
    answer = httpx.get(f"{live.url}/admin/payments?state=settled&state=pending",
                       headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "state"


def test_a_short_token_stops_startup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    short = "s" * 31
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"PAYWIRE_ADMIN_TOKEN": short})
    assert "PAYWIRE_ADMIN_TOKEN" in str(caught.value) and "32" in str(caught.value)
    assert short not in str(caught.value)
    monkeypatch.setenv("PAYWIRE_ADMIN_TOKEN", short)
    monkeypatch.setenv("PAYWIRE_DATA_DIR", str(tmp_path))
    assert main(["serve", "--port", "1"]) == 2  # refused before anything listens
    err = capsys.readouterr().err
    assert "PAYWIRE_ADMIN_TOKEN must be a token of 32 to 256" in err and short not in err


def test_the_channels_are_the_clis(operated: tuple[LiveServer, list[str], Watched],
                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Channels written into the server's ledger as the gateway writes them: /admin/channels
    gives their totals and the channels with the most unclaimed first, as `paywire ledger` does."""
    live, _, _ = operated
    written = add_channels(live)
    assert get(live, "/channels", token=None).status_code == 401
    report = get(live, "/channels").json()
    [totals] = report["totals"]
    assert (totals["network"], totals["token"], totals["channels"], totals["by_state"]) == (
        EVM_NET, CHANNEL_TOKEN, 3, {"open": 1, "closing": 1, "quarantined": 0, "closed": 1})
    assert [totals[f"{name}_atomic"] for name in ("balance", "charged", "claimed", "unclaimed",
                                                  "escrow")] == [
        written.balance, written.charged, written.claimed, written.unclaimed, written.escrow]
    assert (totals["unclaimed_usd"], totals["escrow_usd"]) == ("0.023", "1.02125")
    assert totals["next_claim_at"] is not None and totals["oldest_sync_at"] is not None
    assert [(c["channel_id"], c["state"], c["unclaimed_atomic"]) for c in report["channels"]] == [
        (written.busy, "open", 17_250), (written.leaving, "closing", 5_750),
        (written.empty, "closed", 0)]
    assert json.loads(cli(capsys, live, "--json"))["channels"] == report
    assert [c["channel_id"] for c in get(live, "/channels", limit="1").json()["channels"]] == [
        written.busy]
    assert get(live, "/channels", limit="0").json()["channels"] == []
    for wrong in ("1001", "-1", "many"):
        answer = get(live, "/channels", limit=wrong)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "limit"

    text = cli(capsys, live)
    assert f"  {EVM_NET} {CHANNEL_TOKEN}: 3 channels (1 open, 1 closing, 1 closed)" in text
    assert ("    balance 1050000  charged 28750  claimed 5750  unclaimed 23000  escrow 1021250"
            in text)
    busy = next(line for line in text.splitlines() if line.strip().startswith(written.busy))
    assert busy.split()[2:7] == ["open", "1000000", "23000", "5750", "17250"]
