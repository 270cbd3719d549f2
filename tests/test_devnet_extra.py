"""The devnet is the optional extra `paywire[devnet]`: production runs without py-evm/eth-tester.

Each test of the extra runs paywire in a subprocess where `eth` (py-evm) and `eth_tester` cannot
be imported, as after a plain `pip install .`, and where any attempt to import them is reported on
stderr. The last tests (this process has the extra) drive what the extra serves: the faucet's ETH
for gas (`eth_wei`), which lets a second gateway on one devnet have a facilitator key of its own.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from eth_account import Account
from solders.keypair import Keypair
from x402 import x402FacilitatorSync
from x402.mechanisms.evm.exact import register_exact_evm_facilitator
from x402.mechanisms.svm.constants import TOKEN_PROGRAM_ADDRESS
from x402.mechanisms.svm.utils import derive_ata

from agent.devnet.http import MAX_FAUCET_ATOMIC, MAX_FAUCET_WEI
from agent.devnet.server import create_devnet_app
from payments.devnet import Devnet
from payments.devnet.evm import EvmDevnet
from payments.devnet.keys import DevnetKeys
from payments.networks import SOLANA_DEVNET
from tests.support.facilitator_server import facilitator_app
from tests.support.live_server import bound_socket, run_in_thread
from tests.support.paying import EVM_NET, SOL_NET, pay_once, receipt
from tests.support.served_process import ROOT, free_port, paywire_env, stop, wait_healthy

# Put first on sys.meta_path: the devnet extra's modules are "not installed".
WITHOUT_DEVNET_EXTRA = """
import importlib.abc, sys

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("eth", "eth_tester"):
            print(f"blocked import of {name}", file=sys.stderr, flush=True)
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
"""
PRODUCTION_IMPORTS = (
    "agent.app",
    "agent.cli.main",
    "agent.pipeline.gateway",
    "payments.processor",
    "payments.ledger",
    "payments.facilitators",
    "compat.openai_api",
    "wellknown.agent_card",
)


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", WITHOUT_DEVNET_EXTRA + code]


def _serve(port: int) -> list[str]:
    return _python(f"from agent.cli.main import main; sys.exit(main(['serve', '--port', '{port}', "
                   "'--log-level', 'warning']))")


def test_the_blocker_blocks() -> None:
    done = subprocess.run(_python("import eth"), cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and "ModuleNotFoundError" in done.stderr


def test_production_modules_import_without_the_extra() -> None:
    code = "".join(f"import {name}\n" for name in PRODUCTION_IMPORTS) + "print('imported')\n"
    done = subprocess.run(_python(code), cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=paywire_env(ROOT / ".paywire-unused"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "imported"
    assert "blocked import" not in done.stderr


def test_devnet_serve_without_the_extra_says_how_to_install_it(tmp_path: Path) -> None:
    data_dir = tmp_path / ".paywire"
    env = paywire_env(data_dir)
    env.pop("PAYWIRE_NETWORKS", None)  # the devnet: paywire's default
    done = subprocess.run(_serve(free_port()), cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    message = lines[-1]
    assert all(line.startswith("blocked import") for line in lines[:-1]), done.stderr
    assert message.startswith("paywire: ") and "Traceback" not in done.stderr
    assert "pip install 'paywire[devnet]'" in message and "make serve" in message
    assert not (data_dir / "devnet-keys.json").exists()  # nothing written on the way out


def test_create_app_on_devnet_settings_without_the_extra_is_a_config_error(tmp_path: Path) -> None:
    code = """
from agent.app import create_app
from agent.settings import ConfigError, Settings
try:
    create_app(Settings.from_env({"PAYWIRE_DATA_DIR": sys.argv[1]}))
except ConfigError as exc:
    print(exc)
