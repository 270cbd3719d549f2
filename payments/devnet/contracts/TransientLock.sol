// SPDX-License-Identifier: MIT
pragma solidity ^0.8.28;

/// @notice A reentrancy lock in transient storage (EIP-1153): no storage slot to seed, so the
/// runtime code works when a chain installs it at an address without running a constructor.
abstract contract TransientLock {
    bool private transient _entered;

    error ReentrantCall();

    modifier nonReentrant() {
        if (_entered) revert ReentrantCall();
        _entered = true;
        _;
        _entered = false;
    }
}
