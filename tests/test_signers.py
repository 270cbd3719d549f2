"""paywire's fixes on the SDK's production signers: the nonce is the node's, read under the send
lock (a refused send leaves no gap), and every send is traced for the settlement's verdict."""

from __future__ import annotations

import pytest
from eth_account import Account
from web3.exceptions import Web3RPCError

from payments.broadcast_trace import BroadcastTrace, Sent, current_trace
from payments.devnet.evm import EvmDevnet, _DevnetFacilitatorSigner, load_artifact


def test_a_refused_send_leaves_no_nonce_gap_and_is_traced_as_not_sent() -> None:
    devnet = EvmDevnet(facilitator_key=Account.create().key.hex(),
                       minter_key=Account.create().key.hex())
    broke = Account.create()  # no ETH: the node refuses the transaction
    signer = _DevnetFacilitatorSigner(broke.key.hex(), devnet)
    abi = load_artifact()["abi"]
    refused = BroadcastTrace()
    token = current_trace.set(refused)
    try:
        with pytest.raises(Web3RPCError):
            signer.write_contract(EvmDevnet.USDC_ADDRESS, abi, "transfer", broke.address, 0)
    finally:
        current_trace.reset(token)
    # the id was known before the send; the node's error answer means it is in no pool
    assert refused.sent is Sent.NO and refused.transaction is not None
    devnet.fund_gas(broke.address, 10**18)
    accepted = BroadcastTrace()
    token = current_trace.set(accepted)
    try:
        tx = signer.write_contract(EvmDevnet.USDC_ADDRESS, abi, "transfer", broke.address, 0)
    finally:
        current_trace.reset(token)
    assert signer.wait_for_transaction_receipt(tx).status == 1  # nonce 0: no gap was left
    assert accepted.sent is Sent.YES and accepted.transaction == tx


def test_the_solana_signer_knows_the_transaction_id_before_it_signs() -> None:
    """The settlement intent names the transaction that will land: the fee payer's ed25519
    signature, which is deterministic, equals what the SDK's sign_transaction puts in slot 0."""
    import base64

    from solders.hash import Hash
    from solders.instruction import AccountMeta, Instruction
    from solders.keypair import Keypair
    from solders.message import MessageV0
    from solders.null_signer import NullSigner
    from solders.pubkey import Pubkey
    from solders.transaction import VersionedTransaction

    from payments.signers import StrictFacilitatorKeypairSigner

    fee_payer, payer = Keypair(), Keypair()
    message = MessageV0.try_compile(fee_payer.pubkey(), [Instruction(
        Pubkey.default(), b"", [AccountMeta(payer.pubkey(), is_signer=True, is_writable=False)])],
        [], Hash.new_unique())
    partial = VersionedTransaction(message, [NullSigner(fee_payer.pubkey()), payer])
    signer = StrictFacilitatorKeypairSigner([fee_payer], rpc_url="http://127.0.0.1:9")
    ahead = signer.fee_payer_signature(partial)
    signed = VersionedTransaction.from_bytes(base64.b64decode(signer.sign_transaction(
        base64.b64encode(bytes(partial)).decode(), str(fee_payer.pubkey()), "solana:devnet")))
    assert ahead == str(signed.signatures[0])
    assert StrictFacilitatorKeypairSigner([Keypair()]).fee_payer_signature(partial) is None