"""
    done = subprocess.run([*_python(code), str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=paywire_env(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "pip install 'paywire[devnet]'" in done.stdout


@pytest.fixture(scope="module")
def chain() -> Iterator[tuple[EvmDevnet, str]]:
    """An EVM chain and a remote facilitator settling on it (this process has the extra)."""
    devnet = EvmDevnet(facilitator_key=Account.create().key.hex(), minter_key=Account.create().key.hex())
    facilitator = x402FacilitatorSync()
    register_exact_evm_facilitator(facilitator, devnet.facilitator_signer(), networks=[EVM_NET])
    sock, port = bound_socket()
    server, thread = run_in_thread(facilitator_app(facilitator), sock)
    yield devnet, f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=15)


def test_production_serve_takes_a_payment_without_the_extra(
    chain: tuple[EvmDevnet, str], tmp_path: Path
) -> None:
    devnet, facilitator_url = chain
    merchant, payer = Account.create(), Account.create()
    devnet.mint(payer.address, 100_000)
    port = free_port()
    env = paywire_env(tmp_path / ".paywire", PAYWIRE_NETWORKS="base-sepolia",
                      PAYWIRE_EVM_PAY_TO=merchant.address, PAYWIRE_FACILITATOR_URL=facilitator_url)
    proc = subprocess.Popen(_serve(port), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, proc)
        resource = f"{url}/v1/marketplace/api/token-count-508"
        body = {"text": "Paid without py-evm in the gateway.", "model": "gpt-4o-mini"}
        paid = pay_once(url, resource, body, "0x" + payer.key.hex().removeprefix("0x"))
        assert paid.status_code == 200, paid.text
        assert receipt(paid)["success"] is True
        assert devnet.balance_of(merchant.address) == 5750
    finally:
        stop(proc)
    stderr = proc.stderr.read() if proc.stderr else ""
    assert "blocked import" not in stderr, stderr


# ---- the faucet's EVM gas (`eth_wei`): a key of one's own can broadcast on the devnet ----


@pytest.fixture(scope="module")
def served_devnet() -> Iterator[str]:
    """Both devnet chains and their /devnet routes (as `paywire devnet` serves them), on loopback."""
    sock, port = bound_socket()
    url = f"http://127.0.0.1:{port}"
    app = create_devnet_app(Devnet(DevnetKeys.generate(), demo_payer_funds=0), url)
    server, thread = run_in_thread(app, sock)
    yield url
    server.should_exit = True
    thread.join(timeout=15)


def _rpc(url: str, chain: str, method: str, params: list[Any]) -> Any:
    reply = httpx.post(f"{url}/devnet/{chain}", timeout=30, json={
        "jsonrpc": "2.0", "id": 1, "method": method, "params": params}).json()
    assert "error" not in reply, reply
    return reply["result"]


def _eth(url: str, address: str) -> int:
    return int(_rpc(url, "evm", "eth_getBalance", [address, "latest"]), 16)


def _usdc(url: str, network: str, address: str) -> int:
    answer = httpx.get(f"{url}/devnet/balance", params={"network": network, "address": address},
                       timeout=30)
    assert answer.status_code == 200, answer.text
    return int(answer.json()["balance"])


def test_faucet_sends_eth_that_pays_for_a_key_s_own_transaction(served_devnet: str) -> None:
    url, key = served_devnet, Account.create()
    answer = httpx.post(f"{url}/devnet/faucet", timeout=30, json={
        "network": "base-sepolia", "address": key.address, "amount": 0, "eth_wei": 10**18})
    assert answer.status_code == 200, answer.text
    funded = answer.json()
    assert funded["transaction"] is None and funded["eth_wei"] == 10**18  # amount 0: no mint
    gas_receipt = _rpc(url, "evm", "eth_getTransactionReceipt", [funded["gas_transaction"]])
    assert gas_receipt["status"] == "0x1"
    assert (_eth(url, key.address), _usdc(url, EVM_NET, key.address)) == (10**18, 0)
    # The key broadcasts a transaction of its own, its gas paid from what the faucet sent.
    to = Account.create().address
    gas_price = int(_rpc(url, "evm", "eth_gasPrice", []), 16)
    signed = key.sign_transaction({"to": to, "value": 5, "gas": 21_000, "nonce": 0,
                                   "chainId": 84532, "gasPrice": gas_price})
    sent = _rpc(url, "evm", "eth_sendRawTransaction", ["0x" + bytes(signed.raw_transaction).hex()])
    receipt_ = _rpc(url, "evm", "eth_getTransactionReceipt", [sent])
    assert receipt_["status"] == "0x1" and _eth(url, to) == 5
    spent = 21_000 * int(receipt_["effectiveGasPrice"], 16)
    assert _eth(url, key.address) == 10**18 - 5 - spent
    # USDC and gas in one call: both arrive.
    both = httpx.post(f"{url}/devnet/faucet", timeout=30, json={
        "network": EVM_NET, "address": to, "amount": 1_234, "eth_wei": 7}).json()
    assert both["transaction"] and both["gas_transaction"] and both["transaction"] != both["gas_transaction"]
    assert (_usdc(url, EVM_NET, to), _eth(url, to)) == (1_234, 12)


@pytest.mark.parametrize(("body", "param", "says"), [
    ({"amount": 0, "eth_wei": MAX_FAUCET_WEI + 1}, "eth_wei", "0..10000000000000000000 (10 ETH)"),
    ({"amount": 0, "eth_wei": -1}, "eth_wei", "whole number of wei"),
    ({"amount": 0, "eth_wei": "1000"}, "eth_wei", "whole number of wei"),
    ({"amount": 0, "eth_wei": 1.5}, "eth_wei", "whole number of wei"),
    ({"amount": 0, "eth_wei": True}, "eth_wei", "whole number of wei"),
    ({"amount": MAX_FAUCET_ATOMIC + 1, "eth_wei": 1}, "amount", "0..1000000000"),
    ({"amount": 0}, "amount", "nothing to send"),
    ({"amount": 0, "eth_wei": 0}, "amount", "nothing to send"),
])
def test_faucet_refuses_gas_out_of_bounds_and_sends_nothing(
    served_devnet: str, body: dict[str, Any], param: str, says: str,
) -> None:
    address = Account.create().address
    answer = httpx.post(f"{served_devnet}/devnet/faucet", timeout=30,
                        json={"network": EVM_NET, "address": address, **body})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and says in error["message"], error
    assert (_eth(served_devnet, address), _usdc(served_devnet, EVM_NET, address)) == (0, 0)


def test_solana_faucet_refuses_eth_and_opens_a_token_account_with_amount_0(served_devnet: str) -> None:
    owner = str(Keypair().pubkey())
    refused = httpx.post(f"{served_devnet}/devnet/faucet", timeout=30, json={
        "network": SOL_NET, "address": owner, "amount": 0, "eth_wei": 1})
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "eth_wei"
    assert "EVM networks" in refused.json()["error"]["message"]
    assert _rpc(served_devnet, "solana", "getBalance", [owner])["value"] == 0  # nothing sent
    opened = httpx.post(f"{served_devnet}/devnet/faucet", timeout=30, json={
        "network": SOL_NET, "address": owner, "amount": 0})
    assert opened.status_code == 200, opened.text
    assert opened.json()["transaction"] and "gas_transaction" not in opened.json()
    token_account = derive_ata(owner, SOLANA_DEVNET.usdc, TOKEN_PROGRAM_ADDRESS)
    held = _rpc(served_devnet, "solana", "getTokenAccountBalance", [token_account])["value"]
    assert held["amount"] == "0"  # the account exists, empty: a pay-to can now be paid
    assert _rpc(served_devnet, "solana", "getBalance", [owner])["value"] == 1_000_000_000
