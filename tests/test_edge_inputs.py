"""Bad input meets the one edge (agent/edge/) on every face, against a live devnet gateway: JSON
inside x402 headers (payments, Sign-In-With-X) read by the bounded reader bodies use; the JSON-RPC
envelope of /a2a and /mcp checked field by field; params refused without quoting the caller; the
MCP cursor and methods; a browser's Origin. Every assertion is on the first answer a client sees:
never a 500, always the face's error shape naming what is wrong."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from agent.settings import ConfigError, Settings
from tests.support.live_server import LiveServer, start_server
from tests.support.openai_upstream import OpenAIUpstream

ALLOWED = "https://app.example.com"  # PAYWIRE_ALLOWED_ORIGINS of the gateway below
MCP_HEADERS = {"accept": "application/json, text/event-stream"}
PAID_BODY = {"text": "edge inputs", "model": "gpt-4o"}
CHAT_BODY = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
REST_ROUTES = {"/v1/marketplace/api/token-count-508": PAID_BODY, "/v1/chat/completions": CHAT_BODY}
TIMEOUT = 30
SECRET = "CALLER-SECRET-7f3a"  # must never come back in an answer


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A devnet gateway whose chat models answer (a stand-in upstream), with one extra origin."""
    upstream = OpenAIUpstream("openai").start()
    live = start_server(tmp_path_factory.mktemp("edge-inputs"), env={
        "OPENAI_BASE_URL": upstream.url, "OPENAI_API_KEY": "sk-test-openai",
        "PAYWIRE_ALLOWED_ORIGINS": f"{ALLOWED}, http://Tools.Example.com:8080"})
    yield live
    live.stop()
    upstream.stop()


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


# JSON a header carries that breaks a structural limit, and what the refusal must say.
HOSTILE_JSON = {
    "arrays 1,200 deep (3 KB)": (_b64(b"[" * 1200 + b"]" * 1200), "nested deeper than 64"),
    "objects 800 deep": (_b64(b'{"a":' * 800 + b"1" + b"}" * 800), "nested deeper than 64"),
    "a 5,000-digit number": (_b64(b'{"x402Version": ' + b"9" * 5000 + b"}"),
                             "longer than 100 digits"),
}


