"""token-attention-report: a merged, informational attention report for a crypto token.

Five lookups run at once, each under its own timeout and all under one overall deadline
(attention_sources has the providers): news headlines (CryptoPanic), social sentiment scores
(LunarCrush), realized volatility computed here from daily prices (CoinGecko), the page-view
interest trend (Wikimedia) and social mention counts (X). Each section says its source and when
it was retrieved. A lookup that fails, times out or is not configured becomes an entry of
`missing` with the reason; the call is charged as long as one section is delivered. When none is,
the call fails with 502 and nothing is charged.

The report carries a not-investment-advice disclaimer and no price-direction, recommendation or
prediction wording: third-party headlines that use such words are withheld and counted.

Input: ``ticker`` (required, 1-15 letters or digits), ``coin_id`` (optional CoinGecko id, overrides
the built-in ticker map), ``window_days`` (optional, 1-90, default 30). Unknown fields are refused.

Settings: ATTENTION_DEADLINE_SECONDS (default 10) and ATTENTION_<SECTION>_TIMEOUT_SECONDS per lookup
(news, sentiment, volatility, interest, mentions); keys and base URLs in attention_sources.
"""

from __future__ import annotations

import asyncio
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp

from skills.errors import SkillInputError, SkillUnavailableError, UpstreamError
from skills.json_numbers import is_whole, whole
from skills.resource_context import ResourceContext

from .attention_sources import SOURCES, Source, SourceError, Target, base_url_problem, iso, target_for

DISCLAIMER = (
    "For information only; this is not investment advice. The report describes recorded news, "
    "social activity, encyclopedia page views and past price variability as measured by the "
    "sources named in each section, and makes no statement about future prices."
)
DEADLINE_ENV = "ATTENTION_DEADLINE_SECONDS"
DEFAULT_DEADLINE = 10.0
MAX_SECONDS = 120.0
DEFAULT_WINDOW_DAYS = 30
MAX_WINDOW_DAYS = 90

_FIELDS = ("ticker", "coin_id", "window_days")
_TICKER = re.compile(r"^[A-Za-z0-9]{1,15}$")
_COIN_ID = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_MAX_COIN_ID = 100


# ---------------------------------------------------------------- input

def validate(payload: dict[str, Any]) -> None:
    """Raise SkillInputError naming the offending field if ``payload`` cannot run."""
    if not isinstance(payload, dict):
        raise SkillInputError("the input must be a JSON object with 'ticker'", None)
    for key in payload:
        if key not in _FIELDS:
            raise SkillInputError(f"field '{key}' is not accepted: send 'ticker' and optionally "
                                  "'coin_id' and 'window_days'", str(key))
    ticker = payload.get("ticker")
    if not isinstance(ticker, str) or not _TICKER.match(ticker):
        raise SkillInputError("field 'ticker' is required: 1 to 15 letters or digits, such as "
                              "'BTC' or 'ETH'", "ticker")
    if "coin_id" in payload:
        coin_id = payload["coin_id"]
        if (not isinstance(coin_id, str) or len(coin_id) > _MAX_COIN_ID
                or not _COIN_ID.match(coin_id)):
            raise SkillInputError("field 'coin_id' must be a CoinGecko coin id: lowercase letters, "
                                  f"digits and single hyphens, at most {_MAX_COIN_ID} characters, "
                                  "such as 'bitcoin' or 'shiba-inu'", "coin_id")
    if "window_days" in payload:
        window = payload["window_days"]
        if not is_whole(window) or not 1 <= window <= MAX_WINDOW_DAYS:  # (30.0 is JSON's 30 too)
            raise SkillInputError(f"field 'window_days' must be a whole number of days from 1 to "
                                  f"{MAX_WINDOW_DAYS} (default {DEFAULT_WINDOW_DAYS})",
                                  "window_days")


# ---------------------------------------------------------------- settings

@dataclass(frozen=True)
class Limits:
    deadline: float
    timeouts: dict[str, float]


