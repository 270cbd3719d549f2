"""A bounded property-based fuzz of every face: JSON routes, multipart routes, the catalogue's query
parameters, /a2a, /mcp and the headers that carry JSON (payments, Sign-In-With-X). Whatever is
sent: no 5xx, no hang, errors in the route's shape, and nothing charged but what was delivered
(merchant balances and settled ledger rows move only by the receipts of delivered answers: nothing
here signs, but a mutation of a field the payer does not sign still leaves a valid payment)."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.model_env import Env
from tests.support.paying import EVM_NET, SOL_NET, client_for, header, quote, receipt, sign

pytestmark = pytest.mark.usefixtures("reset_upstreams")

# 60 examples each, the same every run; PAYWIRE_FUZZ_EXAMPLES=600 searches longer, at random.
EXAMPLES = os.environ.get("PAYWIRE_FUZZ_EXAMPLES")
FUZZ = settings(max_examples=int(EXAMPLES or 60), derandomize=EXAMPLES is None, deadline=None,
                database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
TIMEOUT = httpx.Timeout(20)  # a hang fails the test

MODELS = ["gpt-4o-mini", "gpt-4o", "text-embedding-3-small", "tts-1", "whisper-1", "dall-e-3",
          "gpt-3.5-turbo-instruct", "no-such-model", ""]
OPENAI_JSON_ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/edits", "/v1/embeddings",
                      "/v1/audio/speech", "/v1/audio/generations", "/v1/images/generations"]
MARKETPLACE = "/v1/marketplace/api/"
RESOURCES = ["token-count-508", "help", "webhook-test-payload", "changelog-generate",
             "restaurant-menu-image-generate", "no-such-resource", "token-count-508/../help"]
FORM_ROUTES = ["/v1/audio/transcriptions", "/v1/audio/translations", "/v1/images/edits"]
FIELDS = ["model", "messages", "prompt", "input", "max_tokens", "max_completion_tokens", "n",
          "best_of", "stream", "stream_options", "temperature", "tools", "response_format", "size",
          "quality", "voice", "text", "instruction", "dimensions", "encoding_format",
          "duration_seconds", "url", "role", "content", "skill", "operation"]

scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40)
           | st.sampled_from(MODELS))
json_values = st.recursive(
    scalars,
    lambda inner: (st.lists(inner, max_size=4)
                   | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), inner,
                                     max_size=5)),
    max_leaves=20,
)
messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "x"]),
     "content": st.text(max_size=30) | json_values}), max_size=3)
model_bodies = st.fixed_dictionaries(
    {"model": st.sampled_from(MODELS)},
    optional={name: json_values for name in FIELDS if name != "model"} | {"messages": messages})


def _raw_json(value: Any) -> bytes:
    return json.dumps(value).encode()


# Raw bodies that are not a JSON object, or not JSON at all.
raw_bodies = st.one_of(
    json_values.map(_raw_json),
    st.binary(max_size=200),
    st.text(max_size=200).map(str.encode),
    st.sampled_from([b"", b"{", b'{"a": NaN}', b'{"a": 1e999}', b'"\\ud800"', b"[" * 70,
                     b'{"model": "gpt-4o", "messages": "\\u0000"}']),
)


class Charges:
    """What the merchant holds and how many ledger rows settled: they move only by the receipts
    of answers that delivered a result, once per transaction (a payment sent again gets the kept
    answer with the same receipt, and is not charged again)."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.before = self._now()
        self.delivered = {"evm": 0, "solana": 0}
        self.count = 0
        self.transactions: set[str] = set()

    def _now(self) -> tuple[dict[str, int], int]:
        runtime = self.env.gateway
        balances = runtime.devnet.merchant_balances()
        return ({"evm": balances.evm, "solana": balances.solana},
                len(runtime.ledger_rows(state="settled")))

    def seen(self, response: httpx.Response) -> None:
        if response.status_code == 200 and "PAYMENT-RESPONSE" in response.headers:
            paid = receipt(response)
            if paid["transaction"] in self.transactions:
                return
            self.transactions.add(paid["transaction"])
            self.delivered["evm" if paid["network"].startswith("eip155:") else "solana"] += int(
                paid["amount"])
            self.count += 1

    def assert_only_delivered_charged(self) -> None:
        (balances, settled), (was, settled_before) = self._now(), self.before
        assert {k: balances[k] - was[k] for k in balances} == self.delivered
        assert settled - settled_before == self.count


