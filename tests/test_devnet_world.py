"""Two operators on one `paywire devnet`: each gateway is paid to its own merchants and settles
with its own keys, so neither's balances nor its facilitator's nonces mix with the other's.

Gateway A runs on the settings the devnet wrote (its merchant, its genesis facilitator keys);
gateway B on fresh accounts funded through the faucet (tests/support/devnet_world.py), each a
production-mode `paywire serve` process with a SQLite ledger of its own. One payer pays a call
on each gateway on each chain with the x402 SDK's HTTP client; after every payment exactly three
things moved on the chain: the paid gateway's merchant (+ the price), the payer (- the price) and
the paid gateway's gas or fee account (its own key broadcast the settlement).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from eth_account import Account
from solders.keypair import Keypair

from tests.support.devnet_world import (
    DevnetProcess,
    GatewayAccounts,
    new_gateway_accounts,
    new_payer,
    pay,
    running_devnet,
    sol_balance,
)
from tests.support.paying import EVM_NET, SOL_NET, quote
from tests.support.served_process import PAYWIRE, ROOT, free_port, paywire_env, stop, wait_healthy

# solana-py 0.39 deprecates its sync Client, which the SDK's SVM code uses.
pytestmark = [
    pytest.mark.filterwarnings("ignore:Client is deprecated"),
    pytest.mark.filterwarnings("ignore:TxOpts is deprecated"),
]

RESOURCE = "/v1/marketplace/api/token-count-508"
FUNDS = 1_000_000  # 1 USDC per chain for the payer


@pytest.fixture(scope="module")
def devnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevnetProcess]:
    with running_devnet(tmp_path_factory.mktemp("devnet")) as running:
        yield running


def _serve(env: dict[str, str], folder: Path) -> tuple[subprocess.Popen[str], str]:
    """`paywire serve` in production mode with `env` and a data folder (SQLite ledger) of its own;
    started, not yet waited for (both gateways start side by side)."""
    port = free_port()
    log = (folder / "gateway.log").open("w")
    proc = subprocess.Popen([*PAYWIRE, "serve", "--port", str(port), "--log-level", "warning"],
                            env=paywire_env(folder / "data", **env), cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT, text=True)
    log.close()  # the child holds its own descriptor
    return proc, f"http://127.0.0.1:{port}"


def _devnet_accounts(devnet: DevnetProcess) -> dict[str, str]:
    """Gateway A's addresses: the ones the devnet's env file names (never its keys)."""
    env = devnet.env
    return {"evm_pay_to": env["PAYWIRE_EVM_PAY_TO"], "sol_pay_to": env["PAYWIRE_SOLANA_PAY_TO"],
            "evm_gas": Account.from_key(env["PAYWIRE_EVM_FACILITATOR_KEY"]).address,
            "sol_gas": str(Keypair.from_base58_string(env["PAYWIRE_SOLANA_FACILITATOR_KEY"]).pubkey())}


def _own_accounts(accounts: GatewayAccounts) -> dict[str, str]:
    return {"evm_pay_to": accounts.evm_pay_to, "sol_pay_to": accounts.sol_pay_to,
            "evm_gas": accounts.evm_facilitator_address, "sol_gas": accounts.sol_fee_payer_address}


def test_two_gateways_on_one_devnet_are_paid_apart_and_settle_with_their_own_keys(
    devnet: DevnetProcess, tmp_path: Path,
) -> None:
    b_accounts = new_gateway_accounts(devnet.url)
    payer = new_payer(devnet.url, FUNDS)
    accounts = {"A": _devnet_accounts(devnet), "B": _own_accounts(b_accounts)}
    assert not set(accounts["A"].values()) & set(accounts["B"].values())
    (tmp_path / "A").mkdir()
    (tmp_path / "B").mkdir()
    gateways = {"A": _serve(devnet.env, tmp_path / "A"), "B": _serve(b_accounts.env, tmp_path / "B")}

    def chain_state() -> dict[tuple[str, str], int]:
        """Every balance the payments may move: USDC of the merchants and the payer, ETH of the
        EVM facilitators, lamports of the Solana fee payers."""
        state = {("payer", EVM_NET): devnet.balance(EVM_NET, payer.evm_address),
                 ("payer", SOL_NET): devnet.balance(SOL_NET, payer.sol_address)}
        for name, own in accounts.items():
            state[(name, f"{EVM_NET} merchant")] = devnet.balance(EVM_NET, own["evm_pay_to"])
            state[(name, f"{SOL_NET} merchant")] = devnet.balance(SOL_NET, own["sol_pay_to"])
            state[(name, f"{EVM_NET} gas")] = devnet.eth_balance(own["evm_gas"])
            state[(name, f"{SOL_NET} gas")] = sol_balance(devnet.url, own["sol_gas"])
        return state

    try:
        for name, (proc, url) in gateways.items():
            try:
                wait_healthy(url, proc)
            except RuntimeError as exc:  # what the gateway said on its way out
                log = (tmp_path / name / "gateway.log").read_text()[-3000:]
                raise AssertionError(f"gateway {name} did not start:\n{log}") from exc
        state = chain_state()
        assert state[("payer", EVM_NET)] == state[("payer", SOL_NET)] == FUNDS
        for name, (_, url) in gateways.items():
            for network in (EVM_NET, SOL_NET):
                body = {"text": f"Paid to gateway {name} on {network}.", "model": "gpt-4o"}
                _, required = quote(f"{url}{RESOURCE}", body)
                price = next(int(o.amount) for o in required.accepts if o.network == network)
                paid = pay(devnet.url, f"{url}{RESOURCE}", payer, network, json=body)
                assert paid.status == 200, paid.body[:500]
                settled = paid.settlement
                assert settled is not None and settled["success"] is True, settled
                assert settled["network"] == network and settled["payer"] == payer.address(network)
                if network == EVM_NET:  # gateway `name`'s own facilitator key sent it
                    sent = devnet.rpc("evm", "eth_getTransactionReceipt", [settled["transaction"]])
                    assert sent["status"] == "0x1"
                    assert sent["from"].lower() == accounts[name]["evm_gas"].lower()
                before, state = state, chain_state()
                moved = {key: state[key] - before[key] for key in state if state[key] != before[key]}
                gas = moved.pop((name, f"{network} gas"), 0)
                assert gas < 0, f"gateway {name}'s own {network} account paid no fee"
                # Exactly the price, from the payer to this gateway's merchant; nothing else moved.
                assert moved == {("payer", network): -price, (name, f"{network} merchant"): price}
    finally:
        for proc, _ in gateways.values():
            stop(proc)
