"""Stand-ins for the five providers of token-attention-report, on one loopback HTTP server, each
at its documented path and answering in its documented shape with fixed data:

- CryptoPanic   GET /api/developer/v2/posts/?auth_token=&currencies=&kind=news&public=true
- LunarCrush    GET /api4/public/topic/{topic}/v1                      (Authorization: Bearer)
- CoinGecko     GET /api/v3/coins/{id}/market_chart?vs_currency=&days=&interval=daily
- Wikimedia     GET /api/rest_v1/metrics/pageviews/per-article/{project}/{access}/{agent}/
                    {article}/daily/{start}/{end}                     (descriptive User-Agent)
- X             GET /2/tweets/counts/recent?query=&granularity=day     (Authorization: Bearer)

Knobs per provider (`behaviours[name].mode`): "ok", "fail" (answers `status` with the provider's
error shape), "garbage" (200 with an HTML body), "hang" (holds the request until `release` is set).
`gate`, when set, is a threading.Barrier every request waits at before answering: it only opens
when that many requests are in flight at once, which is how concurrency is tested without timing.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.support.loopback_http import JSONHandler, LoopbackServer

PROVIDERS = ("cryptopanic", "lunarcrush", "coingecko", "wikimedia", "x")
KEYS = {"cryptopanic": "cp-test-token", "lunarcrush": "lc-test-key", "x": "x-test-bearer"}

# Daily USD prices at 00:00 UTC, oldest first; the newest is today's.
PRICES: tuple[float, ...] = (
    61250.0, 62010.5, 61890.2, 63120.8, 62740.1, 64010.9, 63550.4, 62980.7, 64420.3, 65110.0,
    64870.6, 66230.2, 65790.9, 64950.5, 66010.1, 67240.8, 66880.3, 68120.7, 67450.2, 66990.9,
    68310.4, 69020.6, 68540.1, 67760.8, 69110.3, 70240.5, 69580.2, 70910.7, 71330.4, 70560.9,
    71820.1, 72450.6, 71990.3, 73010.8, 72640.2,
)
NOW_PRICE_FACTOR = 1.25  # the intraday "now" point CoinGecko appends; the report must ignore it

NEUTRAL_HEADLINES = (
    "Bitcoin network hash rate reaches a new record",
    "Exchange lists new Bitcoin futures contracts for institutional clients",
    "Lightning Network developers publish routing research",
    "Regulators publish draft rules for crypto custody",
)
DIRECTIONAL_HEADLINES = (
    "Analysts forecast BTC rally as bulls eye a $150k price target",
    "Why you should buy Bitcoin before the next halving",
    "BTC could turn bearish, traders say",
)
OLD_HEADLINE = "Bitcoin conference announces its next venue"  # 45 days old

VIEWS_PREVIOUS, VIEWS_RECENT = 1000, 1500  # per day, older half / newer half of the range
X_DAILY_COUNTS = (310, 290, 305, 420, 380, 350, 300)  # oldest first, one per day of the last 7

TOPIC = {  # LunarCrush's documented example for a topic, numbers kept small
    "topic": "$btc", "title": "BTC", "topic_rank": 20, "related_topics": ["coins layer 1"],
    "types_count": {"tweet": 5400, "news": 220, "reddit-post": 170},
    "types_interactions": {"tweet": 1500000, "news": 47000, "reddit-post": 22000},
    "types_sentiment": {"tweet": 76, "news": 73, "reddit-post": 69},
    "types_sentiment_detail": {
        "tweet": {"positive": 650000, "neutral": 570000, "negative": 280000},
        "news": {"positive": 21000, "neutral": 18000, "negative": 8000},
        "reddit-post": {"positive": 3200, "neutral": 14800, "negative": 4000},
    },
    "interactions_24h": 1569000, "num_contributors": 9100, "num_posts": 5790,
    "categories": ["cryptocurrencies"], "trend": "flat",
}


@dataclass
class Seen:
    provider: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]


@dataclass
class Behaviour:
    mode: str = "ok"  # ok | fail | garbage | hang
    status: int = 503


@dataclass
class _State:
    behaviours: dict[str, Behaviour] = field(
        default_factory=lambda: {p: Behaviour() for p in PROVIDERS})
    gate: threading.Barrier | None = None
    release: threading.Event = field(default_factory=threading.Event)
    requests: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


_ROUTES = (
    ("cryptopanic", re.compile(r"^/api/developer/v2/posts/$")),
    ("lunarcrush", re.compile(r"^/api4/public/topic/(?P<topic>[^/]+)/v1$")),
    ("coingecko", re.compile(r"^/api/v3/coins/(?P<id>[^/]+)/market_chart$")),
    ("wikimedia", re.compile(r"^/api/rest_v1/metrics/pageviews/per-article/(?P<project>[^/]+)/"
                             r"(?P<access>[^/]+)/(?P<agent>[^/]+)/(?P<article>[^/]+)/daily/"
                             r"(?P<start>\d{8})/(?P<end>\d{8})$")),
    ("x", re.compile(r"^/2/tweets/counts/recent$")),
)


def _route(path: str) -> tuple[str, dict[str, str]] | None:
    for provider, pattern in _ROUTES:
        match = pattern.match(path)
        if match:
            return provider, match.groupdict()
    return None


class AttentionUpstreams:
    def __init__(self) -> None:
        self.state = _State()
        state = self.state

        class Handler(JSONHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                parts = urlsplit(self.path)
                routed = _route(parts.path)
                if routed is None:
                    self._answer(404, {"detail": "Not Found"})
                    return
                provider, args = routed
                query = parse_qs(parts.query)
                with state.lock:
                    state.requests.append(Seen(provider, parts.path, query, dict(self.headers)))
                status, doc = self._decide(provider, args, query)
                self._answer(status, doc)

            def _decide(self, provider: str, args: dict[str, str],
                        query: dict[str, list[str]]) -> tuple[int, Any]:
                behaviour = state.behaviours[provider]
                if state.gate is not None:
                    try:
                        state.gate.wait()
                    except threading.BrokenBarrierError:
                        return 503, {"detail": "the lookups did not arrive together"}
                if behaviour.mode == "hang":
                    state.release.wait(30)
                if behaviour.mode == "garbage":
                    return 200, b"<html><body>maintenance</body></html>"
                refusal = _auth_problem(provider, self.headers, query)
                if refusal is not None:
                    return refusal
                if behaviour.mode == "fail":
                    return behaviour.status, _error_doc(provider, behaviour.status)
                return 200, ANSWERS[provider](args, query)

            def _answer(self, status: int, doc: Any) -> None:
                self.answer(status, doc, "text/html" if isinstance(doc, bytes) else "application/json")

        self._server = LoopbackServer(Handler)

    @property
    def url(self) -> str:
        return self._server.url

    def env(self) -> dict[str, str]:
        """The gateway settings that point the report at this server, with valid keys."""
        return {
            "CRYPTOPANIC_BASE_URL": f"{self.url}/api/developer/v2",
            "CRYPTOPANIC_API_KEY": KEYS["cryptopanic"],
            "LUNARCRUSH_BASE_URL": f"{self.url}/api4",
            "LUNARCRUSH_API_KEY": KEYS["lunarcrush"],
            "COINGECKO_BASE_URL": f"{self.url}/api/v3",
            "WIKIMEDIA_BASE_URL": f"{self.url}/api/rest_v1",
            "X_BASE_URL": f"{self.url}/2",
            "X_BEARER_TOKEN": KEYS["x"],
        }

    def behave(self, provider: str, mode: str, status: int = 503) -> None:
        self.state.behaviours[provider] = Behaviour(mode, status)

    def seen(self, provider: str) -> list[Seen]:
        with self.state.lock:
            return [s for s in self.state.requests if s.provider == provider]

    def reset(self) -> None:
        """Every provider healthy again; hanging requests let go."""
        self.state.release.set()
        self.state.release = threading.Event()
        self.state.behaviours = {p: Behaviour() for p in PROVIDERS}
        self.state.gate = None
        with self.state.lock:
            self.state.requests.clear()

    def start(self) -> AttentionUpstreams:
        self._server.start()
        return self

    def stop(self) -> None:
        self.state.release.set()
        self._server.stop()


# ---------------------------------------------------------------- authentication and errors

def _auth_problem(provider: str, headers: Any, query: dict[str, list[str]]
                  ) -> tuple[int, Any] | None:
    if provider == "cryptopanic" and query.get("auth_token") != [KEYS["cryptopanic"]]:
        return 401, {"status": "api_error", "info": "Token not found"}
    if provider in ("lunarcrush", "x") and headers.get("Authorization") != f"Bearer {KEYS[provider]}":
        return 401, {"title": "Unauthorized", "type": "about:blank", "status": 401,
                     "detail": "Unauthorized"}
    agent = headers.get("User-Agent") or ""
    if provider == "wikimedia" and (not agent or agent.startswith("Python/")):
        # Wikimedia refuses clients that do not say who they are.
        return 403, {"type": "https://mediawiki.org/wiki/HyperSwitch/errors/forbidden",
                     "title": "Forbidden", "detail": "Please set a user-agent and respect our "
                     "robot policy https://w.wiki/4wJS"}
    return None


def _error_doc(provider: str, status: int) -> Any:
    if provider == "coingecko":
        return {"status": {"error_code": status, "error_message": "injected failure"}}
    if provider == "cryptopanic":
        return {"status": "api_error", "info": "injected failure"}
    if provider == "x":
        return {"title": "Service Unavailable", "type": "about:blank", "status": status,
                "detail": "injected failure"}
    return {"error": "injected failure", "status": status}


# ---------------------------------------------------------------- documented answers

def _midnight(day: date) -> datetime:
    return datetime.combine(day, time(0), UTC)


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def _posts(args: dict[str, str], query: dict[str, list[str]]) -> Any:
    now = datetime.now(UTC)
    ages = [(t, timedelta(hours=2 + 5 * i)) for i, t in enumerate(NEUTRAL_HEADLINES)]
    ages += [(t, timedelta(hours=3 + 7 * i)) for i, t in enumerate(DIRECTIONAL_HEADLINES)]
    ages.append((OLD_HEADLINE, timedelta(days=45)))
    code = (query.get("currencies") or ["BTC"])[0]
    results = []
    for number, (title, age) in enumerate(ages, start=1000):
        slug = re.sub(r"[^A-Za-z0-9]+", "-", title).strip("-")
        published = _iso(now - age)
        results.append({
            "kind": "news", "id": number, "slug": slug, "title": title,
            "description": "", "published_at": published, "created_at": published,
            "url": f"https://cryptopanic.com/news/{number}/{slug}",
            "source": {"title": "CoinDesk", "region": "en", "domain": "coindesk.com",
                       "type": "feed"},
            "instruments": [{"code": code, "title": "Bitcoin", "slug": "bitcoin"}],
            "votes": {"negative": 0, "positive": 3, "important": 1, "liked": 2, "disliked": 0,
                      "lol": 0, "toxic": 0, "saved": 1, "comments": 0},
        })
    return {"next": None, "previous": None, "results": results}


def _topic(args: dict[str, str], query: dict[str, list[str]]) -> Any:
    topic = unquote(args["topic"])
    return {"config": {"id": "bitcoin", "name": "Bitcoin", "symbol": "BTC", "topic": topic,
                       "generated": int(datetime.now(UTC).timestamp())},
            "data": {**TOPIC, "topic": topic}}


def _market_chart(args: dict[str, str], query: dict[str, list[str]]) -> Any:
    days = int(query["days"][0])
    today = datetime.now(UTC).date()
    prices = PRICES[-(days + 1):]
    points = [[int(_midnight(today - timedelta(days=len(prices) - 1 - i)).timestamp() * 1000), p]
              for i, p in enumerate(prices)]
    now = datetime.now(UTC)
    if now > _midnight(today):
        points.append([int(now.timestamp() * 1000), prices[-1] * NOW_PRICE_FACTOR])
    caps = [[t, p * 19_700_000] for t, p in points]
    volumes = [[t, 3.1e10] for t, _ in points]
    return {"prices": points, "market_caps": caps, "total_volumes": volumes}


def _pageviews(args: dict[str, str], query: dict[str, list[str]]) -> Any:
    start = datetime.strptime(args["start"], "%Y%m%d").date()
    end = datetime.strptime(args["end"], "%Y%m%d").date()
    count = (end - start).days + 1
    return {"items": [
        {"project": args["project"], "article": unquote(args["article"]), "granularity": "daily",
         "timestamp": f"{start + timedelta(days=i):%Y%m%d}00", "access": args["access"],
         "agent": args["agent"], "views": VIEWS_RECENT if i >= count // 2 else VIEWS_PREVIOUS}
        for i in range(count)
    ]}


def _counts(args: dict[str, str], query: dict[str, list[str]]) -> Any:
    now = datetime.now(UTC)
    counts = X_DAILY_COUNTS
    if "start_time" in query:
        start = datetime.fromisoformat(query["start_time"][0])
        counts = counts[-max(1, round((now - start) / timedelta(days=1))):]
    buckets = [{"start": _iso(now - timedelta(days=len(counts) - i)),
                "end": _iso(now - timedelta(days=len(counts) - i - 1)), "tweet_count": c}
               for i, c in enumerate(counts)]
    return {"data": buckets, "meta": {"total_tweet_count": sum(counts)}}


ANSWERS = {"cryptopanic": _posts, "lunarcrush": _topic, "coingecko": _market_chart,
           "wikimedia": _pageviews, "x": _counts}
