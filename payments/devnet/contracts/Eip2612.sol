// SPDX-License-Identifier: MIT
pragma solidity ^0.8.28;

import {IERC20Permit} from "./X402Interfaces.sol";

/// @notice An EIP-2612 permit signed for Permit2 did not apply (already used, expired, or the
/// token has no `permit`); the transfer that follows still decides.
event EIP2612PermitFailed(address indexed token, address indexed owner);

/// @notice Best-effort EIP-2612 permits, for the gasless Permit2 approval (x402's
/// `eip2612GasSponsoring`).
library Eip2612 {
    /// @dev Never reverts: anyone who sees the permit in a pending transaction can submit it first,
    /// and that must not block the payment; Permit2 itself refuses the transfer if the allowance
    /// is really missing.
    function tryPermit(
        address token,
        address owner,
        address spender,
        uint256 value,
        uint256 deadline,
        uint8 v,
        bytes32 r,
        bytes32 s
    ) internal {
        try IERC20Permit(token).permit(owner, spender, value, deadline, v, r, s) {}
        catch {
            emit EIP2612PermitFailed(token, owner);
        }
    }
}
