"""The docs' shell lines run as written: README.md's quick start, docs/discovery.md's curl/jq lines
and docs/a2a.md's A2A call (and its `paywire pay` line, given the page's JSON-RPC body), each by
bash in the folder a user ran `make serve` in, against a live devnet gateway on a free port. The
one change is the address: 127.0.0.1:8000, where the pages say `make serve` listens, becomes the
gateway's. Each answer is checked for what the page says it shows, and every command of a page
must be checked here (or say which test runs it): a line added to a page fails this test until it
is."""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.docs import doc_text, fenced, shell_commands, user_env
from tests.support.live_server import LiveServer, start_server

DOCS_ADDRESS = "127.0.0.1:8000"
EVM_NET = "eip155:84532"
SOL_NET = "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1"
PRICE = 5750  # token-count-508: 0.00575 USD in atomic USDC
CHAT_MINIMUM = "100"  # /v1/chat/completions' minimum: 0.0001 USD


@dataclass
class User:
    """A user's shell in the folder they ran `make serve` in: `.paywire` (the demo payer's keys)
    and `.venv` (paywire's, activated: `paywire` is on PATH) are there."""

    gateway: LiveServer
    folder: Path

    def run(self, command: str) -> str:
        """The command's output, run by bash with the gateway's address for the page's."""
        address = self.gateway.url.removeprefix("http://")
        done = subprocess.run(
            ["bash", "-c", "set -o pipefail\n" + command.replace(DOCS_ADDRESS, address)],
            cwd=self.folder, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
            env=user_env(PATH=f"{Path(sys.prefix) / 'bin'}{os.pathsep}{os.environ['PATH']}"))
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def url(self, path: str) -> str:
        return self.gateway.url + path


@pytest.fixture(scope="module")
def user(tmp_path_factory: pytest.TempPathFactory) -> Iterator[User]:
    for tool in ("curl", "jq"):
        if shutil.which(tool) is None:
            if os.environ.get("CI") == "true":
                pytest.fail(f"`{tool}` is not installed: the docs' lines use it")
            pytest.skip(f"`{tool}` is not installed: the docs' lines use it (apt-get install {tool})")
    folder = tmp_path_factory.mktemp("user")
    (folder / ".venv").symlink_to(Path(sys.prefix))
    # a model provider's key, so the /v1 lines quote (a quote calls no upstream: any key will do);
    # without one they answer 503 `model_unavailable`, as docs/discovery.md says
    gateway = start_server(folder / ".paywire", env={"OPENAI_API_KEY": "sk-placeholder-never-called"})
    yield User(gateway, folder)
    gateway.stop()


Check = Callable[[User, str], None]


def run_page(user: User, commands: list[str], checks: dict[str, Check | str]) -> None:
    """Each command checked by the one check its text starts with, in the page's order; a string
    instead of a check says which test runs that command instead. Every check is used."""
    used = set()
    for command in commands:
        keys = [key for key in checks if command.startswith(key)]
        assert len(keys) == 1, f"no check (or more than one) for the page's command:\n{command}"
        used.add(keys[0])
        check = checks[keys[0]]
        if not isinstance(check, str):
            check(user, command)
    assert used == set(checks), f"checks for commands the page no longer has: {set(checks) - used}"


def page_commands(page: str) -> list[str]:
    return [command for block in fenced(doc_text(page), "bash") for command in shell_commands(block)]


def header_json(output: str, name: str) -> dict[str, Any]:
    """A base64 JSON header of `curl -i`'s output, decoded."""
    [value] = re.findall(rf"^{name}: (\S+)\r?$", output, flags=re.M | re.I)
    return json.loads(base64.b64decode(value))


def amounts(accepts: list[dict[str, Any]], field: str = "amount") -> dict[str, str]:
    return {offer["network"]: offer[field] for offer in accepts}


def paid_output(output: str) -> tuple[str, dict[str, Any], dict[str, str]]:
    """`paywire pay`'s output: the status line, the answer, the receipt's fields."""
    status, answer, receipt_line, *receipt = output.strip().splitlines()
    assert receipt_line == "receipt:", output
    return status, json.loads(answer), dict(line.split(maxsplit=1) for line in receipt)


