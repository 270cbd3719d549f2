"""The operator API and page under /admin: the accounting figures (payments/accounting.py) as
JSON and CSV, and a page that draws them.

Off unless PAYWIRE_ADMIN_TOKEN is set: without it nothing is mounted and /admin answers 404 like
any unknown path. With it, every API route (and any route mounted beside them, such as the
operator's switches: `extra_routes`) needs `Authorization: Bearer <token>`, compared in constant
time (SHA-256 digests of both through `hmac.compare_digest`, so not even the length leaks); a
missing or wrong token is a 401 with `WWW-Authenticate: Bearer`. The page itself (`GET /admin/`,
its script and style sheet) is a static shell with no figure and no token in it: a browser cannot
send a bearer header when it navigates, so the page's script asks for the token and sends it with
each API call. Every answer is `Cache-Control: no-store`; the page carries a CSP that allows only
its own script, style sheet and API.

Routes (GET): /summary, /revenue, /revenue.csv, /payments, /payments.csv, /pending, /failures,
/chain-fees, /chain-fees.csv (what paywire's transactions paid in fees, by day, network and kind,
in USD where PAYWIRE_ETH_USD / PAYWIRE_SOL_USD set the token's price), /channels (the batch-settlement
channels: totals per network and token, and the channels with the most unclaimed first).
Query parameters are checked (unknown, repeated, too long or malformed ones are a 400 naming the
parameter), and the figures are the ones `paywire ledger revenue|payments` prints.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from importlib import resources
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.datastructures import QueryParams
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent.edge.http_io import HttpProblem, error_body, page_headers
from payments.accounting import (
    MAX_PAGE,
    Accounting,
    AccountingInputError,
    Cursor,
    PaymentFilter,
    PaymentLine,
    Period,
    parse_by,
)
from payments.accounting_csv import chain_fees_csv, payments_csv, revenue_csv
from payments.chain_fees import FeePrices
from payments.channel_report import MAX_LISTED, read_channels

TOKEN_VARIABLE = "PAYWIRE_ADMIN_TOKEN"
MIN_TOKEN_LENGTH = 32  # agent/settings.py refuses a shorter one at startup
MAX_PARAM_LENGTH = 200

log = logging.getLogger("paywire.admin")

PAGE_HEADERS = page_headers("no-store")
PAGE_FILES = {"/": ("index.html", "text/html; charset=utf-8"),
              "/app.js": ("app.js", "text/javascript; charset=utf-8"),
              "/style.css": ("style.css", "text/css; charset=utf-8")}


# -- the token -------------------------------------------------------------------------------------

class BearerGate:
    """ASGI middleware: the request must carry `Authorization: Bearer <token>`."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        if len(token) < MIN_TOKEN_LENGTH:  # settings refuse it first; never run on a weak one
            raise ValueError(f"{TOKEN_VARIABLE} must be at least {MIN_TOKEN_LENGTH} characters")
        self.app = app
        self._expected = hashlib.sha256(token.encode()).digest()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((value for name, value in scope["headers"] if name == b"authorization"), None)
        problem = self._refusal(given)
        if problem is not None:
            client = scope.get("client") or ("?", 0)
            log.info("refused %s %s from %s: %s", scope["method"], scope["path"], client[0], problem[0])
            await _unauthorized(*problem)(scope, receive, send)
            return

        async def no_store(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []),
                                                  (b"cache-control", b"no-store")]}
            await send(message)

        await self.app(scope, receive, no_store)

    def _refusal(self, given: bytes | None) -> tuple[str, str] | None:
        """None when the token matches, else (error code, message): never the token itself."""
        if given is None:
            return ("missing_token", f"send the header 'Authorization: Bearer <token>' with the "
                    f"token the server was started with ({TOKEN_VARIABLE})")
        scheme, _, credentials = given.strip().partition(b" ")
        if scheme.lower() != b"bearer" or not credentials.strip():
            return ("missing_token", "the Authorization header must be 'Bearer <token>' (the value "
                    f"of {TOKEN_VARIABLE})")
        if not hmac.compare_digest(hashlib.sha256(credentials.strip()).digest(), self._expected):
            return ("invalid_token", f"the bearer token is not the server's {TOKEN_VARIABLE}; send "
                    "the value the server was started with")
        return None


