// SPDX-License-Identifier: MIT
pragma solidity ^0.8.28;

/// @notice The parts of other contracts paywire's x402 devnet contracts call, declared from their
/// published ABIs (Permit2's SignatureTransfer, ERC-20, EIP-2612, EIP-3009, EIP-1271).

/// @dev Permit2's signature-based transfer (canonical at 0x000000000022D473030F116dDEE9F6B43aC78BA3).
interface ISignatureTransfer {
    struct TokenPermissions {
        address token;
        uint256 amount;
    }

    struct PermitTransferFrom {
        TokenPermissions permitted;
        uint256 nonce;
        uint256 deadline;
    }

    struct SignatureTransferDetails {
        address to;
        uint256 requestedAmount;
    }

    function permitWitnessTransferFrom(
        PermitTransferFrom calldata permit,
        SignatureTransferDetails calldata transferDetails,
        address owner,
        bytes32 witness,
        string calldata witnessTypeString,
        bytes calldata signature
    ) external;
}

interface IERC20Minimal {
    function balanceOf(address account) external view returns (uint256);
    function transfer(address to, uint256 value) external returns (bool);
}

interface IERC20Permit {
    function permit(
        address owner,
        address spender,
        uint256 value,
        uint256 deadline,
        uint8 v,
        bytes32 r,
        bytes32 s
    ) external;
}

/// @dev EIP-3009's receive variant, `bytes signature` overload (FiatTokenV2_2, DevUSDC).
interface IERC3009Receive {
    function receiveWithAuthorization(
        address from,
        address to,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce,
        bytes memory signature
    ) external;
}

interface IERC1271 {
    function isValidSignature(bytes32 digest, bytes memory signature)
        external
        view
        returns (bytes4 magicValue);
}

/// @dev A batch-settlement deposit collector: pulls `amount` of `token` from `payer` and sends it
/// to the settlement contract, which is the only caller it accepts.
interface IDepositCollector {
    function collect(
        address payer,
        address token,
        uint256 amount,
        bytes32 channelId,
        bytes calldata collectorData
    ) external;
}

/// @dev The EIP-2612 permit fields the Permit2 proxies take (their ABI's `permit2612` tuple).
struct EIP2612Permit {
    uint256 value;
    uint256 deadline;
    bytes32 r;
    bytes32 s;
    uint8 v;
}
