"""The x402 contracts on paywire's devnets: which, at which address, and how a chain gets them.

Both EVM devnets (py-evm, payments/devnet/evm.py; anvil, tests/support/evm_anvil.py) install the
same set through this module, at the canonical addresses the x402 SDK uses, so the SDK's own
`upto`, `exact` (Permit2) and `batch-settlement` clients and facilitators run unchanged:

- Permit2, Uniswap's real bytecode, built on this machine from the npm package by
  contracts/build_permit2.py into contracts/build/Permit2.json (not shipped: it contains
  solmate's AGPL-3.0-only code). Each chain deploys it with a real CREATE2 transaction through
  Arachnid's deterministic-deployment proxy, as every real network did, so Permit2's constructor
  fills its two immutables (the chain id and its EIP-712 domain separator) itself.
- paywire's own stand-ins for the x402 contracts and Multicall3 (contracts/X402Contracts.json,
  built by contracts/build.py): runtime code with no immutables and no constructor state, set
  straight at the address (genesis state / anvil_setCode).

Either file may be missing: the devnet then runs without those contracts, and says once which
schemes cannot settle on it and how to build what is missing.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eth_utils import keccak, to_checksum_address
from x402.mechanisms.evm.batch_settlement.constants import (
    BATCH_SETTLEMENT_ADDRESS,
    ERC3009_DEPOSIT_COLLECTOR_ADDRESS,
    PERMIT2_DEPOSIT_COLLECTOR_ADDRESS,
)
from x402.mechanisms.evm.constants import (
    MULTICALL3_ADDRESS,
    PERMIT2_ADDRESS,
    X402_EXACT_PERMIT2_PROXY_ADDRESS,
    X402_UPTO_PERMIT2_PROXY_ADDRESS,
)

from .contracts.build import X402_ARTIFACT

log = logging.getLogger(__name__)

PERMIT2_ARTIFACT = Path(__file__).resolve().parent / "contracts" / "build" / "Permit2.json"
BUILD_PERMIT2 = (
    "`npm ci && .venv/bin/python -m payments.devnet.contracts.build_permit2` in a paywire checkout "
    "(docs/devnet.md)"
)

# Arachnid's deterministic-deployment proxy: calldata = salt ++ init code -> CREATE2. anvil
# predeploys it; the py-evm devnet puts this runtime in its genesis state.
CREATE2_DEPLOYER = "0x4e59b44847b379578588920cA78FbF26c0B4956C"
CREATE2_DEPLOYER_CODE = bytes.fromhex(
    "7fffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffe0"
    "3601600081602082378035828234f58015156039578182fd5b8082525050506014600cf3"
)
# Permit2's published deployment: its salt and init-code hash give PERMIT2_ADDRESS.
PERMIT2_SALT = bytes.fromhex("0000000000000000000000000000000000000000d3af2663da51c10215000000")
PERMIT2_INIT_CODE_HASH = bytes.fromhex("e2be1e05eedf35dacd66c65c862f8150ff9ab4b6b24b9bbe62be71b6b16cf0f8")
# The CREATE2 deployment measured 2.03 M gas on both chains; a fixed limit skips an estimate.
PERMIT2_DEPLOY_GAS = 3_000_000

# The addresses the SDK calls: a stand-in anywhere else would never be used.
CANONICAL_ADDRESSES = frozenset(
    {
        PERMIT2_ADDRESS,
        X402_EXACT_PERMIT2_PROXY_ADDRESS,
        X402_UPTO_PERMIT2_PROXY_ADDRESS,
        MULTICALL3_ADDRESS,
        BATCH_SETTLEMENT_ADDRESS,
        ERC3009_DEPOSIT_COLLECTOR_ADDRESS,
        PERMIT2_DEPOSIT_COLLECTOR_ADDRESS,
    }
)
# What each scheme needs on chain, to say what a devnet without some contract cannot settle.
_SCHEME_NEEDS: dict[str, tuple[str, ...]] = {
    "upto": (PERMIT2_ADDRESS, X402_UPTO_PERMIT2_PROXY_ADDRESS),
    "exact through Permit2": (PERMIT2_ADDRESS, X402_EXACT_PERMIT2_PROXY_ADDRESS),
    "batch-settlement": (BATCH_SETTLEMENT_ADDRESS, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, MULTICALL3_ADDRESS),
    "batch-settlement Permit2 deposits": (
        PERMIT2_ADDRESS,
        BATCH_SETTLEMENT_ADDRESS,
        PERMIT2_DEPOSIT_COLLECTOR_ADDRESS,
        MULTICALL3_ADDRESS,
    ),
}


class DevnetContractError(RuntimeError):
    """A devnet contract is not what its artifact says (a broken build or installation)."""


def create2_address(deployer: str, salt: bytes, init_code: bytes) -> str:
    """The address CREATE2 gives `init_code` deployed by `deployer` with `salt` (EIP-1014)."""
    digest = keccak(b"\xff" + bytes.fromhex(deployer[2:]) + salt + keccak(init_code))
    return to_checksum_address(digest[12:])


def check_permit2_init_code(init_code: bytes) -> None:
    """Raise DevnetContractError unless `init_code` is Permit2's published one.

    Its hash must be the published init-code hash, and CREATE2 through Arachnid's proxy with
    Permit2's salt must land it at PERMIT2_ADDRESS, where the SDK's clients sign for it.
    """
    digest = keccak(init_code)
    if digest != PERMIT2_INIT_CODE_HASH:
        raise DevnetContractError(
            f"Permit2's init code hashes to 0x{digest.hex()}, not the published "
            f"0x{PERMIT2_INIT_CODE_HASH.hex()}: rebuild it with {BUILD_PERMIT2}"
        )
    address = create2_address(CREATE2_DEPLOYER, PERMIT2_SALT, init_code)
    if address != PERMIT2_ADDRESS:
        raise DevnetContractError(f"Permit2's init code deploys to {address}, not {PERMIT2_ADDRESS}")


@dataclass(frozen=True)
class PresetContract:
    """Runtime code set straight at its address: no constructor runs, none is needed."""

    name: str
    address: str
    abi: list[Any]
    code: bytes


@dataclass(frozen=True)
class Permit2Build:
    """Permit2 as contracts/build_permit2.py built it (checked against the published hash)."""

    abi: list[Any]
    init_code: bytes
    runtime: bytes  # as compiled: the immutables' bytes are zero
    immutables: Mapping[str, tuple[int, ...]]  # name -> byte offsets of its 32-byte slots

    def deploy_transaction(self) -> dict[str, Any]:
        """The CREATE2 deployment's fields (the sender adds nonce, chain id and fees)."""
        return {
            "to": CREATE2_DEPLOYER,
            "data": "0x" + (PERMIT2_SALT + self.init_code).hex(),
            "gas": PERMIT2_DEPLOY_GAS,
            "value": 0,
        }

    def matches(self, code: bytes) -> bool:
        """Whether deployed `code` is this build's runtime (immutables aside: the chain's own)."""
        if len(code) != len(self.runtime):
            return False
        expected, actual = bytearray(self.runtime), bytearray(code)
        for offsets in self.immutables.values():
            for start in offsets:
                actual[start : start + 32] = expected[start : start + 32]
        return actual == expected