@pytest.fixture
def charges(env: Env) -> Iterator[Charges]:
    watch = Charges(env)
    yield watch
    watch.assert_only_delivered_charged()


def _check(path: str, response: httpx.Response) -> None:
    """No 5xx; a JSON answer in the route's shape."""
    assert response.status_code < 500, (path, response.status_code, response.text[:500])
    if response.status_code == 200:
        return  # a free call (help, a free model) or a paid-for one (none here: nothing signs)
    body = response.json()
    if response.status_code == 402:  # on /a2a too: a refused header payment is x402's answer
        assert body["x402Version"] == 1 and body["accepts"], body
        return
    if path.startswith(("/a2a", "/mcp")):
        assert body["jsonrpc"] == "2.0" and ("error" in body or "result" in body), body
        if "error" in body:  # a JSON-RPC error code, never the SDK's 0 for an exception
            assert body["error"]["code"] <= -32000 and body["error"]["message"], body
        return
    if path.startswith(("/api/marketplace", MARKETPLACE)):
        assert body["success"] is False, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, body
    assert isinstance(error["message"], str) and error["message"]


@FUZZ
@given(path=st.sampled_from(OPENAI_JSON_ROUTES), body=model_bodies)
def test_model_routes_with_fuzzed_fields(env: Env, charges: Charges, path: str,
                                         body: dict[str, Any]) -> None:
    body.pop("stream", None)  # a stream of a free model would be a 200 we do not read here
    response = httpx.post(env.gateway.url + path, json=body, timeout=TIMEOUT)
    _check(path, response)


@FUZZ
@given(path=st.sampled_from(OPENAI_JSON_ROUTES + [MARKETPLACE + r for r in RESOURCES]),
       body=raw_bodies)
def test_json_routes_with_raw_bodies(env: Env, charges: Charges, path: str, body: bytes) -> None:
    response = httpx.post(env.gateway.url + path, content=body, timeout=TIMEOUT,
                          headers={"content-type": "application/json"})
    _check(path, response)


@FUZZ
@given(resource=st.sampled_from(RESOURCES), body=st.dictionaries(
    st.sampled_from(FIELDS) | st.text(max_size=8), json_values, max_size=6))
def test_marketplace_with_fuzzed_inputs(env: Env, charges: Charges, resource: str,
                                        body: dict[str, Any]) -> None:
    path = MARKETPLACE + resource
    _check(path, httpx.post(env.gateway.url + path, json=body, timeout=TIMEOUT))


form_parts = st.lists(st.tuples(
    st.sampled_from(["file", "image", "model", "prompt", "n", "size", "temperature", "language",
                     "response_format", "image[]", "x", ""]),
    st.none() | st.sampled_from(["a.wav", "a.png", "", "x\"y.mp3"]),
    st.binary(max_size=64) | st.sampled_from([b"whisper-1", b"gpt-image-1", b"2", b"1e999",
                                               b"9" * 5000, b"RIFF\x00\x00\x00\x00WAVEfmt "])),
    max_size=5)


def _multipart(parts: list[tuple[str, str | None, bytes]], boundary: str) -> bytes:
    out = b""
    for name, filename, data in parts:
        disposition = f'form-data; name="{name}"' + (
            f'; filename="{filename}"' if filename is not None else "")
        out += (f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode()
                + data + b"\r\n")
    return out + f"--{boundary}--\r\n".encode()


@FUZZ
@given(path=st.sampled_from(FORM_ROUTES), parts=form_parts,
       boundary=st.sampled_from(["b0undary", "x", ""]), mangle=st.booleans(),
       noise=st.binary(max_size=100))
def test_multipart_routes(env: Env, charges: Charges, path: str,
                          parts: list[tuple[str, str | None, bytes]], boundary: str, mangle: bool,
                          noise: bytes) -> None:
    body = noise if mangle else _multipart(parts, boundary or "b")
    response = httpx.post(env.gateway.url + path, content=body, timeout=TIMEOUT,
                          headers={"content-type": f"multipart/form-data; boundary={boundary}"})
    _check(path, response)


