"""paywire's fixes on the SDK's production signers."""

from __future__ import annotations

import pytest
from eth_account import Account

from payments.devnet.evm import EvmDevnet, _DevnetFacilitatorSigner, load_artifact


def test_a_failed_write_forgets_the_reserved_nonce_so_later_settlements_do_not_stall() -> None:
    devnet = EvmDevnet(facilitator_key=Account.create().key.hex(),
                       minter_key=Account.create().key.hex())
    broke = Account.create()  # no ETH: the broadcast fails after a nonce was reserved
    signer = _DevnetFacilitatorSigner(broke.key.hex(), devnet)
    abi = load_artifact()["abi"]
    with pytest.raises(Exception):  # noqa: B017 - whatever the node says about gas funds
        signer.write_contract(EvmDevnet.USDC_ADDRESS, abi, "transfer", broke.address, 0)
    assert signer._next_nonce is None  # the cursor is dropped, not left one past the gap
    devnet.fund_gas(broke.address, 10**18)
    tx = signer.write_contract(EvmDevnet.USDC_ADDRESS, abi, "transfer", broke.address, 0)
    assert signer.wait_for_transaction_receipt(tx).status == 1
