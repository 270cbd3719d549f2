"""The five lookups of the token attention report, one function per upstream, each turning the
provider's documented answer into one report section (or raising SourceError, whose message is
the reason the report gives for the missing section).

Providers (base URL overridable by environment, which is how tests point them at loopback):

- news: CryptoPanic posts API, `GET {base}/posts/?auth_token=&currencies=&kind=news&public=true`
  (base https://cryptopanic.com/api/developer/v2; key CRYPTOPANIC_API_KEY, required);
- sentiment: LunarCrush API v4, `GET {base}/public/topic/{topic}/v1` with `Authorization: Bearer`
  (base https://lunarcrush.com/api4; key LUNARCRUSH_API_KEY, required);
- volatility: CoinGecko `GET {base}/coins/{id}/market_chart?vs_currency=usd&days=&interval=daily`
  (public base https://api.coingecko.com/api/v3 needs no key; COINGECKO_DEMO_API_KEY is sent as
  `x-cg-demo-api-key`, COINGECKO_PRO_API_KEY as `x-cg-pro-api-key` to https://pro-api.coingecko.com/api/v3);
- interest: Wikimedia REST `GET {base}/metrics/pageviews/per-article/en.wikipedia/all-access/user/
  {article}/daily/{start}/{end}` (base https://wikimedia.org/api/rest_v1; no key; Wikimedia asks
  for a descriptive User-Agent with contact details: WIKIMEDIA_USER_AGENT);
- mentions: X API v2 `GET {base}/tweets/counts/recent?query=&granularity=day` with
  `Authorization: Bearer` (base https://api.x.com/2; token X_BEARER_TOKEN, required).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp

from skills.resource_context import ResourceContext

from .attention_metrics import (
    VOLATILITY_WINDOWS,
    daily_prices,
    interest_trend,
    is_neutral,
    number,
    overall_sentiment,
    volatility_figures,
)

MAX_ANSWER_BYTES = 4 * 1024 * 1024
MAX_HEADLINES = 10
X_RECENT_DAYS = 7  # X's recent counts reach back seven days at most
WIKI_PROJECT = "en.wikipedia"


class SourceError(Exception):
    """A lookup did not deliver. The message is shown to the caller in `missing`, so it names the
    provider and the cause, never a key or a URL carrying one."""


@dataclass(frozen=True)
class Coin:
    coin_id: str  # CoinGecko's id
    name: str  # searched for on X next to the cashtag
    article: str | None  # English Wikipedia article title; None where no article is dedicated


# Common coins; `coin_id` in the input overrides the id (and its article/name when it is listed).
COINS: dict[str, Coin] = {
    "BTC": Coin("bitcoin", "bitcoin", "Bitcoin"),
    "ETH": Coin("ethereum", "ethereum", "Ethereum"),
    "SOL": Coin("solana", "solana", "Solana_(blockchain_platform)"),
    "XRP": Coin("ripple", "xrp", "XRP_Ledger"),
    "DOGE": Coin("dogecoin", "dogecoin", "Dogecoin"),
    "ADA": Coin("cardano", "cardano", "Cardano_(blockchain_platform)"),
    "LTC": Coin("litecoin", "litecoin", "Litecoin"),
    "BCH": Coin("bitcoin-cash", "bitcoin cash", "Bitcoin_Cash"),
    "ETC": Coin("ethereum-classic", "ethereum classic", "Ethereum_Classic"),
    "XMR": Coin("monero", "monero", "Monero"),
    "ZEC": Coin("zcash", "zcash", "Zcash"),
    "XLM": Coin("stellar", "stellar", "Stellar_(payment_network)"),
    "SHIB": Coin("shiba-inu", "shiba inu", "Shiba_Inu_(cryptocurrency)"),
    "USDT": Coin("tether", "tether", "Tether_(cryptocurrency)"),
    "USDC": Coin("usd-coin", "usdc", "USD_Coin"),
    "BNB": Coin("binancecoin", "bnb", None),
    "TRX": Coin("tron", "tron", None),
    "AVAX": Coin("avalanche-2", "avalanche", None),
    "LINK": Coin("chainlink", "chainlink", None),
    "DOT": Coin("polkadot", "polkadot", None),
}
_BY_ID = {coin.coin_id: coin for coin in COINS.values()}


@dataclass(frozen=True)
class Target:
    """What the lookups are about, resolved from the validated input."""

    ticker: str
    coin_id: str | None
    coin: Coin | None
    window_days: int
    now: datetime


def target_for(ticker: str, coin_id: str | None, window_days: int, now: datetime) -> Target:
    coin = _BY_ID.get(coin_id) if coin_id else COINS.get(ticker)
    return Target(ticker, coin_id or (coin.coin_id if coin else None), coin, window_days, now)


@dataclass(frozen=True)
class Source:
    section: str  # the report's key for it
    provider: str
    base_env: str
    default_base: str
    timeout_seconds: float  # default; ATTENTION_<SECTION>_TIMEOUT_SECONDS overrides it
    fetch: Callable[[ResourceContext, Target], Awaitable[dict[str, Any]]]

    @property
    def timeout_env(self) -> str:
        return f"ATTENTION_{self.section.upper()}_TIMEOUT_SECONDS"


# ---------------------------------------------------------------- HTTP plumbing

def base_url(context: ResourceContext, env: str, default: str) -> str:
    return (context.env(env) or default).rstrip("/")


def base_url_problem(value: str) -> str | None:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return f"must be an http:// or https:// URL, got {value!r}"
    return None


def _key(context: ResourceContext, env: str) -> str:
    value = context.env(env)
    if not value:
        raise SourceError(f"not configured: set {env}")
    return value


async def get_json(context: ResourceContext, provider: str, url: str, *,
                   params: dict[str, str] | None = None,
                   headers: dict[str, str] | None = None) -> Any:
    """GET a JSON answer. Timeouts are the caller's (the session has none of its own)."""
    async with context.http().get(url, params=params, headers=headers,
                                  allow_redirects=False) as response:
        if response.status != 200:
            raise SourceError(f"{provider} answered HTTP {response.status}")
        body = await _read_bounded(response, provider)
    try:
        return json.loads(body)
    except ValueError:
        raise SourceError(f"{provider} answered with something other than JSON") from None