@dataclass(frozen=True)
class DevnetContracts:
    """The contract set a devnet installs: paywire's stand-ins and, when built, Permit2."""

    preset: tuple[PresetContract, ...] = ()
    permit2: Permit2Build | None = None

    @property
    def addresses(self) -> frozenset[str]:
        """Every address this set puts code at (Permit2's when it was built)."""
        found = {c.address for c in self.preset}
        if self.permit2 is not None:
            found.add(PERMIT2_ADDRESS)
        return frozenset(found)

    def unavailable_schemes(self) -> list[str]:
        """The schemes that cannot settle on a devnet with only this set."""
        return [scheme for scheme, needs in _SCHEME_NEEDS.items() if not set(needs) <= self.addresses]

    def preset_code(self) -> dict[str, bytes]:
        """address -> runtime code, for genesis state or anvil_setCode."""
        return {c.address: c.code for c in self.preset}

    def check_installed(self, code_at: Callable[[str], bytes], *, skip: frozenset[str] = frozenset()) -> None:
        """Raise DevnetContractError unless each address holds its artifact's code.

        `skip`: addresses the caller deliberately filled with other code (a test's genesis).
        """
        for contract in self.preset:
            if contract.address not in skip and code_at(contract.address) != contract.code:
                raise DevnetContractError(
                    f"{contract.name} at {contract.address} is not the code of {X402_ARTIFACT.name}"
                )
        if self.permit2 is not None and PERMIT2_ADDRESS not in skip:
            if not self.permit2.matches(code_at(PERMIT2_ADDRESS)):
                raise DevnetContractError(
                    f"Permit2 at {PERMIT2_ADDRESS} is not the code of {PERMIT2_ARTIFACT.name}: "
                    f"rebuild it with {BUILD_PERMIT2}"
                )


@functools.cache
def devnet_contracts() -> DevnetContracts:
    """The set read from the artifacts present (once per process, which says what is missing)."""
    problems = []
    preset: tuple[PresetContract, ...] = ()
    if X402_ARTIFACT.is_file():
        preset = _load_preset(X402_ARTIFACT)
    else:
        problems.append(
            f"{X402_ARTIFACT.name} (paywire's x402 contracts) is missing: rebuild it with "
            "`.venv/bin/python payments/devnet/contracts/build.py`"
        )
    permit2 = _load_permit2(PERMIT2_ARTIFACT) if PERMIT2_ARTIFACT.is_file() else None
    if permit2 is None:
        problems.append(f"Permit2 is not built: build it with {BUILD_PERMIT2}")
    contracts = DevnetContracts(preset=preset, permit2=permit2)
    if problems:
        log.warning(
            "devnet: %s. It runs anyway; these schemes cannot settle on it: %s",
            "; ".join(problems),
            ", ".join(contracts.unavailable_schemes()),
        )
    return contracts


def _load_preset(path: Path) -> tuple[PresetContract, ...]:
    artifact = json.loads(path.read_text())
    preset = tuple(
        PresetContract(
            name=name,
            address=to_checksum_address(entry["address"]),
            abi=entry["abi"],
            code=_hex_bytes(entry["deployedBytecode"]),
        )
        for name, entry in sorted(artifact["contracts"].items())
    )
    for contract in preset:
        if contract.address not in CANONICAL_ADDRESSES - {PERMIT2_ADDRESS}:
            raise DevnetContractError(
                f"{path.name}: {contract.name}'s address {contract.address} is not one the x402 "
                "SDK calls (x402.mechanisms.evm constants)"
            )
    return preset


def _load_permit2(path: Path) -> Permit2Build:
    artifact = json.loads(path.read_text())
    build = Permit2Build(
        abi=artifact["abi"],
        init_code=_hex_bytes(artifact["bytecode"]),
        runtime=_hex_bytes(artifact["deployedBytecode"]),
        immutables={name: tuple(offsets) for name, offsets in artifact["immutables"].items()},
    )
    check_permit2_init_code(build.init_code)  # built on the user's machine: never trust it blindly
    return build


def _hex_bytes(value: str) -> bytes:
    return bytes.fromhex(value.removeprefix("0x"))
