// SPDX-License-Identifier: MIT
pragma solidity ^0.8.28;

import {SafeTransfer} from "./SafeTransfer.sol";
import {SignatureCheck} from "./SignatureCheck.sol";
import {TransientLock} from "./TransientLock.sol";
import {IDepositCollector, IERC20Minimal} from "./X402Interfaces.sol";

/// @title paywire's devnet x402BatchSettlement (canonical address 0x4020074e…0003).
/// @notice Unidirectional payment channels of x402's `batch-settlement` scheme: a payer deposits
/// once, signs a cumulative voucher per call off-chain, and the receiver side claims many
/// channels in one transaction, then sweeps what it claimed in one transfer (`settle`).
/// Written by paywire from the published specs (`scheme_batch_settlement_evm.md`, the contract's
/// implementer notes) and the x402 SDK's ABI; not the x402 project's code.
/// @dev No immutables and no constructor: the EIP-712 domain is computed from the live chain id
/// and address, so the runtime code works wherever a chain installs it.
contract X402BatchSettlement is TransientLock {
    using SafeTransfer for address;

    struct ChannelConfig {
        address payer;
        address payerAuthorizer; // zero: vouchers are checked against `payer` (ECDSA or EIP-1271)
        address receiver;
        address receiverAuthorizer;
        address token;
        uint40 withdrawDelay;
        bytes32 salt;
    }

    struct Voucher {
        ChannelConfig channel;
        uint128 maxClaimableAmount;
    }

    struct VoucherClaim {
        Voucher voucher;
        bytes signature;
        uint128 totalClaimed;
    }

    /// @dev `balance` is what was deposited less refunds and withdrawals (a settle does not reduce
    /// it); `balance - totalClaimed` is the escrow the payer may still get back.
    struct Channel {
        uint128 balance;
        uint128 totalClaimed;
    }

    struct PendingWithdrawal {
        uint128 amount;
        uint40 initiatedAt;
    }

    struct ReceiverTotals {
        uint128 totalClaimed;
        uint128 totalSettled;
    }

    uint40 public constant MIN_WITHDRAW_DELAY = 900;
    uint40 public constant MAX_WITHDRAW_DELAY = 2_592_000;

    bytes32 private constant _DOMAIN_TYPEHASH =
        keccak256("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)");
    bytes32 private constant _NAME_HASH = keccak256("x402 Batch Settlement");
    bytes32 private constant _VERSION_HASH = keccak256("1");
    bytes32 public constant CHANNEL_CONFIG_TYPEHASH = keccak256(
        "ChannelConfig(address payer,address payerAuthorizer,address receiver,address receiverAuthorizer,address token,uint40 withdrawDelay,bytes32 salt)"
    );
    bytes32 public constant VOUCHER_TYPEHASH =
        keccak256("Voucher(bytes32 channelId,uint128 maxClaimableAmount)");
    bytes32 public constant REFUND_TYPEHASH =
        keccak256("Refund(bytes32 channelId,uint256 nonce,uint128 amount)");
    bytes32 public constant CLAIM_ENTRY_TYPEHASH =
        keccak256("ClaimEntry(bytes32 channelId,uint128 maxClaimableAmount,uint128 totalClaimed)");
    bytes32 public constant CLAIM_BATCH_TYPEHASH = keccak256(
        "ClaimBatch(ClaimEntry[] claims)ClaimEntry(bytes32 channelId,uint128 maxClaimableAmount,uint128 totalClaimed)"
    );

    mapping(bytes32 channelId => Channel) public channels;
    mapping(bytes32 channelId => PendingWithdrawal) public pendingWithdrawals;
    mapping(bytes32 channelId => uint256) public refundNonce;
    mapping(address receiver => mapping(address token => ReceiverTotals)) public receivers;

    event ChannelCreated(bytes32 indexed channelId, ChannelConfig config);
    event ChannelClosed(bytes32 indexed channelId, ChannelConfig config);
    event Deposited(bytes32 indexed channelId, address indexed sender, uint128 amount, uint128 newBalance);
    event Claimed(bytes32 indexed channelId, address indexed sender, uint128 claimAmount, uint128 newTotalClaimed);
    event Settled(address indexed receiver, address indexed token, address indexed sender, uint128 amount);
    event Refunded(bytes32 indexed channelId, address indexed sender, uint128 amount);
    event WithdrawInitiated(bytes32 indexed channelId, uint128 amount, uint40 finalizeAfter);
    event WithdrawFinalized(bytes32 indexed channelId, address indexed sender, uint128 amount);

    error InvalidPayer();
    error InvalidReceiver();
    error InvalidReceiverAuthorizer();
    error InvalidToken();
    error InvalidWithdrawDelay(uint40 withdrawDelay, uint40 min, uint40 max);
    error ZeroAmount();
    error InvalidCollector();
    error BalanceOverflow();
    error DepositNotReceived(uint256 expected, uint256 received);
    error EmptyBatch();
    error NotReceiverSide(address caller);
    error NotPayerSide(address caller);
    error AuthorizerMismatch(uint256 row);
    error InvalidAuthorizerSignature();
    error InvalidVoucherSignature(bytes32 channelId);
    error ClaimExceedsVoucher(bytes32 channelId, uint128 totalClaimed, uint128 maxClaimableAmount);
    error ClaimExceedsBalance(bytes32 channelId, uint128 totalClaimed, uint128 balance);
    error InvalidRefundNonce(uint256 expected);
    error WithdrawalPending();
    error NoPendingWithdrawal();
    error WithdrawalTooEarly(uint256 finalizeAfter);
    error WithdrawExceedsUnclaimed(uint128 unclaimed);

    // ---- deposits ----

    /// @notice Anyone may deposit for a payer (the facilitator pays the gas): the collector pulls
    /// the payer's signed authorization, and refuses every caller but this contract.
    function deposit(
        ChannelConfig calldata config,
        uint128 amount,
        address collector,
        bytes calldata collectorData
    ) external nonReentrant {
        _requireValidConfig(config);
        if (amount == 0) revert ZeroAmount();
        if (collector == address(0)) revert InvalidCollector();
        bytes32 channelId = getChannelId(config);
        Channel storage channel = channels[channelId];
        uint256 newBalance = uint256(channel.balance) + amount;
        if (newBalance > type(uint128).max) revert BalanceOverflow();

        uint256 held = IERC20Minimal(config.token).balanceOf(address(this));
        IDepositCollector(collector).collect(config.payer, config.token, amount, channelId, collectorData);
        // Credit only what arrived: a collector (or a fee-on-transfer token) that delivers less
        // must not leave the channel holding a claim on other channels' escrow.
        uint256 received = IERC20Minimal(config.token).balanceOf(address(this)) - held;
        if (received != amount) revert DepositNotReceived(amount, received);

        bool created = channel.balance == 0 && channel.totalClaimed == 0;
        channel.balance = uint128(newBalance);
        if (created) emit ChannelCreated(channelId, config);
        emit Deposited(channelId, msg.sender, amount, uint128(newBalance));
    }

    // ---- claims (accounting only: no token moves) ----

    /// @notice Claims by the receiver side itself: the caller is each row's receiver or
    /// receiverAuthorizer.
    function claim(VoucherClaim[] calldata voucherClaims) external nonReentrant {
        if (voucherClaims.length == 0) revert EmptyBatch();
        bytes32 domain = _domainSeparator();
        for (uint256 i = 0; i < voucherClaims.length; ++i) {
            ChannelConfig calldata config = voucherClaims[i].voucher.channel;
            if (msg.sender != config.receiver && msg.sender != config.receiverAuthorizer) {
                revert NotReceiverSide(msg.sender);
            }
            _claim(domain, voucherClaims[i], _channelId(domain, config));
        }
    }

    /// @notice Claims anyone may relay: row 0's receiverAuthorizer signed the whole batch (EIP-712
    /// ClaimBatch), and every row names that same authorizer.
    function claimWithSignature(VoucherClaim[] calldata voucherClaims, bytes calldata authorizerSignature)
        external
        nonReentrant
    {
        if (voucherClaims.length == 0) revert EmptyBatch();
        bytes32 domain = _domainSeparator();
        address authorizer = voucherClaims[0].voucher.channel.receiverAuthorizer;
        bytes32[] memory channelIds = new bytes32[](voucherClaims.length);
        for (uint256 i = 0; i < voucherClaims.length; ++i) {
            if (voucherClaims[i].voucher.channel.receiverAuthorizer != authorizer) revert AuthorizerMismatch(i);
            channelIds[i] = _channelId(domain, voucherClaims[i].voucher.channel);
        }
        bytes32 digest = _typedDataHash(domain, _claimBatchHash(voucherClaims, channelIds));
        if (!SignatureCheck.isValidNow(authorizer, digest, authorizerSignature)) revert InvalidAuthorizerSignature();
        for (uint256 i = 0; i < voucherClaims.length; ++i) {
            _claim(domain, voucherClaims[i], channelIds[i]);
        }
    }

    /// @dev A row at or below what is already claimed is skipped, not refused: a replayed batch
    /// and the refund path's claim-then-refund both rely on it.
    function _claim(bytes32 domain, VoucherClaim calldata row, bytes32 channelId) private {
        Channel storage channel = channels[channelId];
        uint128 claimed = channel.totalClaimed;
        uint128 total = row.totalClaimed;
        if (total <= claimed) return;
        uint128 ceiling = row.voucher.maxClaimableAmount;
        if (total > ceiling) revert ClaimExceedsVoucher(channelId, total, ceiling);
        if (total > channel.balance) revert ClaimExceedsBalance(channelId, total, channel.balance);
        bytes32 digest = _typedDataHash(domain, keccak256(abi.encode(VOUCHER_TYPEHASH, channelId, ceiling)));
        if (!_isPayerSignature(row.voucher.channel, digest, row.signature)) revert InvalidVoucherSignature(channelId);

        uint128 delta = total - claimed;
        channel.totalClaimed = total;
        ChannelConfig calldata config = row.voucher.channel;
        receivers[config.receiver][config.token].totalClaimed += delta;
        emit Claimed(channelId, msg.sender, delta, total);
    }

    function _isPayerSignature(ChannelConfig calldata config, bytes32 digest, bytes calldata signature)
        private
        view
        returns (bool)
    {
        if (config.payerAuthorizer != address(0)) {
            // A committed EOA key: ECDSA only, as the spec's fast path verifies it off-chain.
            address recovered = SignatureCheck.recover(digest, signature);
            return recovered != address(0) && recovered == config.payerAuthorizer;
        }
        return SignatureCheck.isValidNow(config.payer, digest, signature);
    }

    // ---- settlement: what was claimed goes to the receiver, in one transfer ----

    /// @notice Permissionless; nothing to move is not an error (no event, no transfer).
    function settle(address receiver, address token) external nonReentrant {
        ReceiverTotals storage totals = receivers[receiver][token];
        uint128 amount = totals.totalClaimed - totals.totalSettled;
        if (amount == 0) return;
        totals.totalSettled = totals.totalClaimed;
        token.safeTransfer(receiver, amount);
        emit Settled(receiver, token, msg.sender, amount);
    }

    // ---- cooperative refunds (receiver side) ----

    function refund(ChannelConfig calldata config, uint128 amount) external nonReentrant {
        if (msg.sender != config.receiver && msg.sender != config.receiverAuthorizer) {
            revert NotReceiverSide(msg.sender);
        }
        _refund(config, getChannelId(config), amount);
    }

    /// @notice Anyone may relay a refund the receiverAuthorizer signed for the channel's current
    /// refund nonce.
    function refundWithSignature(
        ChannelConfig calldata config,
        uint128 amount,
        uint256 nonce,
        bytes calldata receiverAuthorizerSignature
    ) external nonReentrant {
        bytes32 channelId = getChannelId(config);
        uint256 expected = refundNonce[channelId];
        if (nonce != expected) revert InvalidRefundNonce(expected);
        bytes32 digest = getRefundDigest(channelId, nonce, amount);
        if (!SignatureCheck.isValidNow(config.receiverAuthorizer, digest, receiverAuthorizerSignature)) {
            revert InvalidAuthorizerSignature();
        }
        _refund(config, channelId, amount);
    }

    /// @dev The nonce moves first, even when nothing is left to return: one counter for both
    /// entry points, so a direct refund also retires any refund signed for the old nonce.
    function _refund(ChannelConfig calldata config, bytes32 channelId, uint128 amount) private {
        if (amount == 0) revert ZeroAmount();
        refundNonce[channelId] += 1;
        Channel storage channel = channels[channelId];
        uint128 unclaimed = channel.balance - channel.totalClaimed;
        uint128 refunded = amount < unclaimed ? amount : unclaimed;
        if (refunded == 0) return;
        channel.balance -= refunded;
        _shrinkPendingWithdrawal(channelId, refunded);
        emit Refunded(channelId, msg.sender, refunded);
        _closeIfEmpty(channelId, channel, config);
        config.token.safeTransfer(config.payer, refunded);
    }

    /// @dev What the receiver refunded no longer needs withdrawing: a pending withdrawal shrinks
    /// by it, or goes when the refund covers it.
    function _shrinkPendingWithdrawal(bytes32 channelId, uint128 refunded) private {
        PendingWithdrawal storage pending = pendingWithdrawals[channelId];
        if (pending.amount == 0) return;
        if (refunded >= pending.amount) {
            delete pendingWithdrawals[channelId];
        } else {
            pending.amount -= refunded;
        }
    }

    // ---- timed withdrawal (the payer's escape hatch) ----

    /// @notice Starts the withdrawal delay; the receiver side may still claim vouchers meanwhile,
    /// and the withdrawal then pays only what is still unclaimed.
    function initiateWithdraw(ChannelConfig calldata config, uint128 amount) external nonReentrant {
        _requirePayerSide(config);
        if (amount == 0) revert ZeroAmount();
        bytes32 channelId = getChannelId(config);
        if (pendingWithdrawals[channelId].amount != 0) revert WithdrawalPending();
        Channel storage channel = channels[channelId];
        uint128 unclaimed = channel.balance - channel.totalClaimed;
        if (amount > unclaimed) revert WithdrawExceedsUnclaimed(unclaimed);
        uint40 now40 = uint40(block.timestamp);
        pendingWithdrawals[channelId] = PendingWithdrawal({amount: amount, initiatedAt: now40});
        emit WithdrawInitiated(channelId, amount, now40 + config.withdrawDelay);
    }

    function finalizeWithdraw(ChannelConfig calldata config) external nonReentrant {
        _requirePayerSide(config);
        bytes32 channelId = getChannelId(config);
        PendingWithdrawal memory pending = pendingWithdrawals[channelId];
        if (pending.amount == 0) revert NoPendingWithdrawal();
        uint256 finalizeAfter = uint256(pending.initiatedAt) + config.withdrawDelay;
        if (block.timestamp < finalizeAfter) revert WithdrawalTooEarly(finalizeAfter);
        delete pendingWithdrawals[channelId];

        Channel storage channel = channels[channelId];
        uint128 unclaimed = channel.balance - channel.totalClaimed;
        // Claims made during the delay win: they are already out of the unclaimed escrow.
        uint128 withdrawn = pending.amount < unclaimed ? pending.amount : unclaimed;
        channel.balance -= withdrawn;
        emit WithdrawFinalized(channelId, msg.sender, withdrawn);
        _closeIfEmpty(channelId, channel, config);
        if (withdrawn > 0) config.token.safeTransfer(config.payer, withdrawn);
    }

    // ---- batching ----

    /// @notice Several calls on this contract in one transaction (the refund path sends
    /// [claimWithSignature, refundWithSignature]); the first failure reverts them all.
    function multicall(bytes[] calldata data) external returns (bytes[] memory results) {
        results = new bytes[](data.length);
        for (uint256 i = 0; i < data.length; ++i) {
            (bool ok, bytes memory result) = address(this).delegatecall(data[i]);
            if (!ok) {
                assembly {
                    revert(add(result, 0x20), mload(result))
                }
            }
            results[i] = result;
        }
    }

    // ---- EIP-712 views ----

    function getChannelId(ChannelConfig calldata config) public view returns (bytes32) {
        return _channelId(_domainSeparator(), config);
    }

    function getVoucherDigest(bytes32 channelId, uint128 maxClaimableAmount) external view returns (bytes32) {
        return _typedDataHash(_domainSeparator(), keccak256(abi.encode(VOUCHER_TYPEHASH, channelId, maxClaimableAmount)));
    }

    function getRefundDigest(bytes32 channelId, uint256 nonce, uint128 amount) public view returns (bytes32) {
        return _typedDataHash(_domainSeparator(), keccak256(abi.encode(REFUND_TYPEHASH, channelId, nonce, amount)));
    }

    function getClaimBatchDigest(VoucherClaim[] calldata voucherClaims) external view returns (bytes32) {
        bytes32 domain = _domainSeparator();
        bytes32[] memory channelIds = new bytes32[](voucherClaims.length);
        for (uint256 i = 0; i < voucherClaims.length; ++i) {
            channelIds[i] = _channelId(domain, voucherClaims[i].voucher.channel);
        }
        return _typedDataHash(domain, _claimBatchHash(voucherClaims, channelIds));
    }

    // ---- internals ----

    function _requireValidConfig(ChannelConfig calldata config) private pure {
        if (config.payer == address(0)) revert InvalidPayer();
        if (config.receiver == address(0)) revert InvalidReceiver();
        if (config.receiverAuthorizer == address(0)) revert InvalidReceiverAuthorizer();
        if (config.token == address(0)) revert InvalidToken();
        uint40 delay = config.withdrawDelay;
        if (delay < MIN_WITHDRAW_DELAY || delay > MAX_WITHDRAW_DELAY) {
            revert InvalidWithdrawDelay(delay, MIN_WITHDRAW_DELAY, MAX_WITHDRAW_DELAY);
        }
    }

    function _requirePayerSide(ChannelConfig calldata config) private view {
        bool payerSide = msg.sender == config.payer
            || (config.payerAuthorizer != address(0) && msg.sender == config.payerAuthorizer);
        if (!payerSide) revert NotPayerSide(msg.sender);
    }

    function _closeIfEmpty(bytes32 channelId, Channel storage channel, ChannelConfig calldata config) private {
        if (channel.balance == 0 && channel.totalClaimed == 0) emit ChannelClosed(channelId, config);
    }

    /// @dev A channel's id is its config's EIP-712 digest: bound to this chain and this address.
    function _channelId(bytes32 domain, ChannelConfig calldata config) private pure returns (bytes32) {
        return _typedDataHash(domain, keccak256(abi.encode(CHANNEL_CONFIG_TYPEHASH, config)));
    }

    function _claimBatchHash(VoucherClaim[] calldata voucherClaims, bytes32[] memory channelIds)
        private
        pure
        returns (bytes32)
    {
        bytes32[] memory entries = new bytes32[](voucherClaims.length);
        for (uint256 i = 0; i < voucherClaims.length; ++i) {
            entries[i] = keccak256(
                abi.encode(
                    CLAIM_ENTRY_TYPEHASH,
                    channelIds[i],
                    voucherClaims[i].voucher.maxClaimableAmount,
                    voucherClaims[i].totalClaimed
                )
            );
        }
        return keccak256(abi.encode(CLAIM_BATCH_TYPEHASH, keccak256(abi.encodePacked(entries))));
    }

    function _domainSeparator() private view returns (bytes32) {
        return keccak256(abi.encode(_DOMAIN_TYPEHASH, _NAME_HASH, _VERSION_HASH, block.chainid, address(this)));
    }

    function _typedDataHash(bytes32 domain, bytes32 structHash) private pure returns (bytes32) {
        return keccak256(abi.encodePacked("\x19\x01", domain, structHash));
    }
}
