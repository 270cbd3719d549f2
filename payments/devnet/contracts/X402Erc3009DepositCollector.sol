// SPDX-License-Identifier: MIT
pragma solidity ^0.8.28;

import {SafeTransfer} from "./SafeTransfer.sol";
import {X402DepositCollectorBase} from "./X402DepositCollectorBase.sol";
import {IERC3009Receive} from "./X402Interfaces.sol";

/// @title paywire's devnet ERC3009DepositCollector for x402 batch settlement (0x40208060…0004).
/// @notice Pulls a deposit with the payer's EIP-3009 `receiveWithAuthorization` (payee: this
/// collector), then hands it to the settlement contract. The authorization's nonce is
/// keccak256(abi.encode(channelId, salt)): a signature for one channel cannot fund another.
/// Written by paywire from the x402 batch-settlement spec and the SDK's encoding.
contract X402Erc3009DepositCollector is X402DepositCollectorBase {
    using SafeTransfer for address;

    /// @param collectorData abi.encode(uint256 validAfter, uint256 validBefore, uint256 salt,
    /// bytes signature), as the SDK's `build_erc3009_collector_data` encodes it.
    function collect(address payer, address token, uint256 amount, bytes32 channelId, bytes calldata collectorData)
        external
        onlyBatchSettlement
    {
        (uint256 validAfter, uint256 validBefore, uint256 salt, bytes memory signature) =
            abi.decode(collectorData, (uint256, uint256, uint256, bytes));
        bytes32 nonce = keccak256(abi.encode(channelId, salt));
        IERC3009Receive(token).receiveWithAuthorization(
            payer, address(this), amount, validAfter, validBefore, nonce, signature
        );
        token.safeTransfer(msg.sender, amount);
    }
}