query_values = st.text(max_size=12) | st.integers(-5, 10**30).map(str) | st.just("")


@FUZZ
@given(params=st.dictionaries(st.sampled_from(["page", "page_size", "category", "q", "keyword",
                                                "x"]), query_values, max_size=5))
def test_catalogue_query_parameters(env: Env, charges: Charges, params: dict[str, str]) -> None:
    path = "/api/marketplace/apis"
    response = httpx.get(env.gateway.url + path, params=params, timeout=TIMEOUT)
    _check(path, response)
    if response.status_code == 200:
        data = response.json()["data"]
        assert data["page_size"] <= 100 and len(data["items"]) <= data["page_size"]


A2A_METHODS = ["message/send", "message/stream", "tasks/get", "tasks/cancel", "tasks/list",
               "SendMessage", "GetTask", "ListTasks", "CancelTask", "GetExtendedAgentCard",
               "tasks/resubscribe", "nope", ""]
a2a_messages = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "ROLE_USER", "agent", 5]),
     "messageId": st.text(max_size=10),
     "parts": st.lists(st.one_of(
         st.fixed_dictionaries({"kind": st.just("data"), "data": st.fixed_dictionaries(
             {"skill": st.sampled_from(RESOURCES + MODELS), "input": json_values})}),
         st.fixed_dictionaries({"text": st.text(max_size=20)}),
         json_values), max_size=3)},
    optional={"taskId": st.text(max_size=10), "metadata": json_values})


@FUZZ
@given(method=st.sampled_from(A2A_METHODS) | json_values,
       params=st.one_of(json_values, st.fixed_dictionaries({"message": a2a_messages}),
                        st.fixed_dictionaries({"id": st.text(max_size=12) | json_values})),
       request_id=st.integers(-5, 5) | st.text(max_size=5) | st.none(),
       version=st.sampled_from([None, "1.0", "0.3", "9"]))
def test_a2a_json_rpc(env: Env, charges: Charges, method: Any, params: Any, request_id: Any,
                      version: str | None) -> None:
    headers = {"A2A-Version": version} if version else {}
    rpc = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    if method in ("message/stream", "SendStreamingMessage"):
        rpc["method"] = "message/send"  # an SSE answer is a 200 stream; its errors are events
    response = httpx.post(env.gateway.url + "/a2a", json=rpc, headers=headers, timeout=TIMEOUT)
    _check("/a2a", response)


MCP_METHODS = ["initialize", "ping", "tools/list", "tools/call", "prompts/list", "nope", ""]
mcp_params = st.one_of(
    json_values,
    st.fixed_dictionaries({"cursor": st.text(alphabet="0123456789²١-x ", max_size=4)
                           | st.text(max_size=6) | json_values}),
    st.fixed_dictionaries({"name": st.sampled_from(RESOURCES + ["chat_completions"]) | json_values,
                           "arguments": json_values},
                          optional={"_meta": st.fixed_dictionaries(
                              {"x402/payment": json_values})}))


@FUZZ
@given(method=st.sampled_from(MCP_METHODS) | json_values, params=mcp_params,
       request_id=st.integers(-5, 5) | st.text(max_size=5) | json_values,
       drop=st.sets(st.sampled_from(["jsonrpc", "id", "params"]), max_size=2))
def test_mcp_json_rpc(env: Env, charges: Charges, method: Any, params: Any, request_id: Any,
                      drop: set[str]) -> None:
    rpc = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    for name in drop:
        del rpc[name]
    response = httpx.post(env.gateway.url + "/mcp", json=rpc, timeout=TIMEOUT, headers={
        "accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-11-25"})
    if response.status_code == 202:  # a notification (no id): nothing to answer
        assert not response.content
        return
    _check("/mcp", response)
    assert response.json()["id"] in (None, rpc.get("id"))  # its request's id, or null: JSON-RPC


