"""A stand-in for Nansen's HTTP API (https://api.nansen.ai) on loopback: POST JSON to
/api/v1beta1/..., key in the `apiKey` header, JSON answers in Nansen's documented shapes
(`{"data": [...], "pagination": {...}}`; FastAPI-style `{"detail": [...]}` for a 422)."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

from tests.support.loopback_http import JSONHandler, LoopbackServer

# A row per endpoint, shaped like the documentation's examples.
ROWS: dict[str, dict[str, Any]] = {
    "/api/v1beta1/tgm/historical-token-quant-scores": {
        "as_of_date": "2025-06-30", "chain": "ethereum", "nansen_score": 71,
        "indicators": [{"name": "smart_money_netflow", "percentile": 0.82, "value": 1250000.5}],
    },
    "/api/v1beta1/smart-money/historical-token-balances": {
        "as_of_date": "2025-06-30", "chain": "ethereum", "token_symbol": "AAVE",
        "value_usd": 18250000.25, "balance_24h_percent_change": 0.013, "holders_count": 41,
        "share_of_holdings_percent": 0.021, "market_cap_usd": 4200000000,
    },
    "/api/v1beta1/token-screener/historical": {
        "chain": "base", "token_symbol": "AERO", "volume": 5230000.5, "netflow": -120000.0,
        "nof_traders": 1834, "price_change": 0.042,
    },
    "/api/v1beta1/tgm/historical-token-ohlcv": {
        "interval_start": "2025-06-29T00:00:00Z", "open": 251.2, "high": 259.9, "low": 248.1,
        "close": 257.4, "volume": 81234.5, "volume_usd": 20890000.1, "market_cap": 3900000000,
    },
}


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class NansenBehaviour:
    key: str = "nansen-test-key"
    fail_status: int | None = None  # answer every call with this status
    hang: threading.Event | None = None  # hold every call until this is set
    requests: list[Seen] = field(default_factory=list)


class NansenUpstream:
    def __init__(self) -> None:
        self.behaviour = NansenBehaviour()
        behaviour = self.behaviour

        class Handler(JSONHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                behaviour.requests.append(Seen(self.path, dict(self.headers.items()), body))
                if behaviour.hang is not None:
                    behaviour.hang.wait(30)
                self.answer(*self._decide(body))

            def _decide(self, body: Any) -> tuple[int, Any]:
                if self.headers.get("apiKey") != behaviour.key:
                    return 401, {"detail": "Invalid or missing API key"}
                if behaviour.fail_status is not None:
                    return behaviour.fail_status, {"detail": f"injected {behaviour.fail_status}"}
                if self.path not in ROWS:
                    return 404, {"detail": "Not Found"}
                if not isinstance(body, dict):
                    return 422, {"detail": [{"type": "model_attributes_type", "loc": ["body"],
                                             "msg": "Input should be a valid dictionary"}]}
                page = (body.get("pagination") or {}).get("page", 1)
                return 200, {"data": [ROWS[self.path]], "echo": body,
                             "pagination": {"page": page, "per_page": 10, "is_last_page": True}}

        self._server = LoopbackServer(Handler)

    @property
    def url(self) -> str:
        return self._server.url

    def start(self) -> NansenUpstream:
        self._server.start()
        return self

    def stop(self) -> None:
        if self.behaviour.hang is not None:
            self.behaviour.hang.set()
        self._server.stop()
