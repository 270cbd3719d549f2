"""Production configuration paths: a remote facilitator over HTTP; an in-process facilitator
settling through a node's RPC. The gateway runs exactly as an operator would configure it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from x402 import x402FacilitatorSync
from x402.mechanisms.evm.exact import register_exact_evm_facilitator
from x402.mechanisms.svm.exact import register_exact_svm_facilitator

from payments.devnet import Devnet
from payments.devnet.keys import DevnetKeys
from payments.networks import BASE_SEPOLIA, SOLANA_DEVNET
from tests.support.facilitator_server import facilitator_app
from tests.support.jsonrpc_http import JsonRpcHttpServer
from tests.support.live_server import LiveServer, bound_socket, run_in_thread, start_server
from tests.support.paying import (
    EVM_NET,
    SOL_NET,
    client_for,
    header,
    post_paid,
    quote,
    receipt,
    sign,
)

BODY = {"text": "Paid through a remote facilitator.", "model": "gpt-4o-mini"}


class _Remote:
    def __init__(self, devnet: Devnet, gateway: LiveServer, calls: list[str], sol_rpc: str) -> None:
        self.devnet, self.gateway, self.calls, self.sol_rpc = devnet, gateway, calls, sol_rpc


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Remote]:
    devnet = Devnet(DevnetKeys.generate())
    evm_signer, svm_signer = devnet.signers()
    facilitator = x402FacilitatorSync()
    register_exact_evm_facilitator(facilitator, evm_signer, networks=[BASE_SEPOLIA.caip2])
    register_exact_svm_facilitator(facilitator, svm_signer, networks=[SOLANA_DEVNET.caip2])
    app = facilitator_app(facilitator)
    sock, port = bound_socket()
    fserver, fthread = run_in_thread(app, sock)
    rpc = JsonRpcHttpServer(devnet.solana.rpc).start()
    gateway = start_server(tmp_path_factory.mktemp("remote"), env={
        "PAYWIRE_NETWORKS": "base-sepolia,solana-devnet",
        "PAYWIRE_EVM_PAY_TO": devnet.keys.evm_merchant_address,
        "PAYWIRE_SOLANA_PAY_TO": devnet.keys.sol_merchant_address,
        "PAYWIRE_FACILITATOR_URL": f"http://127.0.0.1:{port}",
    })
    yield _Remote(devnet, gateway, app.state.calls, rpc.url)
    gateway.stop()
    rpc.close()
    fserver.should_exit = True
    fthread.join(timeout=15)


@pytest.mark.parametrize("network", [EVM_NET, SOL_NET])
def test_remote_facilitator_verifies_and_settles_over_http(remote: _Remote, network: str) -> None:
    url = f"{remote.gateway.url}/v1/marketplace/api/token-count-508"
    keys = remote.devnet.keys
    _, required = quote(url, BODY)
    assert required.accepts[1].extra["feePayer"]  # learned from the facilitator's /supported
    # A production gateway serves no devnet RPC: the payer uses the chain's own node.
    client = client_for(remote.gateway.url, evm_key=keys.evm_payer, sol_key=keys.sol_payer,
                        sol_rpc=remote.sol_rpc)
    before = remote.devnet.merchant_balances()
    calls_before = len(remote.calls)
    r = post_paid(url, BODY, header(sign(client, required, network)))
    assert r.status_code == 200, r.text
    assert receipt(r)["network"] == network and receipt(r)["success"] is True
    after = remote.devnet.merchant_balances()
    moved = after.evm - before.evm if network == EVM_NET else after.solana - before.solana
    assert moved == 5750
    assert remote.calls[calls_before:] == ["verify", "settle"]


def test_production_gateway_has_no_devnet_routes(remote: _Remote) -> None:
    assert httpx.get(f"{remote.gateway.url}/devnet").status_code == 404
    assert httpx.post(f"{remote.gateway.url}/devnet/faucet", json={}).status_code == 404


def test_in_process_facilitator_settles_through_an_anvil_node(tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    """PAYWIRE_EVM_FACILITATOR_KEY + PAYWIRE_EVM_RPC_URL: the SDK's FacilitatorWeb3Signer over a
    real node's JSON-RPC (anvil), the production path."""
    from eth_account import Account

    from tests.support.evm_anvil import AnvilUsdc, anvil_missing, run_anvil

    if anvil_missing():
        pytest.skip(anvil_missing())
    facilitator_key = "0x" + Account.create().key.hex().removeprefix("0x")
    merchant, payer = Account.create(), Account.create()
    payer_key = "0x" + payer.key.hex().removeprefix("0x")
    with run_anvil() as node:
        chain = AnvilUsdc(node, facilitator_key=facilitator_key,
                          minter_key=Account.create().key.hex())
        chain.mint(payer.address, 100_000)
        gateway = start_server(tmp_path_factory.mktemp("anvil"), env={
            "PAYWIRE_NETWORKS": "base-sepolia",
            "PAYWIRE_EVM_PAY_TO": merchant.address,
            "PAYWIRE_EVM_FACILITATOR_KEY": facilitator_key,
            "PAYWIRE_EVM_RPC_URL": node.url,
        })
        try:
            url = f"{gateway.url}/v1/marketplace/api/token-count-508"
            r, required = quote(url, BODY)
            assert [a["network"] for a in r.json()["accepts"]] == ["base-sepolia"]
            paid = post_paid(url, BODY, header(sign(client_for(gateway.url, evm_key=payer_key),
                                                    required, EVM_NET)))
            assert paid.status_code == 200, paid.text
            tx = receipt(paid)["transaction"]
            assert node.web3().eth.get_transaction_receipt(tx)["status"] == 1
            assert chain.balance_of(merchant.address) == 5750
            assert chain.balance_of(payer.address) == 100_000 - 5750
            # the same payment again: the kept answer, nothing moves
            again = post_paid(url, BODY, paid.request.headers["PAYMENT-SIGNATURE"])
            assert again.status_code == 200 and again.json() == paid.json()
            assert receipt(again)["transaction"] == tx
            assert chain.balance_of(merchant.address) == 5750
        finally:
            gateway.stop()