@pytest.fixture(scope="module")
def signed(env: Env) -> dict[str, dict[str, Any]]:
    """One real payment per chain for the token-count-508 quote, as JSON to mutate."""
    keys = env.gateway.devnet.keys
    _, required = quote(f"{env.gateway.url}{MARKETPLACE}token-count-508", PAID_BODY)
    payer = client_for(env.gateway.url, evm_key=keys.evm_payer, sol_key=keys.sol_payer)
    return {net: json.loads(base64.b64decode(header(sign(payer, required, net))))
            for net in (EVM_NET, SOL_NET)}


PAID_BODY = {"text": "fuzzing payments", "model": "gpt-4o"}


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a leaf of a JSON value."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _paths(v, (*prefix, k))] or [prefix]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _paths(v, (*prefix, i))] or [prefix]
    return [prefix]


def _set(value: Any, path: tuple[Any, ...], leaf: Any) -> Any:
    if not path:
        return leaf
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = _set(value[path[0]], path[1:], leaf)
    return copy


@st.composite
def mutated_payments(draw: st.DrawFn, signed: dict[str, dict[str, Any]]) -> tuple[str, str]:
    """A real payment with one to three leaves replaced, in either header, maybe re-encoded."""
    payment = signed[draw(st.sampled_from(sorted(signed)))]
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(payment)))
        payment = _set(payment, path, draw(json_values | st.text(alphabet="0123456789abcdefx",
                                                                    max_size=140)))
    text = json.dumps(payment)
    encoded = draw(st.sampled_from([
        base64.b64encode(text.encode()).decode(), base64.urlsafe_b64encode(text.encode()).decode(),
        text, base64.b64encode(text.encode()).decode()[:-3]]))
    return draw(st.sampled_from(["PAYMENT-SIGNATURE", "X-PAYMENT"])), encoded


# The body of a paid call on each face a header payment reaches.
PAID_CALLS = {
    f"{MARKETPLACE}token-count-508": PAID_BODY,
    "/v1/chat/completions": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]},
    "/a2a": {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {
        "role": "user", "messageId": "m", "parts": [
            {"kind": "data", "data": {"skill": "token-count-508", "input": PAID_BODY}}]}}},
}


def test_payment_headers(env: Env, charges: Charges, signed: dict[str, dict[str, Any]]) -> None:
    @FUZZ
    @given(payment=mutated_payments(signed) | st.tuples(
        st.sampled_from(["PAYMENT-SIGNATURE", "X-PAYMENT"]),
        st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=300)))
    def run(payment: tuple[str, str]) -> None:
        for path, body in PAID_CALLS.items():
            response = httpx.post(env.gateway.url + path, json=body, timeout=TIMEOUT,
                                  headers={payment[0]: payment[1]})
            charges.seen(response)  # a mutation of a field nobody signs (resource.mimeType)
            _check(path, response)  # leaves a valid payment: charged, and delivered

    run()


@st.composite
def hostile_json(draw: st.DrawFn) -> bytes:
    """JSON nested 1 to 5,000 deep (arrays, objects or both, maybe unclosed), or holding a number
    of up to 6,000 digits."""
    if draw(st.booleans()):
        return b'{"x402Version": ' + b"7" * draw(st.integers(1, 6000)) + b"}"
    depth = draw(st.sampled_from([64, 65, 1200, 5000]) | st.integers(1, 2000))
    opener = draw(st.sampled_from([b"[", b'{"a":', b'[{"a":']))
    closer = {b"[": b"]", b'{"a":': b"}", b'[{"a":': b"}]"}[opener]
    return opener * depth + b"1" + closer * draw(st.sampled_from([depth, 0, depth // 2]))


@FUZZ
@given(name=st.sampled_from(["PAYMENT-SIGNATURE", "X-PAYMENT", "SIGN-IN-WITH-X"]),
       raw=hostile_json(), urlsafe=st.booleans(), path=st.sampled_from(sorted(PAID_CALLS)))
def test_headers_carrying_hostile_json(env: Env, charges: Charges, name: str, raw: bytes,
                                       urlsafe: bool, path: str) -> None:
    value = (base64.urlsafe_b64encode if urlsafe else base64.b64encode)(raw).decode()
    response = httpx.post(env.gateway.url + path, json=PAID_CALLS[path], timeout=TIMEOUT,
                          headers={name: value})
    _check(path, response)
