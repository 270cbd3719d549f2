"""Build Permit2 for the devnets from the npm package `@uniswap/v4-periphery` (pinned in package.json).

    python -m payments.devnet.contracts.build_permit2   # writes contracts/build/Permit2.json

Permit2 is not published on npm or PyPI by itself; v4-periphery ships its sources (MIT) with the
solmate files they import (AGPL-3.0-only). The compiled code therefore contains AGPL code, so
paywire does not ship it: this script builds it on the user's machine (`make serve` and the test
setup run it when the file is missing) into a gitignored file.

Settings are Permit2's own foundry.toml (solc 0.8.17 through the npm alias `solc-0.8.17`, via-IR,
1,000,000 optimizer runs, no metadata hash, the compiler's default EVM version). The build fails
unless the init code is the published one (hash and CREATE2 address: x402_contracts), so what
the devnets deploy is byte for byte the Permit2 of every real network.
"""

from __future__ import annotations

import json
import posixpath
import re
import sys
from pathlib import Path
from typing import Any

from payments.devnet.contracts.solcjs import compile_standard_json
from payments.devnet.x402_contracts import (
    PERMIT2_ARTIFACT,
    PERMIT2_INIT_CODE_HASH,
    PERMIT2_SALT,
    DevnetContractError,
    check_permit2_init_code,
)

REPO = Path(__file__).resolve().parents[3]
PACKAGE = REPO / "node_modules" / "@uniswap" / "v4-periphery"
PERMIT2_ROOT = PACKAGE / "lib" / "permit2"
SOLC = REPO / "node_modules" / "solc-0.8.17"
ENTRY = "src/Permit2.sol"
CONTRACT = "Permit2"
# foundry.toml's `solmate/=lib/solmate/` (source names keep the import's spelling).
REMAPPINGS = {"solmate/": "lib/solmate/"}

SETTINGS: dict[str, Any] = {
    "optimizer": {"enabled": True, "runs": 1_000_000},
    "viaIR": True,
    "metadata": {"bytecodeHash": "none"},
    "outputSelection": {
        ENTRY: {
            CONTRACT: [
                "abi",
                "evm.bytecode.object",
                "evm.deployedBytecode.object",
                "evm.deployedBytecode.immutableReferences",
            ]
        },
        # The ASTs name the immutables (the references above give only their AST ids).
        "*": {"": ["ast"]},
    },
}

_IMPORT = re.compile(r'\bimport\s+(?:[^;"]*?\bfrom\s+)?"([^"]+)"')


def collect_sources(root: Path = PERMIT2_ROOT) -> dict[str, dict[str, str]]:
    """Permit2's entry file and everything it imports, by source name (standard JSON `sources`)."""
    sources: dict[str, dict[str, str]] = {}
    pending = [ENTRY]
    while pending:
        name = pending.pop()
        if name in sources:
            continue
        content = _source_path(root, name).read_text()
        sources[name] = {"content": content}
        for imported in _IMPORT.findall(content):
            if imported.startswith("."):
                imported = posixpath.normpath(posixpath.join(posixpath.dirname(name), imported))
            pending.append(imported)
    return dict(sorted(sources.items()))


def _source_path(root: Path, name: str) -> Path:
    for prefix, target in REMAPPINGS.items():
        if name.startswith(prefix):
            return root / target / name.removeprefix(prefix)
    return root / name


def compile_permit2() -> dict[str, Any]:
    """Compile Permit2 and return its artifact (raises SystemExit on any problem)."""
    if not PERMIT2_ROOT.is_dir():
        raise SystemExit(f"{PERMIT2_ROOT} not found: run `npm ci` in {REPO}")
    std_input = {"language": "Solidity", "sources": collect_sources(), "settings": SETTINGS}
    version, output = compile_standard_json(SOLC, std_input)
    contract = output["contracts"][ENTRY][CONTRACT]
    init_code = bytes.fromhex(contract["evm"]["bytecode"]["object"])
    check_permit2_init_code(init_code)
    references = contract["evm"]["deployedBytecode"]["immutableReferences"]
    return {
        "contractName": CONTRACT,
        "package": f"@uniswap/v4-periphery@{json.loads((PACKAGE / 'package.json').read_text())['version']}",
        "sources": list(std_input["sources"]),
        "compiler": {"name": "solcjs", "version": version, "settings": SETTINGS},
        "salt": "0x" + PERMIT2_SALT.hex(),
        "initCodeHash": "0x" + PERMIT2_INIT_CODE_HASH.hex(),
        "abi": contract["abi"],
        "bytecode": "0x" + init_code.hex(),
        "deployedBytecode": "0x" + contract["evm"]["deployedBytecode"]["object"],
        "immutables": _immutable_offsets(references, output["sources"]),
    }


def _immutable_offsets(
    references: dict[str, list[dict[str, int]]], sources: dict[str, Any]
) -> dict[str, list[int]]:
    """Immutable name -> byte offsets of its 32-byte slots in the runtime code."""
    names = {str(node["id"]): node["name"] for node in _immutable_declarations(sources)}
    offsets: dict[str, list[int]] = {}
    for ast_id, slots in sorted(references.items()):
        if any(slot["length"] != 32 for slot in slots):
            raise SystemExit(f"immutable {names.get(ast_id, ast_id)} is not a 32-byte slot")
        offsets[names[ast_id]] = sorted(slot["start"] for slot in slots)
    return offsets


def _immutable_declarations(sources: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    stack = [source["ast"] for source in sources.values()]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("nodeType") == "VariableDeclaration" and node.get("mutability") == "immutable":
                found.append(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


def main() -> int:
    try:
        artifact = compile_permit2()
    except DevnetContractError as exc:
        raise SystemExit(f"Permit2 build failed: {exc}") from exc
    PERMIT2_ARTIFACT.parent.mkdir(exist_ok=True)
    # Written whole or not at all: make rebuilds it only when it is missing.
    partial = PERMIT2_ARTIFACT.with_suffix(".json.partial")
    partial.write_text(json.dumps(artifact, indent=2) + "\n")
    partial.replace(PERMIT2_ARTIFACT)
    print(f"wrote {PERMIT2_ARTIFACT.relative_to(REPO)} (init-code hash {artifact['initCodeHash']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