def _post(gateway: LiveServer, path: str, body: Any, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{gateway.url}{path}", json=body, headers=headers, timeout=TIMEOUT)


def _rpc(method: Any = "tasks/get", params: Any = None, rpc_id: Any = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rpc_id, "method": method,
            "params": {"id": "no-such-task"} if params is None else params}


def _send(skill: str = "token-count-508", data: Any = None) -> dict[str, Any]:
    return _rpc("message/send", {"message": {"role": "user", "messageId": "m", "parts": [
        {"kind": "data", "data": {"skill": skill, "input": data or PAID_BODY}}]}})


@pytest.mark.parametrize("case", sorted(HOSTILE_JSON))
@pytest.mark.parametrize("header", ["PAYMENT-SIGNATURE", "X-PAYMENT"])
@pytest.mark.parametrize("path", sorted(REST_ROUTES))
def test_json_in_a_payment_header_is_bounded_on_rest(gateway: LiveServer, path: str, header: str,
                                                      case: str) -> None:
    value, says = HOSTILE_JSON[case]
    answer = _post(gateway, path, REST_ROUTES[path], {header: value})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_payment_header" and error["param"] == header
    assert error["message"].startswith(header) and says in error["message"]
    assert ("success" in answer.json()) == path.startswith("/v1/marketplace")


@pytest.mark.parametrize("case", sorted(HOSTILE_JSON))
@pytest.mark.parametrize("header", ["PAYMENT-SIGNATURE", "X-PAYMENT"])
def test_json_in_a_payment_header_is_bounded_on_a2a(gateway: LiveServer, header: str,
                                                     case: str) -> None:
    """The call is refused as A2A refuses a call: a failed task naming the header (nothing run)."""
    value, says = HOSTILE_JSON[case]
    answer = _post(gateway, "/a2a", _send(), {header: value})
    assert answer.status_code == 200, answer.text
    status = answer.json()["result"]["status"]
    error = status["message"]["metadata"]["paywire.error"]
    assert status["state"] == "failed" and error["code"] == "invalid_payment_header"
    assert error["param"] == header and says in error["message"] and error["status"] == 400


@pytest.mark.parametrize("case", [*sorted(HOSTILE_JSON), "larger than 16 KiB"])
def test_json_in_a_sign_in_with_x_header_is_bounded(gateway: LiveServer, case: str) -> None:
    value, says = HOSTILE_JSON.get(case, ("A" * 20_000, "at most 16384 bytes"))
    answer = _post(gateway, "/a2a", _rpc(), {"SIGN-IN-WITH-X": value})
    assert answer.status_code == 401, answer.text  # identity: an HTTP client acts on it
    body = answer.json()
    assert body["jsonrpc"] == "2.0" and body["id"] == 1
    assert body["error"]["message"].startswith("SIGN-IN-WITH-X") and says in body["error"]["message"]


MISSING = object()
ENVELOPE_CASES = [
    ("method", ["message/send"]), ("method", {"name": "tasks/get"}), ("method", 5),
    ("method", ""), ("method", None), ("method", MISSING),
    ("id", [1]), ("id", {"a": 1}), ("id", True), ("id", 1.5), ("id", 2**64), ("id", "x" * 300),
    ("jsonrpc", "1.0"), ("jsonrpc", 2.0), ("jsonrpc", ["2.0"]), ("jsonrpc", MISSING),
    ("params", "x"), ("params", 5), ("params", True), ("params", None),
]


@pytest.mark.parametrize(("face", "field", "value"), [
    *((face, field, value) for face in ("/a2a", "/mcp") for field, value in ENVELOPE_CASES),
    ("/mcp", "id", None)],  # (A2A takes a null id)
    ids=lambda v: repr(v)[:20])
def test_a_json_rpc_envelope_field_of_the_wrong_type_is_an_invalid_request(
        gateway: LiveServer, face: str, field: str, value: Any) -> None:
    request = _rpc("tasks/get" if face == "/a2a" else "tools/list", {} if face == "/mcp" else None)
    if value is MISSING:
        del request[field]
    else:
        request[field] = value
    answer = _post(gateway, face, request, MCP_HEADERS)
    # A2A answers JSON-RPC errors in HTTP 200 (its TCK's rule); MCP's transport says 400
    assert answer.status_code == (200 if face == "/a2a" else 400), answer.text
    body = answer.json()
    assert body["jsonrpc"] == "2.0" and body["id"] == (None if field == "id" else 1)
    # data: paywire's stable code and status only, nothing of the caller's request
    assert body["error"] == {"code": -32600, "message": body["error"]["message"],
                             "data": {"code": "invalid_request", "status": 400}}
    assert f"'{field}'" in body["error"]["message"]


def test_positional_params_batches_and_bad_replies_are_refused_naming_why(
        gateway: LiveServer) -> None:
    for face in ("/a2a", "/mcp"):
        status = 200 if face == "/a2a" else 400
        positional = _post(gateway, face, _rpc("tools/list", [1, 2]), MCP_HEADERS)
        assert positional.status_code == status
        assert positional.json()["error"]["code"] == -32602
        assert "'params' must be an object" in positional.json()["error"]["message"]
        batch = _post(gateway, face, [_rpc("tools/list", {})], MCP_HEADERS)
        assert batch.status_code == status and batch.json()["error"]["code"] == -32600
        assert "batch" in batch.json()["error"]["message"]
    reply = _post(gateway, "/mcp", {"jsonrpc": "2.0", "id": 4, "result": [SECRET]}, MCP_HEADERS)
    assert reply.status_code == 400 and reply.json()["id"] == 4
    assert reply.json()["error"]["code"] == -32600 and "'result'" in reply.json()["error"]["message"]
    assert SECRET not in reply.text
    answered = _post(gateway, "/mcp", {"jsonrpc": "2.0", "id": 4, "result": {}}, MCP_HEADERS)
    assert answered.status_code == 202  # a client's reply is taken (stateless: nothing awaits it)


PARAMS_CASES = [
    ("GetTask", {"id": "t", "historyLength": SECRET}, "params.historyLength", "whole number"),
    ("GetTask", {"id": 5}, "params.id", "string"),
    ("SendMessage", {"message": {"role": "ROLE_USER", "messageId": "m", "parts": SECRET}},
     "params.message.parts", "list of Part"),
    ("SendMessage", {"message": {"role": "ROLE_USER", "messageId": "m", "parts": [],
                                 "metadata": [SECRET]}}, "params.message.metadata", "object"),
    ("ListTasks", {"pageSize": {"n": SECRET}}, "params.pageSize", "whole number"),
]


@pytest.mark.parametrize(("method", "params", "field", "kind"), PARAMS_CASES)
def test_a2a_params_errors_name_the_field_and_never_quote_the_caller(
        gateway: LiveServer, method: str, params: dict[str, Any], field: str, kind: str) -> None:
    answer = _post(gateway, "/a2a", _rpc(method, params), {})
    assert answer.status_code == 200, answer.text
    error = answer.json()["error"]
    assert error == {"code": -32602, "message": error["message"],
                     "data": {"code": "invalid_params", "status": 400}}
    assert field in error["message"] and kind in error["message"]
    assert SECRET not in answer.text


@pytest.mark.parametrize(("body", "code", "says"), [
    (b"", -32600, "empty"), (b"{", -32700, "not valid JSON"), (b"[" * 100, -32700, "deeper than 64"),
    (b'{"jsonrpc": "2.0", "id": ' + b"9" * 200 + b"}", -32700, "longer than 100 digits"),
    (b'{"x": "' + b"a" * 1_100_000 + b'"}', -32600, "larger than 1048576 bytes"),
])
def test_a2a_answers_every_json_rpc_error_in_http_200(gateway: LiveServer, body: bytes, code: int,
                                                      says: str) -> None:
    answer = httpx.post(f"{gateway.url}/a2a", content=body, timeout=TIMEOUT,
                        headers={"content-type": "application/json"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["error"]["code"] == code and says in answer.json()["error"]["message"]


def _mcp(gateway: LiveServer, method: str, params: dict[str, Any] | None = None,
         headers: dict[str, str] | None = None) -> httpx.Response:
    request: dict[str, Any] = {"jsonrpc": "2.0", "id": 3, "method": method}
    if params is not None:
        request["params"] = params
    return _post(gateway, "/mcp", request, {**MCP_HEADERS, **(headers or {})})


def test_an_mcp_cursor_the_server_did_not_give_is_invalid_params(gateway: LiveServer) -> None:
    for cursor in ["²", "١", "-1", "1e3", " 1", "0x10", "", "9" * 30, "1" * 10]:
        answer = _mcp(gateway, "tools/list", {"cursor": cursor})
        assert answer.status_code == 200
        error = answer.json()["error"]
        assert error["code"] == -32602 and "'cursor'" in error["message"], (cursor, error)
        assert "int()" not in error["message"]


def test_an_unknown_mcp_method_is_method_not_found(gateway: LiveServer) -> None:
    for method in ["nope", "tools/nope", "tools/list/", "prompts/list"]:  # the last: MCP, not served
        answer = _mcp(gateway, method, {})
        assert answer.status_code == 200 and answer.json()["id"] == 3
        assert answer.json()["error"]["code"] == -32601, (method, answer.text)
    listed = _mcp(gateway, "tools/list", {})
    assert listed.status_code == 200 and listed.json()["result"]["tools"]
    notified = _post(gateway, "/mcp", {"jsonrpc": "2.0", "method": "notifications/nope"},
                     MCP_HEADERS)
    assert notified.status_code == 202 and not notified.content  # a notification gets no answer


INITIALIZE = {"protocolVersion": "2025-11-25", "capabilities": {},
              "clientInfo": {"name": "edge-test", "version": "1"}}


FOREIGN = ["http://evil.example.com", "null", "https://app.example.com.evil.test",
           "http://127.0.0.1:1", "https://app.example.com:8443", "garbage"]


def test_mcp_serves_its_own_and_the_configured_origins_and_refuses_others(
        gateway: LiveServer) -> None:
    """MCP's transport: a browser page from an origin not allowed gets a 403 (DNS rebinding), on
    every method; clients without Origin, the gateway's own pages and configured ones are served."""
    for origin in FOREIGN:
        for method in ("POST", "GET"):
            answer = httpx.request(method, f"{gateway.url}/mcp", timeout=TIMEOUT, json={
                "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INITIALIZE},
                headers={**MCP_HEADERS, "Origin": origin})
            assert answer.status_code == 403, (origin, method, answer.text)
            body = answer.json()
            assert "result" not in body and body["error"]["code"] == -32600
            assert "PAYWIRE_ALLOWED_ORIGINS" in body["error"]["message"]
    port = gateway.url.rsplit(":", 1)[1]
    for origin in [None, gateway.url, f"http://localhost:{port}", f"http://[::1]:{port}",
                   ALLOWED, "https://APP.example.com:443", "http://tools.example.com:8080"]:
        answer = _mcp(gateway, "initialize", INITIALIZE, {"Origin": origin} if origin else {})
        assert answer.status_code == 200, (origin, answer.text)
        assert answer.json()["result"]["serverInfo"]["name"] == "paywire"


def test_every_acting_route_refuses_a_foreign_origin_and_public_reads_stay_open(
        gateway: LiveServer) -> None:
    evil = {"Origin": "http://evil.example.com"}
    a2a = _post(gateway, "/a2a", _send(), evil)
    assert a2a.status_code == 403 and a2a.json()["error"]["code"] == -32600
    market = _post(gateway, "/v1/marketplace/api/help", {}, evil)
    assert market.status_code == 403 and market.json()["success"] is False
    assert market.json()["error"]["code"] == "origin_not_allowed"
    assert market.json()["error"]["param"] == "Origin"
    chat = _post(gateway, "/v1/chat/completions", CHAT_BODY, evil)
    assert chat.status_code == 403 and chat.json()["error"]["code"] == "origin_not_allowed"
    card = httpx.get(f"{gateway.url}/.well-known/agent-card.json", headers=evil, timeout=TIMEOUT)
    assert card.status_code == 200 and card.headers["access-control-allow-origin"] == "*"
    mine = _post(gateway, "/v1/marketplace/api/help", {}, {"Origin": ALLOWED})
    assert mine.status_code == 200


@pytest.mark.parametrize("value", ["https://app.example.com/path", "ftp://app.example.com",
                                   "app.example.com", "https://user@app.example.com",
                                   "https://app.example.com?x=1"])
def test_allowed_origins_must_be_origins(value: str) -> None:
    with pytest.raises(ConfigError, match="PAYWIRE_ALLOWED_ORIGINS"):
        Settings.from_env({"PAYWIRE_ALLOWED_ORIGINS": f"https://ok.example.com,{value}"})
    settings = Settings.from_env({"PAYWIRE_ALLOWED_ORIGINS": "HTTPS://Ok.Example.com:443/"})
    assert settings.allowed_origins == ("https://ok.example.com",)