async def _read_bounded(response: aiohttp.ClientResponse, provider: str) -> bytes:
    chunks, size = [], 0
    async for chunk in response.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise SourceError(f"{provider} answered more than {MAX_ANSWER_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _utc(value: str) -> datetime:
    parsed = datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


# ---------------------------------------------------------------- news: CryptoPanic

async def fetch_news(context: ResourceContext, target: Target) -> dict[str, Any]:
    key = _key(context, "CRYPTOPANIC_API_KEY")
    base = base_url(context, NEWS.base_env, NEWS.default_base)
    doc = await get_json(context, NEWS.provider, f"{base}/posts/", params={
        "auth_token": key, "currencies": target.ticker, "kind": "news", "public": "true"})
    since = target.now - timedelta(days=target.window_days)
    headlines: list[dict[str, Any]] = []
    withheld = older = 0
    for post in doc["results"]:
        headline = _headline(post)
        if _utc(headline["published_at"]) < since:
            older += 1
        elif not is_neutral(*(str(v) for v in headline.values() if v)):
            withheld += 1  # third-party wording about price direction is left out, not reworded
        else:
            headlines.append(headline)
    return {
        "source": {"provider": NEWS.provider, "endpoint": "posts"},
        "headlines": headlines[:MAX_HEADLINES],
        "headline_count": min(len(headlines), MAX_HEADLINES),
        "withheld_for_wording": withheld,
        "outside_window": older,
    }


def _headline(post: dict[str, Any]) -> dict[str, Any]:
    title = post["title"]
    if not isinstance(title, str) or not title.strip():
        raise ValueError("a post has no title")
    source = post.get("source") or {}
    published = post["published_at"]
    _utc(published)  # a headline without a readable date is a shape error
    return {
        "title": title.strip(),
        "published_at": published,
        "outlet": source.get("title") or source.get("domain") or post.get("domain"),
        "url": post.get("original_url") or post.get("url"),
    }


# ---------------------------------------------------------------- sentiment: LunarCrush

async def fetch_sentiment(context: ResourceContext, target: Target) -> dict[str, Any]:
    key = _key(context, "LUNARCRUSH_API_KEY")
    base = base_url(context, SENTIMENT.base_env, SENTIMENT.default_base)
    topic = "$" + target.ticker.lower()  # the cashtag topic exists for every listed coin
    doc = await get_json(context, SENTIMENT.provider,
                         f"{base}/public/topic/{quote(topic, safe='')}/v1",
                         headers={"Authorization": f"Bearer {key}"})
    data = doc["data"]
    by_network = {str(k): number(v) for k, v in (data.get("types_sentiment") or {}).items()}
    overall = overall_sentiment(data.get("types_sentiment_detail") or {}, by_network,
                                data.get("types_interactions") or {})
    return {
        "source": {"provider": SENTIMENT.provider, "endpoint": "public/topic/{topic}/v1"},
        "topic": topic,
        "period": "last 24 hours",
        "scale": "0 to 100: percent of interaction-weighted posts that are positive "
                 "(50 = as many positive as negative posts)",
        "overall_score": overall,
        "by_network": by_network,
        "posts": int(data.get("num_posts") or 0),
        "contributors": int(data.get("num_contributors") or 0),
        "interactions": int(data.get("interactions_24h") or 0),
    }


# ---------------------------------------------------------------- volatility: CoinGecko

COINGECKO_PRO_BASE = "https://pro-api.coingecko.com/api/v3"
# One more day than the longest window (returns need a previous price) and one for a late snapshot.
PRICE_DAYS = max(VOLATILITY_WINDOWS) + 2


async def fetch_volatility(context: ResourceContext, target: Target) -> dict[str, Any]:
    if not target.coin_id:
        raise SourceError(f"no coin id is known for ticker '{target.ticker}': pass coin_id "
                          "(a CoinGecko coin id such as 'bitcoin')")
    pro, demo = context.env("COINGECKO_PRO_API_KEY"), context.env("COINGECKO_DEMO_API_KEY")
    base = base_url(context, VOLATILITY.base_env,
                    COINGECKO_PRO_BASE if pro else VOLATILITY.default_base)
    headers = {"x-cg-pro-api-key": pro} if pro else {"x-cg-demo-api-key": demo} if demo else {}
    doc = await get_json(context, VOLATILITY.provider,
                         f"{base}/coins/{quote(target.coin_id, safe='')}/market_chart",
                         params={"vs_currency": "usd", "days": str(PRICE_DAYS),
                                 "interval": "daily"}, headers=headers)
    days = daily_prices(doc["prices"])[-(max(VOLATILITY_WINDOWS) + 1):]
    if len(days) < min(VOLATILITY_WINDOWS) + 1:
        raise SourceError(f"{VOLATILITY.provider} has only {len(days)} daily prices for "
                          f"'{target.coin_id}'; at least {min(VOLATILITY_WINDOWS) + 1} are needed")
    return {
        "source": {"provider": VOLATILITY.provider, "endpoint": "coins/{id}/market_chart"},
        "coin_id": target.coin_id,
        "currency": "usd",
        "method": "sample standard deviation of daily log returns of 00:00 UTC prices, "
                  "annualized by the square root of 365",
        "realized_volatility": volatility_figures([price for _, price in days]),
        "prices_from": days[0][0].isoformat(),
        "prices_to": days[-1][0].isoformat(),
        "daily_prices_used": len(days),
    }


# ---------------------------------------------------------------- interest: Wikimedia page views

DEFAULT_USER_AGENT = ("paywire-token-attention-report/1.0 (self-hosted paywire gateway) "
                      f"aiohttp/{aiohttp.__version__}")


def wikimedia_user_agent(context: ResourceContext) -> str:
    """Wikimedia refuses anonymous clients: name the tool and, where known, where to reach it."""
    explicit = context.env("WIKIMEDIA_USER_AGENT")
    if explicit:
        return explicit
    public = context.env("PAYWIRE_PUBLIC_URL")
    if public:
        return f"paywire-token-attention-report/1.0 (+{public}) aiohttp/{aiohttp.__version__}"
    return DEFAULT_USER_AGENT


async def fetch_interest(context: ResourceContext, target: Target) -> dict[str, Any]:
    article = target.coin.article if target.coin else None
    if not article:
        raise SourceError(f"no encyclopedia article is mapped for '{target.coin_id or target.ticker}'")
    base = base_url(context, INTEREST.base_env, INTEREST.default_base)
    end = (target.now - timedelta(days=1)).date()  # today's figures are not published yet
    start = end - timedelta(days=2 * target.window_days - 1)
    url = (f"{base}/metrics/pageviews/per-article/{WIKI_PROJECT}/all-access/user/"
           f"{quote(article, safe='')}/daily/{start:%Y%m%d}/{end:%Y%m%d}")
    doc = await get_json(context, INTEREST.provider, url,
                         headers={"User-Agent": wikimedia_user_agent(context)})
    items = sorted(doc["items"], key=lambda item: str(item["timestamp"]))
    views = [int(item["views"]) for item in items]
    return {
        "source": {"provider": INTEREST.provider,
                   "endpoint": "metrics/pageviews/per-article (agent: user)"},
        "project": WIKI_PROJECT,
        "article": article,
        "period_from": start.isoformat(),
        "period_to": end.isoformat(),
        "trend": interest_trend(views, target.window_days),
        "daily_views": [{"date": _wiki_date(item["timestamp"]), "views": int(item["views"])}
                        for item in items[-target.window_days:]],
    }


def _wiki_date(timestamp: Any) -> str:
    text = str(timestamp)  # YYYYMMDDHH
    return f"{text[0:4]}-{text[4:6]}-{text[6:8]}"


# ---------------------------------------------------------------- mentions: X recent counts

def x_query(target: Target) -> str:
    terms = [f"${target.ticker}"]
    if target.coin is not None:
        name = target.coin.name
        terms.append(f'"{name}"' if " " in name else name)
    return f"({' OR '.join(terms)}) -is:retweet"


async def fetch_mentions(context: ResourceContext, target: Target) -> dict[str, Any]:
    token = _key(context, "X_BEARER_TOKEN")
    base = base_url(context, MENTIONS.base_env, MENTIONS.default_base)
    query = x_query(target)
    params = {"query": query, "granularity": "day"}
    days = min(target.window_days, X_RECENT_DAYS)
    if days < X_RECENT_DAYS:  # without start_time X counts its whole seven days
        params["start_time"] = iso(target.now - timedelta(days=days))
    doc = await get_json(context, MENTIONS.provider, f"{base}/tweets/counts/recent",
                         params=params, headers={"Authorization": f"Bearer {token}"})
    buckets = doc.get("data") or []
    daily = [{"start": b["start"], "end": b["end"], "count": int(b["tweet_count"])}
             for b in buckets]
    return {
        "source": {"provider": MENTIONS.provider, "endpoint": "tweets/counts/recent"},
        "query": query,
        "period_days": days,
        "total_mentions": int(doc["meta"]["total_tweet_count"]),
        "daily": daily,
    }


NEWS = Source("news", "CryptoPanic", "CRYPTOPANIC_BASE_URL",
              "https://cryptopanic.com/api/developer/v2", 6.0, fetch_news)
SENTIMENT = Source("sentiment", "LunarCrush", "LUNARCRUSH_BASE_URL",
                   "https://lunarcrush.com/api4", 6.0, fetch_sentiment)
VOLATILITY = Source("volatility", "CoinGecko", "COINGECKO_BASE_URL",
                    "https://api.coingecko.com/api/v3", 8.0, fetch_volatility)
INTEREST = Source("interest", "Wikimedia", "WIKIMEDIA_BASE_URL",
                  "https://wikimedia.org/api/rest_v1", 6.0, fetch_interest)
MENTIONS = Source("mentions", "X", "X_BASE_URL", "https://api.x.com/2", 6.0, fetch_mentions)
SOURCES: tuple[Source, ...] = (NEWS, SENTIMENT, VOLATILITY, INTEREST, MENTIONS)
