// SPDX-License-Identifier: MIT
pragma solidity ^0.8.28;

import {IDepositCollector} from "./X402Interfaces.sol";

/// @notice What every batch-settlement deposit collector shares: only the settlement contract may
/// call `collect`. Otherwise anyone holding a payer's signed deposit could pull it into their own
/// address instead of the payer's channel.
abstract contract X402DepositCollectorBase is IDepositCollector {
    address public constant BATCH_SETTLEMENT = 0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003;

    error OnlyBatchSettlement(address caller);

    modifier onlyBatchSettlement() {
        if (msg.sender != BATCH_SETTLEMENT) revert OnlyBatchSettlement(msg.sender);
        _;
    }
}