def test_gateway_settles_on_circles_real_fiattoken(tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    """The whole HTTP flow with Circle's FiatTokenV2_2 (npm artifacts) at the USDC address."""
    from tests.support.evm_circle import circle_missing, deploy_circle_usdc

    if circle_missing():
        pytest.skip(circle_missing())
    keys = DevnetKeys.generate()
    evm = deploy_circle_usdc(facilitator_key=keys.evm_facilitator, minter_key=keys.evm_minter)
    devnet = Devnet(keys, evm=evm)
    gateway = start_server(tmp_path_factory.mktemp("circle"), devnet=devnet)
    try:
        url = f"{gateway.url}/v1/marketplace/api/token-count-508"
        _, required = quote(url, BODY)
        before = devnet.merchant_balances().evm
        paid = post_paid(url, BODY, header(sign(client_for(gateway.url, evm_key=keys.evm_payer),
                                                required, EVM_NET)))
        assert paid.status_code == 200, paid.text
        assert devnet.merchant_balances().evm - before == 5750
        assert evm.balance_of(keys.evm_payer_address) == 100_000_000 - 5750
        # The replay is answered from the ledger (the nonce is used on chain, so Circle's contract
        # fails its verification: that must not read as "nothing was charged").
        again = post_paid(url, BODY, paid.request.headers["PAYMENT-SIGNATURE"])
        assert again.status_code == 200 and again.json() == paid.json()
        assert devnet.merchant_balances().evm - before == 5750
        # for another request it is refused
        other = post_paid(url, {**BODY, "text": "another"}, paid.request.headers["PAYMENT-SIGNATURE"])
        assert other.status_code == 402 and other.json()["reason"]
    finally:
        gateway.stop()