def _unauthorized(code: str, message: str) -> Response:
    return JSONResponse(error_body(401, code, message, "Authorization"), 401,
                        headers={"WWW-Authenticate": "Bearer", "Cache-Control": "no-store"})


# -- query parameters ------------------------------------------------------------------------------

def _params(request: Request, accepted: Sequence[str]) -> dict[str, str]:
    """The query parameters, each accepted, given once and bounded; 400 naming the first that
    is not."""
    query: QueryParams = request.query_params
    out: dict[str, str] = {}
    for name in query:
        if name not in accepted:
            raise HttpProblem(400, "unknown_parameter", f"unknown query parameter {name[:40]!r}; "
                              f"{request.url.path} accepts {', '.join(accepted)}", name[:40])
        values = query.getlist(name)
        if len(values) > 1:
            raise HttpProblem(400, "invalid_parameter", f"give {name} once", name)
        if len(values[0]) > MAX_PARAM_LENGTH:
            raise HttpProblem(400, "invalid_parameter",
                              f"{name} is longer than {MAX_PARAM_LENGTH} characters", name)
        out[name] = values[0]
    return out


def _whole(params: dict[str, str], name: str, default: int, least: int, most: int) -> int:
    text = params.get(name)
    if text is None or text == "":
        return default
    if not text.isdigit() or not least <= int(text) <= most:
        raise HttpProblem(400, "invalid_parameter",
                          f"{name} must be a whole number from {least} to {most}, got {text[:20]!r}", name)
    return int(text)


def _problem(exc: AccountingInputError) -> HttpProblem:
    return HttpProblem(400, "invalid_parameter", str(exc), exc.field)


PERIOD = ("since", "until", "month")
FILTERS = ("state", "skill", "network", "payer", "tx", *PERIOD)


def _period(params: dict[str, str]) -> Period:
    return Period.of(since=params.get("since") or None, until=params.get("until") or None,
                     month=params.get("month") or None)


def _filters(params: dict[str, str]) -> PaymentFilter:
    return PaymentFilter(
        state=params.get("state") or None, skill=params.get("skill") or None,
        network=params.get("network") or None, payer=params.get("payer") or None,
        tx=params.get("tx") or None, period=_period(params))


def _checked(handler: Callable[[Request], Any]) -> Callable[[Request], Any]:
    """A handler whose AccountingInputError is a 400 naming the parameter."""
    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except AccountingInputError as exc:
            raise _problem(exc) from None
    return endpoint


def _csv_name(kind: str, params: dict[str, str], period: Period) -> str:
    """`revenue-2026-11.csv` for a month (from the parsed period: no caller text in a header)."""
    if params.get("month") and period.since is not None:
        return f"{kind}-{period.since:%Y-%m}.csv"
    return f"{kind}.csv"


def _watched(line: PaymentLine, now: datetime) -> dict[str, Any]:
    left = line.lease_left_seconds(now)
    return line.as_dict() | {"age_seconds": round(line.age_seconds(now), 1),
                             "lease_left_seconds": round(left, 1) if left is not None else None,
                             "stuck": left is None or left <= 0}


# -- the routes ------------------------------------------------------------------------------------

