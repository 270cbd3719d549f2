// SPDX-License-Identifier: MIT
pragma solidity ^0.8.28;

import {Eip2612} from "./Eip2612.sol";
import {X402DepositCollectorBase} from "./X402DepositCollectorBase.sol";
import {ISignatureTransfer} from "./X402Interfaces.sol";

/// @title paywire's devnet Permit2DepositCollector for x402 batch settlement (0x4020425F…0005).
/// @notice Pulls a deposit through Permit2 (spender: this collector) straight into the settlement
/// contract; the witness binds the channel id, so the signature funds that channel only. An
/// optional EIP-2612 permit approves Permit2 in the same call (gasless for the payer).
/// Written by paywire from the x402 batch-settlement spec and the SDK's encoding.
contract X402Permit2DepositCollector is X402DepositCollectorBase {
    ISignatureTransfer public constant PERMIT2 =
        ISignatureTransfer(0x000000000022D473030F116dDEE9F6B43aC78BA3);
    bytes32 public constant DEPOSIT_WITNESS_TYPEHASH = keccak256("DepositWitness(bytes32 channelId)");
    string public constant DEPOSIT_WITNESS_TYPE_STRING =
        "DepositWitness witness)DepositWitness(bytes32 channelId)TokenPermissions(address token,uint256 amount)";

    error Permit2612AmountMismatch();

    /// @param collectorData abi.encode(uint256 nonce, uint256 deadline, bytes permit2Signature,
    /// bytes eip2612Permit), eip2612Permit empty or abi.encode(uint256 value, uint256 deadline,
    /// uint8 v, bytes32 r, bytes32 s) (the SDK's `build_permit2_collector_data`).
    function collect(address payer, address token, uint256 amount, bytes32 channelId, bytes calldata collectorData)
        external
        onlyBatchSettlement
    {
        (uint256 nonce, uint256 deadline, bytes memory permit2Signature, bytes memory eip2612Permit) =
            abi.decode(collectorData, (uint256, uint256, bytes, bytes));
        if (eip2612Permit.length > 0) _permitPermit2(payer, token, amount, eip2612Permit);
        PERMIT2.permitWitnessTransferFrom(
            ISignatureTransfer.PermitTransferFrom({
                permitted: ISignatureTransfer.TokenPermissions({token: token, amount: amount}),
                nonce: nonce,
                deadline: deadline
            }),
            ISignatureTransfer.SignatureTransferDetails({to: msg.sender, requestedAmount: amount}),
            payer,
            keccak256(abi.encode(DEPOSIT_WITNESS_TYPEHASH, channelId)),
            DEPOSIT_WITNESS_TYPE_STRING,
            permit2Signature
        );
    }

    function _permitPermit2(address payer, address token, uint256 amount, bytes memory eip2612Permit) private {
        (uint256 value, uint256 deadline, uint8 v, bytes32 r, bytes32 s) =
            abi.decode(eip2612Permit, (uint256, uint256, uint8, bytes32, bytes32));
        // Exactly this deposit: no standing allowance beyond it.
        if (value != amount) revert Permit2612AmountMismatch();
        Eip2612.tryPermit(token, payer, address(PERMIT2), value, deadline, v, r, s);
    }
}