def _seconds(context: ResourceContext, env: str, default: float) -> float:
    raw = context.env(env)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_SECONDS:  # also false for NaN
        raise SkillUnavailableError(
            f"{env} must be a number of seconds above 0 and at most {MAX_SECONDS:g}, got {raw!r}; "
            "nothing was charged")
    return value


def limits(context: ResourceContext) -> Limits:
    return Limits(
        deadline=_seconds(context, DEADLINE_ENV, DEFAULT_DEADLINE),
        timeouts={s.section: _seconds(context, s.timeout_env, s.timeout_seconds) for s in SOURCES},
    )


def ready(context: ResourceContext) -> None:
    """Refuse before any quote (503 naming the variable) when a setting is malformed; a missing
    key is not a refusal: that source's section is reported missing."""
    limits(context)
    for source in SOURCES:
        value = context.env(source.base_env)
        problem = base_url_problem(value) if value else None
        if problem:
            raise SkillUnavailableError(f"{source.base_env} {problem}; nothing was charged")


# ---------------------------------------------------------------- lookups

@dataclass(frozen=True)
class Found:
    body: dict[str, Any]


@dataclass(frozen=True)
class Missing:
    reason: str


async def _lookup(source: Source, context: ResourceContext, target: Target,
                  timeout: float) -> Found | Missing:
    """One lookup under its own timeout; every expected failure becomes a Missing reason."""
    try:
        async with asyncio.timeout(timeout):
            body = await source.fetch(context, target)
    except TimeoutError:
        return Missing(f"{source.provider} gave no answer within {timeout:g} s")
    except SourceError as exc:
        return Missing(str(exc))
    except aiohttp.ClientError as exc:  # the type only: messages can carry URLs with keys
        return Missing(f"{source.provider} could not be reached ({type(exc).__name__})")
    except (KeyError, IndexError, TypeError, ValueError, ArithmeticError):
        return Missing(f"{source.provider} answered in a shape this report does not read")
    return Found({**body, "retrieved_at": iso(datetime.now(UTC))})


async def lookup_all(context: ResourceContext, target: Target,
                     limits: Limits) -> dict[str, Found | Missing]:
    """Run every lookup concurrently; those still running at the deadline are cancelled."""
    tasks = {s.section: asyncio.create_task(_lookup(s, context, target, limits.timeouts[s.section]))
             for s in SOURCES}
    try:
        done, _ = await asyncio.wait(tasks.values(), timeout=limits.deadline)
    finally:  # also when the caller goes away: no lookup outlives the call
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
    late = Missing(f"the report's overall deadline of {limits.deadline:g} s passed first")
    return {section: task.result() if task in done else late for section, task in tasks.items()}


# ---------------------------------------------------------------- the report

async def run(payload: dict[str, Any], context: ResourceContext) -> dict[str, Any]:
    validate(payload)
    settings = limits(context)
    now = datetime.now(UTC)
    target = target_for(payload["ticker"].upper(), payload.get("coin_id"),
                        whole(payload.get("window_days", DEFAULT_WINDOW_DAYS)), now)
    outcomes = await lookup_all(context, target, settings)
    if not any(isinstance(o, Found) for o in outcomes.values()):
        raise UpstreamError("no source of the attention report answered: " + "; ".join(
            f"{section}: {outcome.reason}" for section, outcome in outcomes.items()
            if isinstance(outcome, Missing)))
    return merge(target, outcomes)


def merge(target: Target, outcomes: dict[str, Found | Missing]) -> dict[str, Any]:
    providers = {s.section: s.provider for s in SOURCES}
    report: dict[str, Any] = {
        "ticker": target.ticker,
        "coin_id": target.coin_id,
        "window_days": target.window_days,
        "generated_at": iso(target.now),
        "disclaimer": DISCLAIMER,
    }
    for section, outcome in outcomes.items():
        report[section] = outcome.body if isinstance(outcome, Found) else None
    report["missing"] = [
        {"section": section, "provider": providers[section], "reason": outcome.reason}
        for section, outcome in outcomes.items() if isinstance(outcome, Missing)
    ]
    return report
