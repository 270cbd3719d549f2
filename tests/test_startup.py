"""Startup as an operator meets it, `paywire serve` in a real process: a configuration problem
ends with one line naming every variable or file at fault (exit code 2, no traceback); a
facilitator that is down at startup does not stop the gateway, which says it is not ready until
the facilitator answers, then takes payments."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from eth_account import Account
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from x402 import x402FacilitatorSync
from x402.mechanisms.evm.exact import register_exact_evm_facilitator

from payments.devnet.evm import EvmDevnet
from payments.networks import SOLANA_DEVNET
from tests.support.facilitator_server import facilitator_app
from tests.support.live_server import bound_socket, run_in_thread
from tests.support.paying import EVM_NET, pay_once, receipt
from tests.support.served_process import (
    PAYWIRE,
    ROOT,
    free_port,
    paywire_env,
    start_paywire,
    stop,
)

PREFIX = "paywire: configuration error: "
MERCHANT = "0x" + "12" * 20
BODY = {"text": "Paid once the facilitator is up.", "model": "gpt-4o-mini"}


def serve_once(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`paywire serve` that must stop before it serves."""
    return subprocess.run([*PAYWIRE, "serve", *args, "--log-level", "warning"],
                          env=paywire_env(tmp_path / ".paywire", **env), cwd=ROOT, text=True,
                          capture_output=True, timeout=120, stdin=subprocess.DEVNULL)


def serve_and_fail(tmp_path: Path, *args: str, **env: str) -> str:
    """`paywire serve` that must stop on its configuration: the one line it printed."""
    done = serve_once(tmp_path, *args, **env)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith(PREFIX)]
    assert len(lines) == 1, done.stderr
    assert "LOCAL TEST CHAIN" not in done.stderr  # no banner for a gateway that does not start
    return lines[0]


def production(facilitator_url: str) -> dict[str, str]:
    return {"PAYWIRE_NETWORKS": "base-sepolia", "PAYWIRE_EVM_PAY_TO": MERCHANT,
            "PAYWIRE_FACILITATOR_URL": facilitator_url}


def test_two_bad_values_are_both_named_in_one_line(tmp_path: Path) -> None:
    line = serve_and_fail(tmp_path, PAYWIRE_PORT="abc", PAYWIRE_MODEL_MARGIN="x")
    assert line.startswith(PREFIX + "2 problems: ")
    assert "PAYWIRE_PORT must be a whole number from 1 to 65535, got 'abc'" in line
    assert "PAYWIRE_MODEL_MARGIN must be a decimal fraction from 0 to 10, such as 0.1 (+10%), " \
           "got 'x'" in line


def test_missing_production_settings_are_all_named(tmp_path: Path) -> None:
    line = serve_and_fail(tmp_path, "--port", str(free_port()), PAYWIRE_NETWORKS="base,solana")
    for variable in ("PAYWIRE_EVM_PAY_TO", "PAYWIRE_SOLANA_PAY_TO", "PAYWIRE_EVM_FACILITATOR_KEY",
                     "PAYWIRE_SOLANA_FACILITATOR_KEY"):
        assert variable in line


def test_invalid_resource_files_are_named_with_their_problems(tmp_path: Path) -> None:
    folder = tmp_path / "resources"
    folder.mkdir()
    (folder / "broken.json").write_text('{"id": "broken",')
    (folder / "incomplete.json").write_text(json.dumps({"id": "incomplete", "kind": "python"}))
    line = serve_and_fail(tmp_path, "--port", str(free_port()), PAYWIRE_RESOURCE_DIRS=str(folder))
    assert "PAYWIRE_RESOURCE_DIRS" in line
    assert f"{folder / 'broken.json'}: cannot read JSON" in line
    assert f"{folder / 'incomplete.json'}: missing field 'name'" in line
    assert "field 'handler'" in line


def test_a_facilitator_host_that_does_not_exist_stops_startup(tmp_path: Path) -> None:
    line = serve_and_fail(tmp_path, "--port", str(free_port()),
                          **production("http://paywire-facilitator.invalid"))
    assert "PAYWIRE_FACILITATOR_URL" in line and "'paywire-facilitator.invalid' does not exist" in line
    assert "expected the base URL of an x402 facilitator that settles base-sepolia" in line