def latest_payment(user: User) -> dict[str, Any]:
    row = user.gateway.ledger_rows(network=EVM_NET, skill_id="token-count-508")[-1]
    assert row["state"] == "settled" and row["amount_atomic"] == PRICE
    return row


# ---------------------------------------------------------------------------------------------- README


def quoted(user: User, command: str) -> None:
    output = user.run(command)
    assert output.startswith("HTTP/1.1 402 Payment Required")
    quote = header_json(output, "payment-required")
    assert amounts(quote["accepts"]) == {EVM_NET: str(PRICE), SOL_NET: str(PRICE)}


def paid(user: User, command: str) -> None:
    before = user.gateway.devnet.merchant_balances().evm
    status, answer, receipt = paid_output(user.run(command))
    assert status == "HTTP 200"
    assert answer["tokens"] == 6 and answer["model"] == "gpt-4o"  # "How many tokens is this?"
    row = latest_payment(user)
    assert receipt["success"] == "True" and receipt["network"] == EVM_NET
    assert receipt["transaction"] == row["tx_hash"]
    assert receipt["amount"].startswith(f"{PRICE} atomic units ($0.00575)")
    assert user.gateway.devnet.merchant_balances().evm - before == PRICE


def test_the_readme_quick_start_quotes_then_pays(user: User) -> None:
    run_page(user, page_commands("README.md"), {
        "make serve": "not run: the gateway of this test is a devnet gateway as `make serve` starts it",
        "curl -i -X POST 127.0.0.1:8000/v1/marketplace/api/token-count-508 -d '{}'": quoted,
        ".venv/bin/paywire pay http://127.0.0.1:8000/v1/marketplace/api/token-count-508": paid,
    })


# ---------------------------------------------------------------------------------------------- discovery


def home(user: User, command: str) -> None:
    answer = json.loads(user.run(command))
    assert answer["name"] == "paywire"
    links = answer["links"]
    for name, path in (("agent_card", "/.well-known/agent-card.json"), ("openapi", "/openapi.json"),
                       ("discovery", "/discovery/resources"), ("x402", "/.well-known/x402"), ("mcp", "/mcp")):
        assert links[name] == user.url(path)
    assert answer["mcp_stdio"] == f"paywire mcp --server {user.url('/mcp')}"


def resource_price(user: User, command: str) -> None:
    terms = json.loads(user.run(command))
    assert terms["scheme"] == "exact" and terms["pricing"] == "fixed"
    assert terms["price"] == {"usd": "0.00575", "atomic": str(PRICE)}
    assert terms["summary"] == "$0.00575 per call, in USDC on Base Sepolia or Solana devnet"
    assert terms["networks"] == [EVM_NET, SOL_NET]
    assert [asset["symbol"] for asset in terms["assets"]] == ["USDC", "USDC"]


def chat_price(user: User, command: str) -> None:
    terms = json.loads(user.run(command))
    assert terms["pricing"] == "per_request"
    assert terms["min"]["usd"] == "0.0001" and terms["max"]["usd"] == "0.5"
    assert "max_tokens" in terms["computed"] and terms["model_prices"] == "GET /v1/models"


def chat_minimum(user: User, command: str) -> None:
    quote = header_json(user.run(command), "payment-required")
    assert amounts(quote["accepts"]) == {EVM_NET: CHAT_MINIMUM, SOL_NET: CHAT_MINIMUM}


def chat_probe_error(user: User, command: str) -> None:
    said = json.loads(user.run(command))
    assert said.startswith("this is the route's minimum: a request is priced from its body (")
    assert said.endswith("; send one naming a model (each model's prices: GET /v1/models)")


def manifest(user: User, command: str) -> None:
    answer = json.loads(user.run(command))
    assert answer["kind"] == "resource-server"
    assert answer["discovery"]["resources"] == user.url("/discovery/resources")
    assert answer["openapi"] == user.url("/openapi.json")
    assert answer["agentCard"] == user.url("/.well-known/agent-card.json")


