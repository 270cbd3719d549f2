// SPDX-License-Identifier: MIT
pragma solidity ^0.8.28;

import {IERC20Minimal} from "./X402Interfaces.sol";

/// @notice ERC-20 `transfer` that fails loudly: the token's own revert reason is passed on, and a
/// token answering `false` (or with no code at all) is refused.
library SafeTransfer {
    error TokenTransferFailed(address token, address to, uint256 amount);

    function safeTransfer(address token, address to, uint256 amount) internal {
        (bool ok, bytes memory result) = token.call(abi.encodeCall(IERC20Minimal.transfer, (to, amount)));
        if (!ok) {
            assembly {
                revert(add(result, 0x20), mload(result))
            }
        }
        bool answeredTrue = result.length == 0 ? token.code.length > 0 : abi.decode(result, (bool));
        if (!answeredTrue) revert TokenTransferFailed(token, to, amount);
    }
}