def test_a_port_in_use_is_one_line_before_any_banner(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:  # listening: the port is in use
        port = taken.getsockname()[1]
        done = serve_once(tmp_path, "--port", str(port))
    assert done.returncode == 3, done.stderr
    assert done.stderr == (f"paywire: cannot listen on 127.0.0.1:{port}: Address already in use; "
                           "another process listens there: stop it, or choose another port with "
                           "--port or PAYWIRE_PORT\n")


def test_a_postgresql_server_that_cannot_be_reached_is_named_with_what_to_check(tmp_path: Path) -> None:
    sock, port = bound_socket()  # bound, never listening: connections are refused
    try:
        done = serve_once(tmp_path, "--port", str(free_port()), PAYWIRE_DATABASE_URL=(
            f"postgresql+asyncpg://paywire:pw-not-shown@127.0.0.1:{port}/paywire"))
    finally:
        sock.close()
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(f"paywire: database error: PAYWIRE_DATABASE_URL postgresql+asyncpg://"
                           f"paywire:***@127.0.0.1:{port}/paywire: cannot connect: ConnectionRefusedError")
    assert line.endswith(f"; check that the PostgreSQL server is running and accepts connections at "
                         f"127.0.0.1:{port}, and that the user, password and database name are right "
                         "(PAYWIRE_DATABASE_URL: postgresql+asyncpg://USER:PASSWORD@HOST:PORT/DATABASE)")
    assert "pw-not-shown" not in done.stderr and "LOCAL TEST CHAIN" not in done.stderr


async def _solana_only(request: Request) -> Response:
    return JSONResponse({"kinds": [{"x402Version": 2, "scheme": "exact", "network": SOLANA_DEVNET.caip2,
                                    "extra": {"feePayer": "9WzDXwBbmkg8ZTbNMqUxvQRAyrZzDsGYdLVL9zYtAWWM"}}],
                         "extensions": [], "signers": {}})


async def _html(request: Request) -> Response:
    return PlainTextResponse("<html>a web site</html>", media_type="text/html")


@pytest.fixture(scope="module")
def not_facilitators() -> Iterator[dict[str, str]]:
    """Loopback servers that answer, but not as a facilitator for base-sepolia."""
    apps = {"404": Starlette(),
            "html": Starlette(routes=[Route("/supported", _html)]),
            "solana-only": Starlette(routes=[Route("/supported", _solana_only)])}
    running, urls = [], {}
    for name, app in apps.items():
        sock, port = bound_socket()
        running.append(run_in_thread(app, sock))
        urls[name] = f"http://127.0.0.1:{port}"
    yield urls
    for server, thread in running:
        server.should_exit = True
        thread.join(timeout=15)


@pytest.mark.parametrize(("which", "needle"), [
    ("404", "answered 404, so it is not an x402 facilitator"),
    ("html", "answered 200 but not with an x402 list of supported payment kinds"),
    ("solana-only", "does not settle exact payments on base-sepolia (eip155:84532); it settles: "
                    + SOLANA_DEVNET.caip2),
])
def test_a_url_that_is_not_a_facilitator_stops_startup(
    not_facilitators: dict[str, str], tmp_path: Path, which: str, needle: str
) -> None:
    line = serve_and_fail(tmp_path, "--port", str(free_port()), **production(not_facilitators[which]))
    assert line.startswith(PREFIX + "PAYWIRE_FACILITATOR_URL: ") and needle in line


def _wait_ready(url: str, deadline_seconds: float = 60) -> httpx.Response:
    """Poll /readyz with a deadline until it answers 200."""
    deadline = time.monotonic() + deadline_seconds
    while True:
        r = httpx.get(f"{url}/readyz", timeout=5)
        if r.status_code == 200 or time.monotonic() > deadline:
            return r
        time.sleep(0.05)  # polling readiness with a deadline


def test_a_facilitator_down_at_startup_then_up(tmp_path: Path) -> None:
    devnet = EvmDevnet(facilitator_key=Account.create().key.hex(), minter_key=Account.create().key.hex())
    facilitator = x402FacilitatorSync()
    register_exact_evm_facilitator(facilitator, devnet.facilitator_signer(), networks=[EVM_NET])
    merchant, payer = Account.create(), Account.create()
    devnet.mint(payer.address, 100_000)
    sock, facilitator_port = bound_socket()  # reserved now, refusing connections until served
    port = free_port()
    env = paywire_env(tmp_path / ".paywire", PAYWIRE_NETWORKS="base-sepolia",
                      PAYWIRE_EVM_PAY_TO=merchant.address,
                      PAYWIRE_FACILITATOR_URL=f"http://127.0.0.1:{facilitator_port}",
                      PAYWIRE_FACILITATOR_RETRY_MAX_SECONDS="0.5")
    proc = start_paywire(port, env, stderr=subprocess.DEVNULL)  # /health answers: it came up
    server = thread = None
    try:
        url = f"http://127.0.0.1:{port}"
        health = httpx.get(f"{url}/health").json()
        assert health["status"] == "ok" and health["ready"] is False
        ready = httpx.get(f"{url}/readyz")
        assert ready.status_code == 503 and ready.json()["ready"] is False
        assert "did not answer" in ready.json()["not_ready"]["payments"]
        # free routes serve; a paid call is refused before any quote, nothing charged
        assert httpx.get(f"{url}/api/marketplace/apis").status_code == 200
        resource = f"{url}/v1/marketplace/api/token-count-508"
        refused = httpx.post(resource, json=BODY)
        assert refused.status_code == 503 and refused.headers["Retry-After"]
        error = refused.json()["error"]
        assert error["code"] == "facilitator_unavailable"
        assert "retry later, nothing was charged" in error["message"]
        a2a = httpx.post(f"{url}/a2a", json={
            "jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {
                "role": "user", "messageId": "m1", "parts": [{"kind": "data", "data": {
                    "skill": "token-count-508", "input": BODY}}]}}})
        assert a2a.status_code == 503 and "nothing was charged" in a2a.json()["error"]["message"]

        server, thread = run_in_thread(facilitator_app(facilitator), sock)
        ready = _wait_ready(url)
        assert ready.status_code == 200 and ready.json() == {"ready": True}
        assert httpx.get(f"{url}/health").json()["ready"] is True

        paid = pay_once(url, resource, BODY, "0x" + payer.key.hex().removeprefix("0x"))
        assert paid.status_code == 200, paid.text
        assert receipt(paid)["success"] is True
        assert devnet.balance_of(merchant.address) == 5750
    finally:
        stop(proc)
        if server is not None and thread is not None:
            server.should_exit = True
            thread.join(timeout=15)
        else:
            sock.close()
