"""Several operators on one `paywire devnet` process: the accounts of each, funded by its faucet.

`paywire devnet` writes the settings of ONE production-mode gateway (its env file): the devnet's
merchant, its genesis facilitator key. A second gateway with a ledger of its own (a second
operator, as in federation: A resells B's resources) must not share them: its balances would
mix with the first's, and two ledgers' send locks (a lock file beside each SQLite file, an
advisory lock per PostgreSQL database) do not see each other, so both would race for the one
EVM key's nonces. `new_gateway_accounts` makes a fresh set over the devnet's HTTP faucet:

- EVM: a fresh pay-to address (nothing to fund) and a fresh facilitator key with ETH for gas
  (the faucet's `eth_wei`);
- Solana: a fresh pay-to wallet, its USDC account opened (faucet `amount` 0) and 1 SOL for the
  fees of the refunds it sends (it is the gateway's refund key, as the devnet's merchant is);
  and a fresh fee payer with 1 SOL. Solana sends take no lock (no nonces: each transaction names
  a recent blockhash), so sharing the devnet's fee payer would be safe, but its own keeps every
  balance of one operator apart from the other's.

`running_devnet` starts `paywire devnet --port 0 --env-file` as tests/test_devnet_process.py's
fixture does; `new_payer` funds a fresh EVM key and Solana keypair with USDC; `pay` makes one
paid call with the x402 SDK's own HTTP client (requests, `x402_requests`).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import requests
from eth_account import Account
from solders.keypair import Keypair
from x402.http.clients.requests import x402_requests

from tests.support.paying import EVM_NET, SOL_NET, client_for
from tests.support.served_process import PAYWIRE, ROOT, paywire_env, stop

NETWORKS = "base-sepolia,solana-devnet"
GAS_WEI = 10**18  # 1 ETH: thousands of settlements at the devnet's fees


def faucet(devnet_url: str, network: str, address: str, amount: int, *, eth_wei: int = 0
           ) -> dict[str, Any]:
    """`POST /devnet/faucet`: `amount` atomic USDC (0 on Solana: open the token account; every
    Solana call also airdrops 1 SOL), and on EVM `eth_wei` of ETH for gas. Returns the answer."""
    body: dict[str, Any] = {"network": network, "address": address, "amount": amount}
    if eth_wei:
        body["eth_wei"] = eth_wei
    answer = httpx.post(f"{devnet_url}/devnet/faucet", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def usdc_balance(devnet_url: str, network: str, address: str) -> int:
    """An address's USDC, atomic units, as the devnet reads it (`GET /devnet/balance`)."""
    answer = httpx.get(f"{devnet_url}/devnet/balance", timeout=30,
                       params={"network": network, "address": address})
    assert answer.status_code == 200, answer.text
    return int(answer.json()["balance"])


def rpc(devnet_url: str, chain: str, method: str, params: list[Any] | None = None) -> Any:
    """One JSON-RPC call on `/devnet/evm` or `/devnet/solana` (chain: "evm" or "solana")."""
    reply = httpx.post(f"{devnet_url}/devnet/{chain}", timeout=30, json={
        "jsonrpc": "2.0", "id": 1, "method": method, "params": params or []}).json()
    assert "error" not in reply, reply
    return reply["result"]


def eth_balance(devnet_url: str, address: str) -> int:
    return int(rpc(devnet_url, "evm", "eth_getBalance", [address, "latest"]), 16)


def sol_balance(devnet_url: str, address: str) -> int:
    """Lamports."""
    return int(rpc(devnet_url, "solana", "getBalance", [address])["value"])


@dataclass
class DevnetProcess:
    """A running `paywire devnet`: its base URL and the settings its env file holds."""

    url: str
    env: dict[str, str]  # the env file's: the first gateway's settings (the devnet's accounts)
    env_file: Path
    data_dir: Path
    output: Path  # stdout and stderr, merged
    proc: subprocess.Popen[str]

    def balance(self, network: str, address: str) -> int:
        return usdc_balance(self.url, network, address)

    def eth_balance(self, address: str) -> int:
        return eth_balance(self.url, address)

    def faucet(self, network: str, address: str, amount: int, *, eth_wei: int = 0) -> dict[str, Any]:
        return faucet(self.url, network, address, amount, eth_wei=eth_wei)

    def rpc(self, chain: str, method: str, params: list[Any] | None = None) -> Any:
        return rpc(self.url, chain, method, params)


