"""token-attention-report against stand-ins of its five providers on loopback: paid on the devnet
with every section checked for substance, partial reports still charged, a report with no
section not charged, input refused before any quote, no price-direction wording anywhere,
lookups concurrent (a barrier only five simultaneous requests open), and timeouts and the
overall deadline turning slow lookups into missing sections."""

from __future__ import annotations

import asyncio
import math
import re
import statistics
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import unquote

import httpx
import pytest

from skills.errors import SkillInputError, SkillUnavailableError
from skills.resource_context import ResourceContext
from skills.resources import attention_report
from skills.resources.attention_metrics import (
    directional_terms,
    interest_trend,
    realized_volatility,
    volatility_figures,
)
from tests.support.attention_upstreams import (
    DIRECTIONAL_HEADLINES,
    NEUTRAL_HEADLINES,
    PRICES,
    TOPIC,
    VIEWS_PREVIOUS,
    VIEWS_RECENT,
    X_DAILY_COUNTS,
    AttentionUpstreams,
)
from tests.support.live_server import LiveServer, start_server
from tests.support.paying import EVM_NET, client_for, header, post_paid, quote, receipt, sign

RESOURCE = "token-attention-report"
PRICE = 57500  # $0.0575 in atomic USDC
SECTIONS = ("news", "sentiment", "volatility", "interest", "mentions")
BODY = {"ticker": "BTC"}

# The test's own list of what the report must never say (the handler has a wider one).
FORBIDDEN = re.compile(
    r"\b(buy|buying|sell|selling|bull|bulls|bullish|bear|bears|bearish|target|targets|"
    r"price target|forecast|forecasts|predict|predicts|prediction|predictions|outlook|"
    r"should|recommend|recommended|recommendation|upside|downside|moon|pump|dump|rally|"
    r"will rise|will fall|will reach|going to)\b",
    re.IGNORECASE,
)


