// SPDX-License-Identifier: MIT
pragma solidity ^0.8.28;

import {X402Permit2ProxyBase} from "./X402Permit2ProxyBase.sol";
import {EIP2612Permit, ISignatureTransfer} from "./X402Interfaces.sol";

/// @title paywire's devnet x402ExactPermit2Proxy (canonical address 0x402085c2…0001).
/// @notice Moves exactly the permitted amount to the witness's destination (`exact` scheme,
/// Permit2 transfer method). Interface and checks from x402's `scheme_exact_evm.md` and the SDK's
/// ABI; paywire's own code, not the x402 project's.
contract X402ExactPermit2Proxy is X402Permit2ProxyBase {
    struct Witness {
        address to;
        uint256 validAfter;
    }

    bytes32 public constant WITNESS_TYPEHASH = keccak256("Witness(address to,uint256 validAfter)");
    string public constant WITNESS_TYPE_STRING =
        "Witness witness)TokenPermissions(address token,uint256 amount)Witness(address to,uint256 validAfter)";

    function settle(
        ISignatureTransfer.PermitTransferFrom calldata permit,
        address owner,
        Witness calldata witness,
        bytes calldata signature
    ) external nonReentrant {
        _requireSettleable(permit, owner, witness);
        _transfer(permit, owner, witness, signature);
    }

    function settleWithPermit(
        EIP2612Permit calldata permit2612,
        ISignatureTransfer.PermitTransferFrom calldata permit,
        address owner,
        Witness calldata witness,
        bytes calldata signature
    ) external nonReentrant {
        _requireSettleable(permit, owner, witness);
        _permitPermit2(permit, owner, permit2612);
        _transfer(permit, owner, witness, signature);
    }

    function _requireSettleable(
        ISignatureTransfer.PermitTransferFrom calldata permit,
        address owner,
        Witness calldata witness
    ) private view {
        if (permit.permitted.amount == 0) revert InvalidAmount();
        _requireOwnerDestinationAndTime(owner, witness.to, witness.validAfter);
    }

    function _transfer(
        ISignatureTransfer.PermitTransferFrom calldata permit,
        address owner,
        Witness calldata witness,
        bytes calldata signature
    ) private {
        bytes32 witnessHash = keccak256(abi.encode(WITNESS_TYPEHASH, witness.to, witness.validAfter));
        _pull(
            permit, owner, witness.to, permit.permitted.amount, witnessHash, WITNESS_TYPE_STRING, signature
        );
    }
}