def _read_env_file(path: Path) -> dict[str, str]:
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def _wait_until(ready: Callable[[], bool], proc: subprocess.Popen[str], what: str,
                timeout: float = 60) -> None:
    """Poll `ready()` with a deadline; fail at once if the process died."""
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            raise AssertionError(f"paywire devnet exited ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} from paywire devnet within {timeout} s")
        time.sleep(0.05)  # polling readiness with a deadline


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def running_devnet(folder: Path, *, log_level: str = "warning") -> Iterator[DevnetProcess]:
    """`paywire devnet --port 0 --env-file FOLDER/gateway.env` (keys in FOLDER/devnet-data), until
    the block ends."""
    folder.mkdir(parents=True, exist_ok=True)
    env_file, data_dir, output = folder / "gateway.env", folder / "devnet-data", folder / "devnet.log"
    with output.open("w") as sink:
        proc = subprocess.Popen(
            [*PAYWIRE, "devnet", "--port", "0", "--env-file", str(env_file), "--log-level", log_level],
            env=paywire_env(data_dir), cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_until(env_file.exists, proc, "env file")
        env = _read_env_file(env_file)
        url = env["PAYWIRE_EVM_RPC_URL"].removesuffix("/devnet/evm")
        _wait_until(lambda: _healthy(f"{url}/healthz"), proc, "GET /healthz")
        yield DevnetProcess(url, env, env_file, data_dir, output, proc)
    finally:
        stop(proc)


@dataclass(frozen=True)
class GatewayAccounts:
    """One operator's accounts on the devnet. Keys are secrets: never log or print this."""

    evm_pay_to: str
    evm_facilitator_key: str  # 0x hex, with ETH for gas
    sol_pay_to: str
    sol_merchant_key: str  # base58: the pay-to wallet's key, the gateway's Solana refund key
    sol_fee_payer_key: str  # base58, with SOL
    env: dict[str, str]  # a production-mode `paywire serve` settling on the devnet with these

    @property
    def evm_facilitator_address(self) -> str:
        return str(Account.from_key(self.evm_facilitator_key).address)

    @property
    def sol_fee_payer_address(self) -> str:
        return str(Keypair.from_base58_string(self.sol_fee_payer_key).pubkey())

    def pay_to(self, network: str) -> str:
        """The pay-to address on `network` (EVM_NET or SOL_NET)."""
        return {EVM_NET: self.evm_pay_to, SOL_NET: self.sol_pay_to}[network]

    def __repr__(self) -> str:  # no key in a failing assertion's output
        return f"GatewayAccounts(evm_pay_to={self.evm_pay_to!r}, sol_pay_to={self.sol_pay_to!r})"


def new_gateway_accounts(devnet_url: str, *, gas_wei: int = GAS_WEI) -> GatewayAccounts:
    """Fresh pay-to addresses, facilitator keys and refund key for one more production-mode
    gateway on the `paywire devnet` at `devnet_url`, funded through its faucet (module doc)."""
    evm_facilitator = Account.create()
    sol_merchant, sol_fee_payer = Keypair(), Keypair()
    faucet(devnet_url, EVM_NET, evm_facilitator.address, 0, eth_wei=gas_wei)
    faucet(devnet_url, SOL_NET, str(sol_merchant.pubkey()), 0)  # its USDC account, SOL for refunds
    faucet(devnet_url, SOL_NET, str(sol_fee_payer.pubkey()), 0)  # 1 SOL for fees
    evm_key = "0x" + bytes(evm_facilitator.key).hex()
    accounts = {
        "evm_pay_to": Account.create().address,
        "evm_facilitator_key": evm_key,
        "sol_pay_to": str(sol_merchant.pubkey()),
        "sol_merchant_key": str(sol_merchant),
        "sol_fee_payer_key": str(sol_fee_payer),
    }
    env = {
        "PAYWIRE_NETWORKS": NETWORKS,
        "PAYWIRE_EVM_RPC_URL": f"{devnet_url}/devnet/evm",
        "PAYWIRE_SOLANA_RPC_URL": f"{devnet_url}/devnet/solana",
        "PAYWIRE_EVM_PAY_TO": accounts["evm_pay_to"],
        "PAYWIRE_SOLANA_PAY_TO": accounts["sol_pay_to"],
        "PAYWIRE_EVM_FACILITATOR_KEY": evm_key,
        "PAYWIRE_SOLANA_FACILITATOR_KEY": accounts["sol_fee_payer_key"],
        "PAYWIRE_REFUND_KEY_SOLANA": accounts["sol_merchant_key"],
    }
    return GatewayAccounts(**accounts, env=env)


@dataclass(frozen=True)
class Payer:
    """A payer funded with devnet USDC on both chains. Keys are secrets: never log them."""

    evm_key: str  # 0x hex
    sol_key: str  # base58

    @property
    def evm_address(self) -> str:
        return str(Account.from_key(self.evm_key).address)

    @property
    def sol_address(self) -> str:
        return str(Keypair.from_base58_string(self.sol_key).pubkey())

    def address(self, network: str) -> str:
        return {EVM_NET: self.evm_address, SOL_NET: self.sol_address}[network]

    def __repr__(self) -> str:
        return f"Payer(evm_address={self.evm_address!r}, sol_address={self.sol_address!r})"


def new_payer(devnet_url: str, usdc: int) -> Payer:
    """A fresh EVM key and Solana keypair, each holding `usdc` atomic USDC from the faucet (the
    Solana one also 1 SOL; the EVM one no ETH: `exact` payers sign, the facilitator pays gas)."""
    evm, sol = Account.create(), Keypair()
    faucet(devnet_url, EVM_NET, evm.address, usdc)
    faucet(devnet_url, SOL_NET, str(sol.pubkey()), usdc)
    return Payer("0x" + bytes(evm.key).hex(), str(sol))


@dataclass(frozen=True)
class Paid:
    """One call paid with the SDK's HTTP client."""

    status: int
    body: bytes
    headers: Mapping[str, str]
    settlement: dict[str, Any] | None  # the PAYMENT-RESPONSE receipt, decoded


def pay(devnet_url: str, url: str, payer: Payer, network: str, *, method: str = "POST",
        json: Any = None, params: Mapping[str, str] | None = None) -> Paid:
    """One call to `url` through the x402 SDK's requests client (`x402_requests`: ask, get the
    402, sign, send again), able to pay only on `network` (EVM_NET or SOL_NET) as `payer`."""
    from x402.http import decode_payment_response_header

    if network == EVM_NET:
        client = client_for(devnet_url, evm_key=payer.evm_key)
    else:
        client = client_for(devnet_url, sol_key=payer.sol_key, sol_rpc=f"{devnet_url}/devnet/solana")
    with x402_requests(client) as session:
        answer: requests.Response = session.request(method, url, json=json, params=params, timeout=60)
    receipt = answer.headers.get("PAYMENT-RESPONSE")
    settlement = (decode_payment_response_header(receipt).model_dump(by_alias=True)
                  if receipt else None)
    return Paid(answer.status_code, answer.content, dict(answer.headers), settlement)