def discovered(user: User, command: str) -> None:
    item = json.loads(user.run(command))
    assert item["resource"].startswith(user.url("/v1/marketplace/api/token-"))  # q=token
    price = item["metadata"]["price"]["price"]["atomic"]
    assert amounts(item["accepts"]) == {EVM_NET: price, SOL_NET: price} and int(price) > 0
    assert item["metadata"]["name"] and item["metadata"]["input"]


FRESH_VENV = "run by tests/test_doc_snippets.py, in the fresh virtualenv the page makes"


def test_the_discovery_lines_show_what_the_page_says(user: User) -> None:
    run_page(user, page_commands("docs/discovery.md"), {
        "curl 127.0.0.1:8000/": home,
        "curl -s 127.0.0.1:8000/openapi.json | jq '.paths[\"/v1/marketplace/api/token-count-508\"]":
            resource_price,
        "curl -s 127.0.0.1:8000/openapi.json | jq '.paths[\"/v1/chat/completions\"]": chat_price,
        "python3 -m venv client-venv": FRESH_VENV,
        "pip install ": FRESH_VENV,
        "openapi-python-client generate ": FRESH_VENV,
        "curl -si -X POST 127.0.0.1:8000/v1/chat/completions | grep -i payment-required": chat_minimum,
        "curl -s -X POST 127.0.0.1:8000/v1/chat/completions | jq .error": chat_probe_error,
        "curl -s 127.0.0.1:8000/.well-known/x402 | jq": manifest,
        "curl -s '127.0.0.1:8000/discovery/resources?limit=2&q=token' | jq": discovered,
    })


# ---------------------------------------------------------------------------------------------- A2A


def a2a_quote(user: User, command: str) -> None:
    quote = json.loads(user.run(command))  # `curl -s`: the 402's body, x402 v1
    assert quote["x402Version"] == 1
    assert amounts(quote["accepts"], "maxAmountRequired") == {"base-sepolia": str(PRICE),
                                                              "solana-devnet": str(PRICE)}
    rest = httpx.post(user.url("/v1/marketplace/api/token-count-508"), json={}, timeout=30)
    assert rest.status_code == 402

    def terms(body: dict[str, Any]) -> set[tuple[str, ...]]:
        return {(o["network"], o["maxAmountRequired"], o["payTo"], o["asset"]) for o in body["accepts"]}

    assert terms(quote) == terms(rest.json())  # "the same quote as REST"


def test_the_a2a_call_is_quoted_as_on_rest_and_paid_with_paywire_pay(user: User) -> None:
    commands = page_commands("docs/a2a.md")
    run_page(user, commands, {"curl -s 127.0.0.1:8000/a2a -H 'Content-Type: application/json' -d '{":
                              a2a_quote})
    # the page's HTTP-level payment: `paywire pay` with "<the JSON-RPC body>", the curl's
    [pay] = re.findall(r"`(paywire pay [^`]+)`", doc_text("docs/a2a.md"))
    [curl] = commands
    words = shlex.split(curl)
    body = words[words.index("-d") + 1]
    before = user.gateway.devnet.merchant_balances().evm
    status, answer, receipt = paid_output(user.run(pay.replace("'<the JSON-RPC body>'", shlex.quote(body))))
    assert status == "HTTP 200"
    task = answer["result"]
    assert task["status"]["state"] == "completed"
    [artifact] = task["artifacts"]
    assert artifact["parts"][0]["data"]["tokens"] == 1  # "hi"
    row = latest_payment(user)
    # the receipt in PAYMENT-RESPONSE and in the task's status metadata, as the page says
    [in_task] = task["status"]["message"]["metadata"]["x402.payment.receipts"]
    assert in_task["transaction"] == receipt["transaction"] == row["tx_hash"]
    assert in_task["amount"] == str(PRICE) and in_task["network"] == EVM_NET
    assert user.gateway.devnet.merchant_balances().evm - before == PRICE
