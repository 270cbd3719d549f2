"""Rebuild the devnet's contract artifacts with solcjs (npm `solc`, pinned in package.json).

    python payments/devnet/contracts/build.py           # rewrite the artifacts
    python payments/devnet/contracts/build.py --check   # exit 1 if an artifact is stale

Two artifacts, each from its own compiler run so one never changes the other's bytecode:
- DevUSDC.json: the devnet's USDC (creation and runtime code, ABI, storage layout).
- X402Contracts.json: paywire's own x402 contracts and Multicall3, each with its canonical
  address and runtime code. They have no immutables and no constructor, so a chain installs the
  runtime code at that address as is (genesis state, anvil_setCode); the build refuses any that
  would need a constructor to run.

Deterministic: fixed compiler settings, fixed source names, no metadata hash in the bytecode
(so comment-only edits do not change the code), and stable JSON output. Run time never needs
node: paywire loads the committed artifacts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from payments.devnet.contracts.solcjs import compile_standard_json

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
SOURCE = HERE / "DevUSDC.sol"
ARTIFACT = HERE / "DevUSDC.json"
X402_ARTIFACT = HERE / "X402Contracts.json"
SOLC = REPO / "node_modules" / "solc"
CONTRACT = "DevUSDC"
# paywire's devnet writes the minter straight into this slot (genesis / anvil_setStorageAt).
MINTER_SLOT = 0

SETTINGS: dict[str, Any] = {
    "optimizer": {"enabled": True, "runs": 200},
    # Cancun runs on Base, py-evm (eth-tester) and anvil alike.
    "evmVersion": "cancun",
    "metadata": {"bytecodeHash": "none"},
    "outputSelection": {
        "*": {"*": ["abi", "evm.bytecode.object", "evm.deployedBytecode.object", "storageLayout"]}
    },
}
# The x402 contracts' run also reports immutables, which it must find none of.
X402_SETTINGS: dict[str, Any] = {
    **SETTINGS,
    "outputSelection": {
        "*": {"*": ["abi", "evm.deployedBytecode.object", "evm.deployedBytecode.immutableReferences"]}
    },
}


@dataclass(frozen=True)
class Placed:
    """A contract whose runtime code the devnets install at a fixed address."""

    name: str
    source: str
    address: str


# The addresses the x402 SDK calls (x402.mechanisms.evm constants); the same on every chain.
X402_CONTRACTS: tuple[Placed, ...] = tuple(
    Placed(name, f"{name}.sol", address)
    for name, address in (
        ("X402ExactPermit2Proxy", "0x402085c248EeA27D92E8b30b2C58ed07f9E20001"),
        ("X402UptoPermit2Proxy", "0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002"),
        ("Multicall3", "0xcA11bde05977b3631167028862bE2a173976CA11"),
        ("X402BatchSettlement", "0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003"),
        ("X402Erc3009DepositCollector", "0x4020806089470a89826cB9fB1f4059150b550004"),
        ("X402Permit2DepositCollector", "0x4020425FAf3B746C082C2f942b4E5159887B0005"),
    )
)

# `import "./X.sol";` and `import {A, B} from "./X.sol";`: the only form our sources use.
_IMPORT = re.compile(r"""^\s*import\s+(?:[^;]*?\bfrom\s+)?["']\./([\w.]+\.sol)["']\s*;""", re.MULTILINE)


def _with_imports(entries: list[str]) -> dict[str, str]:
    """File name -> source text of `entries` and everything they import, in a fixed order."""
    sources: dict[str, str] = {}
    pending = list(entries)
    while pending:
        name = pending.pop(0)
        if name in sources:
            continue
        sources[name] = (HERE / name).read_text()
        pending.extend(_IMPORT.findall(sources[name]))
    return dict(sorted(sources.items()))


def _compile(entries: list[str], settings: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Compile `entries` (and their imports); (compiler version, solc's output). Raises on errors."""
    std_input = {
        "language": "Solidity",
        "sources": {name: {"content": text} for name, text in _with_imports(entries).items()},
        "settings": settings,
    }
    return compile_standard_json(SOLC, std_input)


def _sha256(source_name: str) -> str:
    return hashlib.sha256((HERE / source_name).read_bytes()).hexdigest()


def compile_artifact() -> dict[str, Any]:
    """Compile DevUSDC.sol and return the artifact dict (raises on any compiler error)."""
    version, output = _compile([SOURCE.name], SETTINGS)
    contract = output["contracts"][SOURCE.name][CONTRACT]
    slots = {s["label"]: int(s["slot"]) for s in contract["storageLayout"]["storage"]}
    if slots.get("minter") != MINTER_SLOT:
        raise SystemExit(f"minter must live in slot {MINTER_SLOT}, layout is {slots}")
    return {
        "contractName": CONTRACT,
        "sourceName": SOURCE.name,
        "sourceSha256": _sha256(SOURCE.name),
        "compiler": {"name": "solcjs", "version": version, "settings": SETTINGS},
        "minterSlot": MINTER_SLOT,
        "storageLayout": slots,
        "abi": contract["abi"],
        "bytecode": "0x" + contract["evm"]["bytecode"]["object"],
        "deployedBytecode": "0x" + contract["evm"]["deployedBytecode"]["object"],
    }


def compile_x402_artifact() -> dict[str, Any]:
    """Compile the x402 contracts; name -> address, source, ABI and runtime code."""
    entries = [placed.source for placed in X402_CONTRACTS]
    version, output = _compile(entries, X402_SETTINGS)
    contracts: dict[str, Any] = {}
    for placed in X402_CONTRACTS:
        _require_checksummed(placed.address)
        compiled = output["contracts"][placed.source][placed.name]
        _require_placeable(placed, compiled)
        contracts[placed.name] = {
            "address": placed.address,
            "source": placed.source,
            "sourceSha256": _sha256(placed.source),
            "abi": compiled["abi"],
            "deployedBytecode": "0x" + compiled["evm"]["deployedBytecode"]["object"],
        }
    return {
        "compiler": {"name": "solcjs", "version": version, "settings": X402_SETTINGS},
        # Every file of the run (imports included): a stale artifact shows without node.
        "sources": {name: _sha256(name) for name in _with_imports(entries)},
        "contracts": contracts,
    }


def _require_checksummed(address: str) -> None:
    from eth_utils import to_checksum_address  # the venv's; only the build needs it

    if to_checksum_address(address) != address:
        raise SystemExit(f"{address} is not checksummed: write {to_checksum_address(address)}")


def _require_placeable(placed: Placed, compiled: dict[str, Any]) -> None:
    """Runtime code alone must make a working contract: nothing a constructor would set up."""
    if compiled["evm"]["deployedBytecode"].get("immutableReferences"):
        raise SystemExit(f"{placed.name} has immutables: use constants (its code is set, not deployed)")
    if any(item["type"] == "constructor" for item in compiled["abi"]):
        raise SystemExit(f"{placed.name} has a constructor: its code is set at {placed.address}, never run")


def render(artifact: dict[str, Any]) -> str:
    return json.dumps(artifact, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if an artifact is stale")
    args = parser.parse_args(argv)
    built = {
        ARTIFACT: render(compile_artifact()),
        X402_ARTIFACT: render(compile_x402_artifact()),
    }
    if args.check:
        stale = [path.name for path, text in built.items() if not path.exists() or path.read_text() != text]
        for name in stale:
            print(f"{name} is stale: run {Path(__file__).name}", file=sys.stderr)
        if not stale:
            print(", ".join(path.name for path in built) + " are up to date")
        return 1 if stale else 0
    for path, text in built.items():
        path.write_text(text)
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
