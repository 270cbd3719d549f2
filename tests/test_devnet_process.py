"""`paywire devnet` as its own process, and production-mode gateways settling on it over RPC.

The devnet process is started as a user starts it (`paywire devnet --env-file`); a gateway is
`paywire serve` in production mode with exactly the settings the env file holds (its in-process
facilitator: the SDK's Web3 signer over /devnet/evm, the strict keypair signer over
/devnet/solana), and the payer is a fresh key funded by the faucet, paying with the real x402
client. Then the gateway is killed with SIGKILL and started again: the chain, in the other
process, keeps every balance and transaction.
"""

from __future__ import annotations

import base64
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from eth_account import Account
from solders.hash import Hash
from solders.keypair import Keypair
from solders.message import MessageV0
from solders.system_program import TransferParams, transfer
from solders.transaction import VersionedTransaction

from agent.cli.main import main as paywire_main
from agent.settings import Settings
from payments.networks import BASE_SEPOLIA, SOLANA_DEVNET
from tests.support.devnet_world import DevnetProcess, running_devnet
from tests.support.paying import EVM_NET, SOL_NET, client_for, header, post_paid, quote, receipt, sign
from tests.support.served_process import free_port, paywire_env, start_paywire, stop

# solana-py 0.39 deprecates its sync Client, which the SDK's SVM code uses.
pytestmark = [
    pytest.mark.filterwarnings("ignore:Client is deprecated"),
    pytest.mark.filterwarnings("ignore:TxOpts is deprecated"),
]

RESOURCE = "/v1/marketplace/api/token-count-508"
FUNDS = 1_000_000  # 1 USDC from the faucet per payer and chain


@pytest.fixture(scope="module")
def devnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevnetProcess]:
    """`paywire devnet --port 0 --env-file ...`: the system picks the port, the env file names it;
    the keys go to PAYWIRE_DATA_DIR, as `paywire serve` and `paywire pay` read it."""
    with running_devnet(tmp_path_factory.mktemp("devnet"), log_level="info") as running:
        yield running


def test_prints_the_public_settings_and_writes_the_keys_only_to_the_env_file(
    devnet: DevnetProcess,
) -> None:
    env = devnet.env
    assert stat.S_IMODE(devnet.env_file.stat().st_mode) == 0o600
    assert (devnet.data_dir / "devnet-keys.json").exists()  # PAYWIRE_DATA_DIR's, not ./.paywire
    assert f"keys in {devnet.data_dir / 'devnet-keys.json'}" in devnet.output.read_text()
    assert set(env) == {"PAYWIRE_NETWORKS", "PAYWIRE_EVM_RPC_URL", "PAYWIRE_SOLANA_RPC_URL",
                        "PAYWIRE_EVM_PAY_TO", "PAYWIRE_SOLANA_PAY_TO", "PAYWIRE_EVM_FACILITATOR_KEY",
                        "PAYWIRE_SOLANA_FACILITATOR_KEY", "PAYWIRE_REFUND_KEY_SOLANA"}
    # Exactly what a production-mode gateway accepts, on the devnet's tokens.
    settings = Settings.from_env(env)
    assert not settings.devnet and settings.networks == (BASE_SEPOLIA, SOLANA_DEVNET)
    info = httpx.get(f"{devnet.url}/devnet", timeout=30).json()["networks"]
    assert (info["evm"]["usdc"], info["solana"]["usdc"]) == (BASE_SEPOLIA.usdc, SOLANA_DEVNET.usdc)
    assert (info["evm"]["merchant"], info["solana"]["merchant"]) == (
        env["PAYWIRE_EVM_PAY_TO"], env["PAYWIRE_SOLANA_PAY_TO"])
    assert info["solana"]["rpc_url"] == env["PAYWIRE_SOLANA_RPC_URL"]
    assert httpx.get(f"{devnet.url}/healthz", timeout=30).json()["networks"] == [
        BASE_SEPOLIA.caip2, SOLANA_DEVNET.caip2]
    assert httpx.get(f"{devnet.url}/nope", timeout=30).status_code == 404
    # What it printed: every public value and where the keys are, never a key.
    printed = devnet.output.read_text()
    for name in ("PAYWIRE_NETWORKS", "PAYWIRE_EVM_RPC_URL", "PAYWIRE_SOLANA_RPC_URL",
                 "PAYWIRE_EVM_PAY_TO", "PAYWIRE_SOLANA_PAY_TO"):
        assert f"{name}={env[name]}" in printed
    assert str(devnet.env_file) in printed
    for secret in (env["PAYWIRE_EVM_FACILITATOR_KEY"], env["PAYWIRE_SOLANA_FACILITATOR_KEY"],
                   env["PAYWIRE_REFUND_KEY_SOLANA"]):
        assert secret.removeprefix("0x") not in printed


