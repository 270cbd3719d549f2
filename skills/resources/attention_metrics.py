"""Pure computations of the token attention report: realized volatility from daily prices, the
page-view interest trend, and the screen that keeps price-direction wording out of the report.

No I/O here, so each figure can be checked against a hand-computed value.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Sequence
from datetime import UTC, date, datetime
from typing import Any

DAYS_PER_YEAR = 365  # crypto trades every day of the year
VOLATILITY_WINDOWS = (7, 30)
# Interest is "stable" within +/- this many percent of the previous window's mean.
TREND_BAND_PERCENT = 10.0

# Wording that states or implies a price direction, a recommendation or a prediction. Third-party
# text (headlines) that matches is withheld from the report, never reworded.
_DIRECTIONAL = re.compile(
    r"\b(?:"
    r"buy(?:s|ing|ers?)?|sell(?:s|ing|ers?|-?offs?)?|"
    r"bull(?:s|ish)?|bear(?:s|ish)?|"
    r"targets?|targeting|forecast(?:s|ed|ing)?|predict(?:s|ed|ing|ions?|ive)?|projections?|"
    r"outlook|expect(?:s|ed|ing|ations?)?|should|recommend(?:s|ed|ing|ations?)?|"
    r"upside|downside|undervalued|overvalued|overbought|oversold|accumulat(?:e|es|ed|ing|ion)|"
    r"moon(?:s|ing)?|pump(?:s|ed|ing)?|dump(?:s|ed|ing)?|rall(?:y|ies|ied|ying)|"
    r"breakouts?|crash(?:es|ed|ing)?|surg(?:e|es|ed|ing)|soar(?:s|ed|ing)?|plung(?:e|es|ed|ing)|"
    r"tumbl(?:e|es|ed|ing)|skyrocket(?:s|ed|ing)?|slump(?:s|ed|ing)?|spik(?:e|es|ed|ing)|"
    r"ris(?:e|es|ing)|rose|fall(?:s|ing)?|fell|jump(?:s|ed|ing)?|climb(?:s|ed|ing)?|"
    r"gain(?:s|ed|ing)?|drop(?:s|ped|ping)?|dips?|"
    r"longs|shorts|go(?:ing)? (?:long|short)|(?:long|short) positions?"
    r")\b",
    re.IGNORECASE,
)


def directional_terms(text: str) -> list[str]:
    """The price-direction, recommendation or prediction words found in `text` (lowercased)."""
    return sorted({m.group(0).lower() for m in _DIRECTIONAL.finditer(text)})


def is_neutral(*texts: str) -> bool:
    return not any(directional_terms(t) for t in texts if t)


# ---------------------------------------------------------------- realized volatility

def daily_prices(points: Iterable[Sequence[Any]]) -> list[tuple[date, float]]:
    """One price per UTC calendar day, the first point of the day (CoinGecko's 00:00 snapshot),
    so the extra "now" point its daily series ends with does not make a partial-day return."""
    by_day: dict[date, tuple[float, float]] = {}
    for point in points:
        millis, price = float(point[0]), float(point[1])
        if not math.isfinite(price) or price <= 0:
            raise ValueError(f"price {price!r} is not a positive number")
        day = datetime.fromtimestamp(millis / 1000, UTC).date()
        if day not in by_day or millis < by_day[day][0]:
            by_day[day] = (millis, price)
    return [(day, by_day[day][1]) for day in sorted(by_day)]


def log_returns(prices: Sequence[float]) -> list[float]:
    return [math.log(b / a) for a, b in zip(prices, prices[1:], strict=False)]


def realized_volatility(prices: Sequence[float], days: int) -> float | None:
    """Annualized realized volatility over the last `days` daily returns: the sample standard
    deviation of daily log returns times sqrt(365). None when there are fewer than `days` + 1
    prices (a shorter window would be mislabelled)."""
    if days < 2 or len(prices) < days + 1:
        return None
    returns = log_returns(prices[-(days + 1):])
    return statistics.stdev(returns) * math.sqrt(DAYS_PER_YEAR)


def volatility_figures(prices: Sequence[float]) -> dict[str, dict[str, Any]]:
    """{"7d": {...}, "30d": {...}}: annualized fraction (4 places), percent (2 places), and the
    number of returns used; `annualized` is None when the history is too short."""
    figures: dict[str, dict[str, Any]] = {}
    for days in VOLATILITY_WINDOWS:
        value = realized_volatility(prices, days)
        figures[f"{days}d"] = {
            "annualized": None if value is None else round(value, 4),
            "annualized_percent": None if value is None else round(value * 100, 2),
            "daily_returns": days if value is not None else max(len(prices) - 1, 0),
        }
    return figures


# ---------------------------------------------------------------- interest trend

def interest_trend(views: Sequence[int], window_days: int) -> dict[str, Any]:
    """Mean daily page views of the last `window_days` days against the window before it.

    `views` is oldest first. The label describes page views only: "increasing", "decreasing" or
    "stable" (within +/- TREND_BAND_PERCENT); None when there is no earlier window to compare."""
    recent = list(views[-window_days:])
    previous = list(views[-2 * window_days:-window_days]) if len(views) > window_days else []
    if not recent:
        raise ValueError("no page-view figures in the answer")
    recent_mean = sum(recent) / len(recent)
    trend: dict[str, Any] = {
        "recent_days": len(recent),
        "recent_total_views": sum(recent),
        "recent_mean_daily_views": round(recent_mean, 1),
        "previous_days": len(previous),
        "previous_mean_daily_views": None,
        "change_percent": None,
        "label": None,
    }
    if previous:
        previous_mean = sum(previous) / len(previous)
        trend["previous_mean_daily_views"] = round(previous_mean, 1)
        if previous_mean > 0:
            change = (recent_mean - previous_mean) / previous_mean * 100
            trend["change_percent"] = round(change, 1)
            trend["label"] = _trend_label(change)
    return trend


def _trend_label(change_percent: float) -> str:
    if change_percent > TREND_BAND_PERCENT:
        return "increasing"
    if change_percent < -TREND_BAND_PERCENT:
        return "decreasing"
    return "stable"


# ---------------------------------------------------------------- sentiment

def overall_sentiment(detail: dict[str, Any], by_network: dict[str, Any],
                      interactions: dict[str, Any]) -> float:
    """LunarCrush's scale over all networks: the share of positive among positive and negative
    interaction-weighted posts, 0-100 (50 = as many positive as negative). Uses the positive /
    negative breakdown when given, else weights each network's score by its interactions."""
    positive = sum(number(v.get("positive", 0)) for v in detail.values() if isinstance(v, dict))
    negative = sum(number(v.get("negative", 0)) for v in detail.values() if isinstance(v, dict))
    if positive + negative > 0:
        return round(positive / (positive + negative) * 100, 1)
    weights = {k: number(interactions.get(k, 0)) for k in by_network}
    total = sum(weights.values())
    if total <= 0:
        raise ValueError("no interaction-weighted sentiment figures in the answer")
    return round(sum(number(by_network[k]) * w for k, w in weights.items()) / total, 1)


def number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{value!r} is not a number")
    return float(value)
