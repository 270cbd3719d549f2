// SPDX-License-Identifier: MIT
pragma solidity ^0.8.28;

import {X402Permit2ProxyBase} from "./X402Permit2ProxyBase.sol";
import {EIP2612Permit, ISignatureTransfer} from "./X402Interfaces.sol";

/// @title paywire's devnet x402UptoPermit2Proxy (canonical address 0x4020A4f3…0002).
/// @notice The payer permits a maximum; the facilitator named in the witness settles any amount
/// up to it (`upto` scheme). Interface and checks from x402's `scheme_upto_evm.md` and the SDK's
/// ABI; paywire's own code, not the x402 project's.
contract X402UptoPermit2Proxy is X402Permit2ProxyBase {
    struct Witness {
        address to;
        address facilitator;
        uint256 validAfter;
    }

    bytes32 public constant WITNESS_TYPEHASH =
        keccak256("Witness(address to,address facilitator,uint256 validAfter)");
    string public constant WITNESS_TYPE_STRING =
        "Witness witness)TokenPermissions(address token,uint256 amount)Witness(address to,address facilitator,uint256 validAfter)";

    error AmountExceedsPermitted();
    error UnauthorizedFacilitator();

    function settle(
        ISignatureTransfer.PermitTransferFrom calldata permit,
        uint256 amount,
        address owner,
        Witness calldata witness,
        bytes calldata signature
    ) external nonReentrant {
        _requireSettleable(permit, amount, owner, witness);
        _transfer(permit, amount, owner, witness, signature);
    }

    function settleWithPermit(
        EIP2612Permit calldata permit2612,
        ISignatureTransfer.PermitTransferFrom calldata permit,
        uint256 amount,
        address owner,
        Witness calldata witness,
        bytes calldata signature
    ) external nonReentrant {
        _requireSettleable(permit, amount, owner, witness);
        _permitPermit2(permit, owner, permit2612);
        _transfer(permit, amount, owner, witness, signature);
    }

    function _requireSettleable(
        ISignatureTransfer.PermitTransferFrom calldata permit,
        uint256 amount,
        address owner,
        Witness calldata witness
    ) private view {
        // A zero settlement moves nothing: the facilitator sends no transaction at all.
        if (amount == 0) revert InvalidAmount();
        if (amount > permit.permitted.amount) revert AmountExceedsPermitted();
        // Only the facilitator the payer signed for may choose the amount.
        if (msg.sender != witness.facilitator) revert UnauthorizedFacilitator();
        _requireOwnerDestinationAndTime(owner, witness.to, witness.validAfter);
    }

    function _transfer(
        ISignatureTransfer.PermitTransferFrom calldata permit,
        uint256 amount,
        address owner,
        Witness calldata witness,
        bytes calldata signature
    ) private {
        bytes32 witnessHash = keccak256(
            abi.encode(WITNESS_TYPEHASH, witness.to, witness.facilitator, witness.validAfter)
        );
        _pull(permit, owner, witness.to, amount, witnessHash, WITNESS_TYPE_STRING, signature);
    }
}