@pytest.fixture(scope="module")
def upstreams() -> Iterator[AttentionUpstreams]:
    fake = AttentionUpstreams().start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def gateway(upstreams: AttentionUpstreams,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = start_server(tmp_path_factory.mktemp("attention"), env=upstreams.env())
    yield live
    live.stop()


@pytest.fixture(autouse=True)
def _reset(upstreams: AttentionUpstreams) -> Iterator[None]:
    upstreams.reset()
    yield
    upstreams.reset()  # lets go of any request a test left hanging


def _url(gateway: LiveServer) -> str:
    return f"{gateway.url}/v1/marketplace/api/{RESOURCE}"


def _pay(gateway: LiveServer, body: dict[str, Any]) -> httpx.Response:
    _, required = quote(_url(gateway), body)
    assert {a.amount for a in required.accepts} == {str(PRICE)}
    client = client_for(gateway.url, evm_key=gateway.devnet.keys.evm_payer)
    return post_paid(_url(gateway), body, header(sign(client, required, EVM_NET)))


def _report(env: dict[str, str], payload: dict[str, Any]) -> dict[str, Any]:
    """The handler run in-process, as the gateway runs it, against the stand-ins."""
    async def go() -> dict[str, Any]:
        context = ResourceContext(environ=env)
        try:
            return await attention_report.run(payload, context)
        finally:
            await context.aclose()

    return asyncio.run(go())


def _texts(value: Any) -> Iterator[str]:
    """Every string in a JSON document, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _texts(item)
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)


def _assert_neutral(report: dict[str, Any]) -> None:
    offending = [t for t in _texts(report) if FORBIDDEN.search(t)]
    assert not offending, offending


def _expected_volatility(prices: list[float]) -> float:
    returns = [math.log(b / a) for a, b in zip(prices, prices[1:], strict=False)]
    return round(statistics.stdev(returns) * math.sqrt(365), 4)


def _missing(report: dict[str, Any]) -> dict[str, str]:
    return {m["section"]: m["reason"] for m in report["missing"]}


# ---------------------------------------------------------------- pure computations

def test_realized_volatility_matches_hand_computed_values() -> None:
    # Daily log returns alternate +0.01, -0.01 over 30 days (the first is +0.01).
    prices = [100.0]
    for i in range(30):
        prices.append(prices[-1] * math.exp(0.01 if i % 2 == 0 else -0.01))
    # 30 returns, mean 0: sample variance 30 * 0.0001 / 29; annualized
    # 0.01 * sqrt(30/29) * sqrt(365) = 0.01 * sqrt(377.5862) = 0.194316.
    assert realized_volatility(prices, 30) == pytest.approx(0.194316, abs=1e-6)
    # The last 7 returns are -,+,-,+,-,+,-: mean -0.01/7, deviations 0.08/7 (x3) and -0.06/7
    # (x4); sample variance (3 * 0.0064 + 4 * 0.0036) / 49 / 6 = 0.0336 / 294 = 1.142857e-4;
    # stdev 0.01069045 times sqrt(365) = 19.1049732 gives 0.2042408.
    assert realized_volatility(prices, 7) == pytest.approx(0.2042408, abs=1e-6)
    figures = volatility_figures(prices)
    assert figures["7d"] == {"annualized": 0.2042, "annualized_percent": 20.42, "daily_returns": 7}
    assert figures["30d"] == {"annualized": 0.1943, "annualized_percent": 19.43,
                              "daily_returns": 30}
    # Too short a history is not stretched over the window.
    assert volatility_figures(prices[:10])["30d"]["annualized"] is None


def test_interest_trend_compares_the_window_with_the_one_before() -> None:
    trend = interest_trend([1000] * 7 + [1500] * 7, 7)
    assert trend["change_percent"] == 50.0 and trend["label"] == "increasing"
    assert trend["recent_total_views"] == 10500 and trend["previous_mean_daily_views"] == 1000.0
    assert interest_trend([100] * 4 + [95] * 4, 4)["label"] == "stable"
    assert interest_trend([100] * 3 + [80] * 3, 3)["change_percent"] == -20.0
    assert interest_trend([100] * 3 + [80] * 3, 3)["label"] == "decreasing"
    assert interest_trend([5, 6], 7)["label"] is None  # nothing earlier to compare with


@pytest.mark.parametrize(("payload", "field"), [
    ({}, "ticker"),
    ({"ticker": ""}, "ticker"),
    ({"ticker": "BTC!"}, "ticker"),
    ({"ticker": "A" * 16}, "ticker"),
    ({"ticker": 5}, "ticker"),
    ({"ticker": "BTC", "coin_id": "Bitcoin"}, "coin_id"),
    ({"ticker": "BTC", "coin_id": "bit--coin"}, "coin_id"),
    ({"ticker": "BTC", "window_days": 0}, "window_days"),
    ({"ticker": "BTC", "window_days": 91}, "window_days"),
    ({"ticker": "BTC", "window_days": True}, "window_days"),
    ({"ticker": "BTC", "window_days": 7.5}, "window_days"),
    ({"ticker": "BTC", "days": 7}, "days"),
])
def test_validate_names_the_offending_field(payload: dict[str, Any], field: str) -> None:
    with pytest.raises(SkillInputError) as caught:
        attention_report.validate(payload)
    assert caught.value.field == field


def test_malformed_settings_make_the_resource_unavailable_before_a_quote() -> None:
    for env, name in [({"ATTENTION_DEADLINE_SECONDS": "soon"}, "ATTENTION_DEADLINE_SECONDS"),
                      ({"ATTENTION_NEWS_TIMEOUT_SECONDS": "0"}, "ATTENTION_NEWS_TIMEOUT_SECONDS"),
                      ({"X_BASE_URL": "ftp://x.example"}, "X_BASE_URL")]:
        with pytest.raises(SkillUnavailableError, match=name):
            attention_report.ready(ResourceContext(environ=env))
    attention_report.ready(ResourceContext(environ={}))  # defaults are fine


# ---------------------------------------------------------------- over the devnet

def test_paid_call_delivers_every_section_and_charges_the_price(
    gateway: LiveServer, upstreams: AttentionUpstreams
) -> None:
    before = gateway.devnet.merchant_balances().evm
    r = _pay(gateway, BODY)
    assert r.status_code == 200, r.text
    assert receipt(r)["success"] is True
    assert gateway.devnet.merchant_balances().evm - before == PRICE
    report = r.json()

    assert report["ticker"] == "BTC" and report["coin_id"] == "bitcoin"
    assert report["window_days"] == 30 and report["missing"] == []
    assert "not investment advice" in report["disclaimer"]
    for section in SECTIONS:
        body = report[section]
        assert body["source"]["provider"] and body["source"]["endpoint"], section
        retrieved = datetime.fromisoformat(body["retrieved_at"])
        assert abs(retrieved - datetime.fromisoformat(report["generated_at"])) < timedelta(
            minutes=1)

    news = report["news"]
    assert [h["title"] for h in news["headlines"]] == list(NEUTRAL_HEADLINES)
    assert all(h["outlet"] == "CoinDesk" and h["url"].startswith("https://cryptopanic.com/news/")
               and h["published_at"] for h in news["headlines"])
    assert news["withheld_for_wording"] == len(DIRECTIONAL_HEADLINES)
    assert news["outside_window"] == 1

    sentiment = report["sentiment"]
    detail = TOPIC["types_sentiment_detail"]
    positive = sum(v["positive"] for v in detail.values())
    negative = sum(v["negative"] for v in detail.values())
    assert sentiment["overall_score"] == round(positive / (positive + negative) * 100, 1)
    assert sentiment["by_network"] == {k: float(v) for k, v in TOPIC["types_sentiment"].items()}
    assert sentiment["posts"] == TOPIC["num_posts"] and sentiment["topic"] == "$btc"

    volatility = report["volatility"]
    daily = list(PRICES[-31:])  # the intraday "now" point is not a daily price
    figures = volatility["realized_volatility"]
    assert figures["7d"]["annualized"] == _expected_volatility(daily[-8:])
    assert figures["30d"]["annualized"] == _expected_volatility(daily)
    assert figures["30d"]["annualized_percent"] == pytest.approx(
        figures["30d"]["annualized"] * 100, abs=0.01)
    assert volatility["daily_prices_used"] == 31

    trend = report["interest"]["trend"]
    assert report["interest"]["article"] == "Bitcoin"
    assert trend["recent_mean_daily_views"] == VIEWS_RECENT
    assert trend["previous_mean_daily_views"] == VIEWS_PREVIOUS
    assert trend["change_percent"] == 50.0 and trend["label"] == "increasing"
    assert len(report["interest"]["daily_views"]) == 30

    mentions = report["mentions"]
    assert mentions["total_mentions"] == sum(X_DAILY_COUNTS)
    assert [d["count"] for d in mentions["daily"]] == list(X_DAILY_COUNTS)
    assert mentions["query"] == "($BTC OR bitcoin) -is:retweet"
    _assert_neutral(report)

    [row] = gateway.ledger_rows(tx_hash=receipt(r)["transaction"])
    assert row["state"] == "settled" and row["skill_id"] == RESOURCE


def test_failing_sources_are_listed_as_missing_and_the_call_is_still_charged(
    gateway: LiveServer, upstreams: AttentionUpstreams
) -> None:
    upstreams.behave("lunarcrush", "fail", 500)
    upstreams.behave("x", "fail", 429)
    upstreams.behave("coingecko", "garbage")
    before = gateway.devnet.merchant_balances().evm
    r = _pay(gateway, {"ticker": "eth", "window_days": 14})
    assert r.status_code == 200, r.text
    assert gateway.devnet.merchant_balances().evm - before == PRICE
    report = r.json()
    assert report["ticker"] == "ETH" and report["coin_id"] == "ethereum"
    assert _missing(report) == {
        "sentiment": "LunarCrush answered HTTP 500",
        "mentions": "X answered HTTP 429",
        "volatility": "CoinGecko answered with something other than JSON",
    }
    assert report["sentiment"] is None and report["mentions"] is None
    assert report["news"]["headlines"] and report["interest"]["trend"]["label"] == "increasing"
    assert report["interest"]["article"] == "Ethereum"
    _assert_neutral(report)


def test_when_every_source_fails_the_call_is_502_and_nothing_is_charged(
    gateway: LiveServer, upstreams: AttentionUpstreams
) -> None:
    for provider in ("cryptopanic", "lunarcrush", "coingecko", "wikimedia", "x"):
        upstreams.behave(provider, "fail", 503)
    released = len(gateway.ledger_rows(skill_id=RESOURCE, state="released"))
    settled = len(gateway.ledger_rows(skill_id=RESOURCE, state="settled"))
    before = gateway.devnet.merchant_balances().evm
    r = _pay(gateway, BODY)
    assert r.status_code == 502, r.text
    message = r.json()["error"]["message"]
    assert "nothing was charged" in message and "CoinGecko answered HTTP 503" in message
    assert "PAYMENT-RESPONSE" not in r.headers
    assert gateway.devnet.merchant_balances().evm == before
    assert len(gateway.ledger_rows(skill_id=RESOURCE, state="released")) == released + 1
    assert len(gateway.ledger_rows(skill_id=RESOURCE, state="settled")) == settled


@pytest.mark.parametrize(("body", "field"), [
    ({"ticker": "BTC!"}, "ticker"),
    ({"coin_id": "bitcoin"}, "ticker"),
    ({"ticker": "BTC", "window_days": 400}, "window_days"),
    ({"ticker": "BTC", "coin_id": "Not An Id"}, "coin_id"),
    ({"ticker": "BTC", "extra": 1}, "extra"),
])
def test_bad_input_is_refused_before_any_quote(
    gateway: LiveServer, upstreams: AttentionUpstreams, body: dict[str, Any], field: str
) -> None:
    r = httpx.post(_url(gateway), json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert "PAYMENT-REQUIRED" not in r.headers
    assert field in r.json()["error"]["message"]
    assert upstreams.state.requests == []


# ---------------------------------------------------------------- in process, against the stand-ins

def test_requests_follow_each_providers_documented_shape(upstreams: AttentionUpstreams) -> None:
    env = {**upstreams.env(), "COINGECKO_DEMO_API_KEY": "cg-demo",
           "WIKIMEDIA_USER_AGENT": "attention-tests/1.0 (ops@example.org)"}
    report = _report(env, {"ticker": "BTC", "window_days": 10})
    assert report["missing"] == []

    [news] = upstreams.seen("cryptopanic")
    assert news.query == {"auth_token": ["cp-test-token"], "currencies": ["BTC"],
                          "kind": ["news"], "public": ["true"]}
    [topic] = upstreams.seen("lunarcrush")
    assert unquote(topic.path) == "/api4/public/topic/$btc/v1"
    assert topic.headers["Authorization"] == "Bearer lc-test-key"
    [chart] = upstreams.seen("coingecko")
    assert chart.path == "/api/v3/coins/bitcoin/market_chart"
    assert chart.query == {"vs_currency": ["usd"], "days": ["32"], "interval": ["daily"]}
    assert chart.headers["x-cg-demo-api-key"] == "cg-demo"
    [views] = upstreams.seen("wikimedia")
    yesterday = datetime.fromisoformat(report["generated_at"]).date() - timedelta(days=1)
    first = yesterday - timedelta(days=19)
    assert views.path == ("/api/rest_v1/metrics/pageviews/per-article/en.wikipedia/all-access/"
                          f"user/Bitcoin/daily/{first:%Y%m%d}/{yesterday:%Y%m%d}")
    assert views.headers["User-Agent"] == "attention-tests/1.0 (ops@example.org)"
    [counts] = upstreams.seen("x")
    assert counts.query == {"query": ["($BTC OR bitcoin) -is:retweet"], "granularity": ["day"]}
    assert counts.headers["Authorization"] == "Bearer x-test-bearer"


def test_no_text_field_carries_directional_or_predictive_wording(
    upstreams: AttentionUpstreams
) -> None:
    # The stand-in's feed holds headlines full of such words; a 90-day window lets all through
    # the date filter, so only the wording screen keeps them out.
    assert all(FORBIDDEN.search(h) for h in DIRECTIONAL_HEADLINES)
    full = _report(upstreams.env(), {"ticker": "BTC", "window_days": 90})
    assert full["news"]["withheld_for_wording"] == len(DIRECTIONAL_HEADLINES)
    assert full["news"]["outside_window"] == 0
    _assert_neutral(full)
    upstreams.behave("coingecko", "fail", 404)
    partial = _report({k: v for k, v in upstreams.env().items() if k != "X_BEARER_TOKEN"},
                      {"ticker": "BTC"})
    assert set(_missing(partial)) == {"volatility", "mentions"}
    _assert_neutral(partial)
    # The screen itself, on wording the stand-in does not use.
    assert directional_terms("SOL bulls eye breakout; analysts expect gains") == [
        "breakout", "bulls", "expect", "gains"]
    assert directional_terms("Ethereum developers schedule the next network upgrade") == []


def test_the_five_lookups_are_in_flight_at_once(upstreams: AttentionUpstreams) -> None:
    # Each stand-in answers only once all five requests have arrived: sequential lookups would
    # break the barrier (after its own timeout) and every section would be missing.
    gate = threading.Barrier(len(SECTIONS), timeout=10)
    upstreams.state.gate = gate
    env = {**upstreams.env(), "ATTENTION_DEADLINE_SECONDS": "30",
           **{f"ATTENTION_{s.upper()}_TIMEOUT_SECONDS": "20" for s in SECTIONS}}
    report = _report(env, BODY)
    assert not gate.broken
    assert report["missing"] == [] and all(report[s] for s in SECTIONS)


def test_a_lookup_hanging_past_its_timeout_becomes_a_missing_section(
    upstreams: AttentionUpstreams
) -> None:
    upstreams.behave("x", "hang")
    report = _report({**upstreams.env(), "ATTENTION_MENTIONS_TIMEOUT_SECONDS": "0.3"}, BODY)
    assert _missing(report) == {"mentions": "X gave no answer within 0.3 s"}
    assert report["mentions"] is None
    assert all(report[s] for s in SECTIONS if s != "mentions")


def test_the_overall_deadline_cuts_off_lookups_still_running(
    upstreams: AttentionUpstreams
) -> None:
    upstreams.behave("coingecko", "hang")
    upstreams.behave("wikimedia", "hang")
    env = {**upstreams.env(), "ATTENTION_DEADLINE_SECONDS": "0.3",
           **{f"ATTENTION_{s.upper()}_TIMEOUT_SECONDS": "20" for s in SECTIONS}}
    report = _report(env, BODY)
    reason = "the report's overall deadline of 0.3 s passed first"
    assert _missing(report) == {"volatility": reason, "interest": reason}
    assert report["news"] and report["sentiment"] and report["mentions"]


def test_sources_without_their_key_are_reported_not_configured(
    upstreams: AttentionUpstreams
) -> None:
    env = {k: v for k, v in upstreams.env().items()
           if k not in ("LUNARCRUSH_API_KEY", "CRYPTOPANIC_API_KEY")}
    report = _report(env, BODY)
    assert _missing(report) == {"sentiment": "not configured: set LUNARCRUSH_API_KEY",
                                "news": "not configured: set CRYPTOPANIC_API_KEY"}
    assert upstreams.seen("lunarcrush") == [] and upstreams.seen("cryptopanic") == []


def test_unmapped_tickers_use_what_they_can_and_coin_id_overrides_the_map(
    upstreams: AttentionUpstreams
) -> None:
    report = _report(upstreams.env(), {"ticker": "zzz", "window_days": 3})
    assert _missing(report) == {
        "volatility": "no coin id is known for ticker 'ZZZ': pass coin_id (a CoinGecko coin id "
                      "such as 'bitcoin')",
        "interest": "no encyclopedia article is mapped for 'ZZZ'",
    }
    assert report["mentions"]["period_days"] == 3
    assert report["mentions"]["query"] == "($ZZZ) -is:retweet"
    [counts] = upstreams.seen("x")
    assert "start_time" in counts.query  # a window under X's seven days is asked for as such

    report = _report(upstreams.env(), {"ticker": "XBT", "coin_id": "bitcoin"})
    assert report["missing"] == [] and report["coin_id"] == "bitcoin"
    assert report["interest"]["article"] == "Bitcoin"
    assert upstreams.seen("coingecko")[-1].path == "/api/v3/coins/bitcoin/market_chart"