def test_devnet_help_describes_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        paywire_main(["devnet", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for option in ("--host", "--port", "--data-dir", "--env-file", "--public-url", "--log-level"):
        assert option in text
    assert "mode 0600" in text and "0 picks a free one" in text and "/healthz" in text


def _pay(devnet: DevnetProcess, gateway: str, network: str, payer: Any) -> tuple[int, str]:
    """One paid call with the real x402 client; (the price paid, the settlement transaction)."""
    resource = f"{gateway}{RESOURCE}"
    body = {"text": f"Paid on {network} through a gateway on the devnet process.", "model": "gpt-4o"}
    _, required = quote(resource, body)
    if network == EVM_NET:
        client = client_for(devnet.url, evm_key=payer)
    else:
        client = client_for(devnet.url, sol_key=payer, sol_rpc=devnet.env["PAYWIRE_SOLANA_RPC_URL"])
    paid = post_paid(resource, body, header(sign(client, required, network)))
    assert paid.status_code == 200, paid.text
    settled = receipt(paid)
    assert settled["success"] is True and settled["network"] == network, settled
    price = next(int(option.amount) for option in required.accepts if option.network == network)
    return price, settled["transaction"]


def test_gateway_settles_on_both_chains_and_the_chain_outlives_its_kill_9(
    devnet: DevnetProcess, tmp_path: Path,
) -> None:
    evm_payer = "0x" + bytes(Account.create().key).hex()
    sol_payer = Keypair()
    payers = {EVM_NET: Account.from_key(evm_payer).address, SOL_NET: str(sol_payer.pubkey())}
    merchants = {EVM_NET: devnet.env["PAYWIRE_EVM_PAY_TO"], SOL_NET: devnet.env["PAYWIRE_SOLANA_PAY_TO"]}
    for network, address in payers.items():
        devnet.faucet(network, address, FUNDS)
    start = {n: devnet.balance(n, merchants[n]) for n in merchants}
    gateway_env = paywire_env(tmp_path / "gateway", **devnet.env)  # SQLite in its data dir
    log = (tmp_path / "gateway.log").open("w")

    def serve() -> tuple[subprocess.Popen[str], str]:
        port = free_port()
        proc = start_paywire(port, gateway_env, stdout=log, stderr=log)
        assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=30).status_code == 200
        return proc, f"http://127.0.0.1:{port}"

    paid: dict[str, list[int]] = {n: [] for n in merchants}
    transactions: dict[str, list[str]] = {n: [] for n in merchants}
    gateway, url = serve()
    try:
        for network, payer in ((EVM_NET, evm_payer), (SOL_NET, sol_payer)):
            price, tx = _pay(devnet, url, network, payer)
            paid[network].append(price)
            transactions[network].append(tx)
            assert devnet.balance(network, merchants[network]) == start[network] + price
            assert devnet.balance(network, payers[network]) == FUNDS - price
        gateway.send_signal(signal.SIGKILL)  # no shutdown runs: as a crash would
        assert gateway.wait(timeout=30) == -signal.SIGKILL
        gateway, url = serve()  # same database, same settings, the same chain
        for network, payer in ((EVM_NET, evm_payer), (SOL_NET, sol_payer)):
            price, tx = _pay(devnet, url, network, payer)
            paid[network].append(price)
            transactions[network].append(tx)
    finally:
        stop(gateway)
        log.close()
    for network in merchants:  # every payment of both gateway lives, to the atomic unit
        assert devnet.balance(network, merchants[network]) == start[network] + sum(paid[network])
        assert devnet.balance(network, payers[network]) == FUNDS - sum(paid[network])
    # The first gateway's settlements are still on the chain, final.
    evm_receipts = [devnet.rpc("evm", "eth_getTransactionReceipt", [tx]) for tx in transactions[EVM_NET]]
    assert [r["status"] for r in evm_receipts] == ["0x1", "0x1"]
    statuses = devnet.rpc("solana", "getSignatureStatuses", [transactions[SOL_NET]])["value"]
    assert [(s["err"], s["confirmationStatus"]) for s in statuses] == [(None, "finalized")] * 2
    assert len(set(transactions[EVM_NET] + transactions[SOL_NET])) == 4


def _evm_transfer(devnet: DevnetProcess, key: str, to: str, nonce: int, wei: int) -> str:
    account = Account.from_key(key)
    tx = {"to": to, "value": wei, "gas": 21_000, "nonce": nonce, "chainId": 84532,
          "gasPrice": int(devnet.rpc("evm", "eth_gasPrice"), 16)}
    return devnet.rpc("evm", "eth_sendRawTransaction",
                      ["0x" + bytes(account.sign_transaction(tx).raw_transaction).hex()])


def test_evm_mining_pauses_and_mines_what_waits_in_one_block(devnet: DevnetProcess) -> None:
    key = devnet.env["PAYWIRE_EVM_FACILITATOR_KEY"]  # an account with gas money on this chain
    sender, to = Account.from_key(key).address, Account.create().address
    minted_to = Account.create().address
    nonce = int(devnet.rpc("evm", "eth_getTransactionCount", [sender, "latest"]), 16)
    height = int(devnet.rpc("evm", "eth_blockNumber"), 16)
    assert devnet.rpc("evm", "evm_setAutomine", [False]) is None
    try:
        waiting = [_evm_transfer(devnet, key, to, nonce, 1_000),
                   _evm_transfer(devnet, key, to, nonce + 1, 2_000)]
        waiting.append(devnet.faucet(EVM_NET, minted_to, 7)["transaction"])  # the faucet's mint waits too
        assert [devnet.rpc("evm", "eth_getTransactionReceipt", [tx]) for tx in waiting] == [None] * 3
        assert int(devnet.rpc("evm", "eth_getTransactionCount", [sender, "pending"]), 16) == nonce + 2
        assert int(devnet.rpc("evm", "eth_getTransactionCount", [sender, "latest"]), 16) == nonce
        assert int(devnet.rpc("evm", "eth_blockNumber"), 16) == height  # nothing mined meanwhile
        assert devnet.rpc("evm", "eth_getBalance", [to, "latest"]) == "0x0"
        assert devnet.balance(EVM_NET, minted_to) == 0
        assert devnet.rpc("evm", "evm_mine") == "0x0"
        receipts = [devnet.rpc("evm", "eth_getTransactionReceipt", [tx]) for tx in waiting]
        assert [r["status"] for r in receipts] == ["0x1"] * 3
        assert {r["blockNumber"] for r in receipts} == {hex(height + 1)}  # one block, all of them
        assert int(devnet.rpc("evm", "eth_getBalance", [to, "latest"]), 16) == 3_000
        assert devnet.balance(EVM_NET, minted_to) == 7
        last = _evm_transfer(devnet, key, to, nonce + 2, 4_000)  # waits for automine
        assert devnet.rpc("evm", "eth_getTransactionReceipt", [last]) is None
    finally:
        devnet.rpc("evm", "evm_setAutomine", [True])  # mines what waits
    assert devnet.rpc("evm", "eth_getTransactionReceipt", [last])["status"] == "0x1"
    mined = devnet.rpc("evm", "eth_getTransactionReceipt", [_evm_transfer(devnet, key, to, nonce + 3, 1)])
    assert mined["status"] == "0x1"  # automine again: a block per transaction
    assert int(devnet.rpc("evm", "eth_getBalance", [to, "latest"]), 16) == 7_001
    refused = httpx.post(f"{devnet.url}/devnet/evm", timeout=30, json={
        "jsonrpc": "2.0", "id": 1, "method": "evm_setAutomine", "params": ["no"]}).json()
    assert refused["error"]["code"] == -32602


def test_solana_processing_pauses_and_runs_the_queue_in_order(devnet: DevnetProcess) -> None:
    fee_payer = Keypair.from_base58_string(devnet.env["PAYWIRE_SOLANA_FACILITATOR_KEY"])
    to = Keypair().pubkey()

    def signed(lamports: int) -> str:
        blockhash = devnet.rpc("solana", "getLatestBlockhash")["value"]["blockhash"]
        ix = transfer(TransferParams(from_pubkey=fee_payer.pubkey(), to_pubkey=to, lamports=lamports))
        message = MessageV0.try_compile(fee_payer.pubkey(), [ix], [], Hash.from_string(blockhash))
        return base64.b64encode(bytes(VersionedTransaction(message, [fee_payer]))).decode()

    def send(raw: str, preflight: bool = True) -> str:
        config = {"encoding": "base64", "skipPreflight": not preflight}
        return devnet.rpc("solana", "sendTransaction", [raw, config])

    def status(signature: str) -> Any:
        return devnet.rpc("solana", "getSignatureStatuses", [[signature]])["value"][0]

    def balance() -> int:
        return int(devnet.rpc("solana", "getBalance", [str(to)])["value"])

    assert devnet.rpc("solana", "devnet_setAutoProcess", [False]) is None
    try:
        first = signed(1_000_000_000)
        # 500 lamports cannot open an account (rent): it lands only after the first, in order.
        queued = [send(first), send(signed(500), preflight=False)]
        assert send(first) == queued[0]  # a resend is queued once
        assert devnet.rpc("solana", "getSignatureStatuses", [queued])["value"] == [None, None]
        assert balance() == 0
        done = devnet.rpc("solana", "devnet_processQueued")
        assert done == [{"signature": s, "landed": True, "err": None} for s in queued]
        statuses = devnet.rpc("solana", "getSignatureStatuses", [queued])["value"]
        assert [s["confirmationStatus"] for s in statuses] == ["finalized", "finalized"]
        assert balance() == 1_000_000_500
        assert devnet.rpc("solana", "devnet_processQueued") == []
        last = send(signed(2_000))  # waits for auto-processing
        assert status(last) is None
    finally:
        devnet.rpc("solana", "devnet_setAutoProcess", [True])  # runs what waits
    assert status(last)["err"] is None
    landed = send(signed(3_000))  # processed at once again
    assert status(landed)["err"] is None
    assert balance() == 1_000_005_500
