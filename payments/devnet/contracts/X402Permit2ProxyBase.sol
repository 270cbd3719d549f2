// SPDX-License-Identifier: MIT
pragma solidity ^0.8.28;

import {Eip2612} from "./Eip2612.sol";
import {TransientLock} from "./TransientLock.sol";
import {EIP2612Permit, ISignatureTransfer} from "./X402Interfaces.sol";

/// @notice What x402's exact and upto Permit2 proxies share (written from the x402 specs
/// `scheme_exact_evm.md` and `scheme_upto_evm.md`): the payer signs a Permit2 witness transfer
/// whose spender is the proxy, and the witness binds the destination, so whoever submits it
/// cannot send the money elsewhere.
/// @dev Custom error names are the ones the x402 SDK classifies settle failures by.
/// No immutables and no storage: the runtime code is installed at the canonical address as is.
abstract contract X402Permit2ProxyBase is TransientLock {
    ISignatureTransfer public constant PERMIT2 =
        ISignatureTransfer(0x000000000022D473030F116dDEE9F6B43aC78BA3);

    error InvalidAmount();
    error InvalidOwner();
    error InvalidDestination();
    error PaymentTooEarly();
    error Permit2612AmountMismatch();

    function _requireOwnerDestinationAndTime(address owner, address to, uint256 validAfter) internal view {
        if (owner == address(0)) revert InvalidOwner();
        if (to == address(0)) revert InvalidDestination();
        if (block.timestamp < validAfter) revert PaymentTooEarly();
    }

    /// @dev The payer's EIP-2612 approval of Permit2, for exactly the amount the Permit2
    /// signature permits (no standing allowance beyond this payment).
    function _permitPermit2(
        ISignatureTransfer.PermitTransferFrom calldata permit,
        address owner,
        EIP2612Permit calldata permit2612
    ) internal {
        if (permit2612.value != permit.permitted.amount) revert Permit2612AmountMismatch();
        Eip2612.tryPermit(
            permit.permitted.token,
            owner,
            address(PERMIT2),
            permit2612.value,
            permit2612.deadline,
            permit2612.v,
            permit2612.r,
            permit2612.s
        );
    }

    function _pull(
        ISignatureTransfer.PermitTransferFrom calldata permit,
        address owner,
        address to,
        uint256 amount,
        bytes32 witness,
        string memory witnessTypeString,
        bytes calldata signature
    ) internal {
        PERMIT2.permitWitnessTransferFrom(
            permit,
            ISignatureTransfer.SignatureTransferDetails({to: to, requestedAmount: amount}),
            owner,
            witness,
            witnessTypeString,
            signature
        );
    }
}