def admin_routes(accounting: Accounting, engine: AsyncEngine,
                 extra_routes: Sequence[BaseRoute] = ()) -> list[BaseRoute]:
    """The API's routes (relative to /admin) on the ledger's database (`engine`), then
    `extra_routes` (the operator's controls): `admin_mount` puts all of them behind the token."""

    async def summary(request: Request) -> Response:
        params = _params(request, ("days",))
        return JSONResponse(await accounting.summary(days=_whole(params, "days", 30, 1, 366)))

    async def revenue(request: Request) -> Response:
        params = _params(request, ("by", *PERIOD))
        report = await accounting.revenue(by=parse_by(params.get("by")), period=_period(params))
        return JSONResponse(report.as_dict())

    async def revenue_file(request: Request) -> Response:
        params = _params(request, ("by", *PERIOD))
        period = _period(params)
        report = await accounting.revenue(by=parse_by(params.get("by")), period=period)
        return Response("".join(revenue_csv(report)), media_type="text/csv; charset=utf-8", headers={
            "Content-Disposition": f'attachment; filename="{_csv_name("revenue", params, period)}"'})

    async def payments(request: Request) -> Response:
        params = _params(request, (*FILTERS, "limit", "after", "order"))
        order = params.get("order") or "newest"
        if order not in ("newest", "oldest"):
            raise HttpProblem(400, "invalid_parameter",
                              f"order must be newest or oldest, got {order[:20]!r}", "order")
        after = Cursor.decode(params["after"]) if params.get("after") else None
        page = await accounting.payments(
            _filters(params), limit=_whole(params, "limit", 50, 1, MAX_PAGE), after=after,
            oldest_first=order == "oldest")
        return JSONResponse({"payments": [p.as_dict() for p in page.payments],
                             "next": page.next.encode() if page.next else None})

    async def payments_file(request: Request) -> Response:
        params = _params(request, FILTERS)
        filters = _filters(params)

        async def body() -> AsyncIterator[bytes]:
            async for text in payments_csv(accounting.every_payment(filters)):
                yield text.encode()
        return StreamingResponse(body(), media_type="text/csv; charset=utf-8", headers={
            "Content-Disposition":
                f'attachment; filename="{_csv_name("payments", params, filters.period)}"'})

    async def pending(request: Request) -> Response:
        params = _params(request, ("limit",))
        now = datetime.now(UTC)
        found = await accounting.pending(limit=_whole(params, "limit", 100, 1, MAX_PAGE))
        return JSONResponse({"now": now.isoformat().replace("+00:00", "Z"),
                             "pending": [_watched(p, now) for p in found]})

    async def failures(request: Request) -> Response:
        params = _params(request, ("limit", *PERIOD))
        found = await accounting.failures(period=_period(params),
                                          limit=_whole(params, "limit", 50, 1, MAX_PAGE))
        return JSONResponse({"failures": [p.as_dict() for p in found]})

    async def chain_fees(request: Request) -> Response:
        params = _params(request, PERIOD)
        period = _period(params)
        report = await accounting.chain_fees(period)
        return JSONResponse({"period": period.as_dict()} | report.as_dict())

    async def chain_fees_file(request: Request) -> Response:
        params = _params(request, PERIOD)
        period = _period(params)
        report = await accounting.chain_fees(period)
        return Response("".join(chain_fees_csv(report)),
                        media_type="text/csv; charset=utf-8", headers={
                            "Content-Disposition":
                                f'attachment; filename="{_csv_name("chain-fees", params, period)}"'})

    async def channels(request: Request) -> Response:
        params = _params(request, ("limit",))
        report = await read_channels(engine, limit=_whole(params, "limit", 50, 0, MAX_LISTED))
        return JSONResponse(report.as_dict())

    api = {"/summary": summary, "/revenue": revenue, "/revenue.csv": revenue_file,
           "/payments": payments, "/payments.csv": payments_file, "/pending": pending,
           "/failures": failures, "/chain-fees": chain_fees, "/chain-fees.csv": chain_fees_file,
           "/channels": channels}
    return [*(Route(path, _checked(handler), methods=["GET"]) for path, handler in api.items()),
            *extra_routes]


def page_routes() -> list[BaseRoute]:
    """The operator page's static files (agent/operator/operator_page/, package data), read once."""
    folder = resources.files("agent.operator") / "operator_page"
    routes: list[BaseRoute] = []
    for path, (name, media_type) in PAGE_FILES.items():
        content = (folder / name).read_bytes()

        async def serve(request: Request, content: bytes = content, media_type: str = media_type
                        ) -> Response:
            return Response(content, media_type=media_type, headers=PAGE_HEADERS)
        routes.append(Route(path, serve, methods=["GET"]))
    return routes


def admin_mount(token: str, engine: AsyncEngine, extra_routes: Sequence[BaseRoute] = (),
                prices: FeePrices | None = None) -> Mount:
    """`/admin`: the page's static shell, and the API (with `extra_routes`) behind the token.
    Any other path under /admin needs the token too (then 404). `prices`: the native tokens'
    USD prices, for the chain fees."""
    guarded = Mount("", routes=admin_routes(Accounting(engine, prices), engine, extra_routes),
                    middleware=[Middleware(BearerGate, token=token)])
    return Mount("/admin", routes=[*page_routes(), guarded])
