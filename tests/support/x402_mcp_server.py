"""A small x402 MCP server for tests: streamable HTTP on a loopback port, paid tools behind the x402
SDK's MCP payment wrapper (`x402.mcp.server_async.create_payment_wrapper`: the tool-result
binding of x402's MCP transport), verified and settled by the SDK's facilitator on a devnet.

Tools (listed two to a page, so a client must follow `nextCursor`): `echo` (free), `weather`
($0.01), `forecast` ($0.05), `almanac` (free), `tides` ($0.01). Each paid tool accepts both devnet
chains (Base Sepolia, Solana devnet) and pays the devnet's merchant. `calls` records each call:
(tool, whether it carried a payment), never the payment itself.

Two unlisted tools misbehave once paid, as a server can: `ghost` ($0.01) answers the paid call
without a receipt and settles nothing; `grudge` ($0.01) refuses every payment (PaymentRequired
again, with a reason). Neither moves money. A third, `legacy` ($0.01), asks for payment the way
earlier x402 MCP servers did: a JSON-RPC error with code 402 and the quote as its data.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import mcp.types as types
from mcp.server.fastmcp.server import StreamableHTTPASGIApp
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import McpError
from starlette.applications import Starlette
from starlette.routing import Route
from x402 import x402ResourceServer
from x402.mcp.server_async import PaymentWrapperConfig, create_payment_wrapper
from x402.mcp.types import MCPToolResult
from x402.mechanisms.evm.exact import ExactEvmServerScheme
from x402.mechanisms.svm.exact import ExactSvmServerScheme
from x402.schemas import AssetAmount, ResourceConfig, ResourceInfo

from payments.facilitators import in_process_facilitator
from tests.support.live_server import bound_socket, run_in_thread

PAGE = 2
PRICES = {"weather": 10_000, "forecast": 50_000, "tides": 10_000,  # atomic USDC (6 decimals)
          "ghost": 10_000, "grudge": 10_000, "legacy": 10_000}
MISBEHAVING = ("ghost", "grudge")
FREE = ("echo", "almanac")
ORDER = ("echo", "weather", "forecast", "almanac", "tides")
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 100}},
          "required": ["city"], "additionalProperties": False}


@dataclass
class X402McpServer:
    url: str
    calls: list[tuple[str, bool]] = field(default_factory=list)
    _stop: Any = None

    def stop(self) -> None:
        if self._stop is not None:
            self._stop()
            self._stop = None


def _tool(name: str) -> types.Tool:
    price = PRICES.get(name)
    cost = f"${price / 1_000_000:.2f} a call (x402)" if price else "free"  # display only
    return types.Tool(name=name, description=f"The {name} of a city; {cost}.", inputSchema=SCHEMA)


async def _answer(name: str, args: dict[str, Any]) -> dict[str, Any]:
    text = json.dumps({"tool": name, "city": args.get("city"), "answer": f"{name} for {args.get('city')}"})
    return {"content": [{"type": "text", "text": text}]}


def _call_tool_result(result: MCPToolResult) -> types.CallToolResult:
    return types.CallToolResult.model_validate({
        "content": result.content, "isError": result.is_error,
        "structuredContent": result.structured_content, "_meta": result.meta or None})


def start_x402_mcp_server(devnet: Any) -> X402McpServer:
    """Serve the tools on a free loopback port; paid ones settle on `devnet` (payments.devnet)."""
    evm_signer, svm_signer = devnet.signers()
    facilitator = in_process_facilitator(devnet.networks, evm_signer=evm_signer,
                                         svm_signer=svm_signer, workers=4)
    resource_server = x402ResourceServer(facilitator)
    for pay_to in devnet.pay_to():
        scheme = ExactEvmServerScheme() if pay_to.network.family == "evm" else ExactSvmServerScheme()
        resource_server.register(pay_to.network.caip2, scheme)
    resource_server.initialize()

    def accepts(atomic: int) -> list[Any]:
        built = []
        for pay_to in devnet.pay_to():
            built += resource_server.build_payment_requirements(ResourceConfig(
                scheme="exact", pay_to=pay_to.pay_to, network=pay_to.network.caip2,
                price=AssetAmount(amount=str(atomic), asset=pay_to.asset or pay_to.network.usdc),
                max_timeout_seconds=120))
        return built

    paid = {
        name: create_payment_wrapper(resource_server, PaymentWrapperConfig(
            accepts=accepts(price),
            resource=ResourceInfo(url=f"mcp://tool/{name}", description=f"The {name} of a city",
                                  mime_type="application/json")))(_answer_as(name))
        for name, price in PRICES.items()
    }
    served = X402McpServer(url="")
    server: Server[Any] = Server("x402-test-tools")

    @server.list_tools()
    async def list_tools(request: types.ListToolsRequest) -> types.ListToolsResult:
        params = getattr(request, "params", None)  # None: the SDK refreshing its tool cache
        cursor = params.cursor if params else None
        start = int(cursor) if cursor and cursor.isdigit() else 0
        page = ORDER[start:start + PAGE]
        more = start + PAGE < len(ORDER)
        return types.ListToolsResult(tools=[_tool(n) for n in page],
                                     nextCursor=str(start + PAGE) if more else None)

    @server.call_tool(validate_input=False)
    async def call_tool(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        meta = server.request_context.meta
        extra = dict(meta.model_extra or {}) if meta is not None else {}
        served.calls.append((name, "x402/payment" in extra))
        if name in FREE:
            answer = await _answer(name, arguments)
            return types.CallToolResult.model_validate(answer)
        if name not in paid:
            return types.CallToolResult(content=[types.TextContent(type="text", text="no such tool")],
                                        isError=True)
        if name in MISBEHAVING and "x402/payment" in extra:
            if name == "ghost":  # delivered, no receipt, nothing settled
                return types.CallToolResult.model_validate(await _answer(name, arguments))
            extra = {}  # grudge: asks again, as if the payment were not valid
            quote = _call_tool_result(await paid[name](arguments, {"_meta": extra, "toolName": name}))
            assert quote.structuredContent is not None
            quote.structuredContent["error"] = "invalid_exact_evm_payload_signature"
            return quote
        return _call_tool_result(await paid[name](arguments, {"_meta": extra, "toolName": name}))

    by_result = server.request_handlers[types.CallToolRequest]

    async def call_tool_or_402(request: types.CallToolRequest) -> Any:
        """`legacy` unpaid: the quote as a JSON-RPC error 402 (the SDK sends McpError as one)."""
        meta = request.params.meta
        if request.params.name == "legacy" and not (meta and "x402/payment" in (meta.model_extra or {})):
            quote = await paid["legacy"](request.params.arguments or {}, {"_meta": {}, "toolName": "legacy"})
            raise McpError(types.ErrorData(code=402, message="Payment required",
                                           data=quote.structured_content))
        return await by_result(request)

    server.request_handlers[types.CallToolRequest] = call_tool_or_402
    manager = StreamableHTTPSessionManager(app=server, stateless=False)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with manager.run():
            yield

    app = Starlette(routes=[Route("/mcp", endpoint=StreamableHTTPASGIApp(manager))], lifespan=lifespan)
    sock, port = bound_socket()
    uvicorn_server, thread = run_in_thread(app, sock)
    served.url = f"http://127.0.0.1:{port}/mcp"

    def stop() -> None:
        uvicorn_server.should_exit = True
        thread.join(timeout=15)
        facilitator.close()

    served._stop = stop
    return served


def _answer_as(name: str) -> Any:
    async def handler(args: dict[str, Any], context: Any) -> dict[str, Any]:
        return await _answer(name, args)

    return handler
