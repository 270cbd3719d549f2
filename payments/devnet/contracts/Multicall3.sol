// SPDX-License-Identifier: MIT
pragma solidity ^0.8.28;

/// @title paywire's devnet stand-in for Multicall3 (canonical address 0xcA11bde0…CA11).
/// @notice Only the two batch entry points: the x402 SDK reads channel state and deploys ERC-6492
/// wallets through `tryAggregate`; `aggregate3` is what most other clients (viem) call. Same
/// selectors, tuple shapes and revert reason as the canonical contract; paywire's own code.
contract Multicall3 {
    struct Call {
        address target;
        bytes callData;
    }

    struct Call3 {
        address target;
        bool allowFailure;
        bytes callData;
    }

    struct Result {
        bool success;
        bytes returnData;
    }

    function tryAggregate(bool requireSuccess, Call[] calldata calls)
        external
        payable
        returns (Result[] memory returnData)
    {
        returnData = new Result[](calls.length);
        for (uint256 i = 0; i < calls.length; ++i) {
            returnData[i] = _call(calls[i].target, calls[i].callData, !requireSuccess);
        }
    }

    function aggregate3(Call3[] calldata calls)
        external
        payable
        returns (Result[] memory returnData)
    {
        returnData = new Result[](calls.length);
        for (uint256 i = 0; i < calls.length; ++i) {
            returnData[i] = _call(calls[i].target, calls[i].callData, calls[i].allowFailure);
        }
    }

    function _call(address target, bytes calldata callData, bool allowFailure)
        private
        returns (Result memory result)
    {
        (result.success, result.returnData) = target.call(callData);
        require(result.success || allowFailure, "Multicall3: call failed");
    }
}
