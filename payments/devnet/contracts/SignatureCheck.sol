// SPDX-License-Identifier: MIT
pragma solidity ^0.8.28;

import {IERC1271} from "./X402Interfaces.sol";

/// @notice Signature checks routed by the signer's code, as USDC's and Permit2's are: an address
/// with code (a contract wallet, an EIP-7702 account) answers through EIP-1271, any other through
/// ECDSA with EIP-2's low-s rule. No fallback from one to the other: the x402 SDK verifies
/// signatures off-chain the same way (`verify_typed_data_strict`), so both sides agree.
library SignatureCheck {
    // secp256k1n / 2: a signature with a higher s is a malleable copy of another (EIP-2).
    uint256 private constant _HALF_N =
        0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF5D576E7357A4501DDFE92F46681B20A0;

    function isValidNow(address signer, bytes32 digest, bytes memory signature)
        internal
        view
        returns (bool)
    {
        if (signer.code.length > 0) {
            (bool ok, bytes memory result) = signer.staticcall(
                abi.encodeCall(IERC1271.isValidSignature, (digest, signature))
            );
            return ok && result.length >= 32
                && abi.decode(result, (bytes32)) == bytes32(IERC1271.isValidSignature.selector);
        }
        address recovered = recover(digest, signature);
        return recovered != address(0) && recovered == signer;
    }

    /// @dev The ECDSA signer of `digest`, or address(0) for a malformed or malleable signature.
    function recover(bytes32 digest, bytes memory signature) internal pure returns (address) {
        if (signature.length != 65) {
            return address(0);
        }
        bytes32 r;
        bytes32 s;
        uint8 v;
        assembly {
            r := mload(add(signature, 0x20))
            s := mload(add(signature, 0x40))
            v := byte(0, mload(add(signature, 0x60)))
        }
        if (uint256(s) > _HALF_N || (v != 27 && v != 28)) {
            return address(0);
        }
        return ecrecover(digest, v, r, s);
    }
}
