"""Rebuild DevUSDC.json from DevUSDC.sol with solcjs (npm `solc`, pinned in package.json).

    python payments/devnet/contracts/build.py           # rewrite the artifact
    python payments/devnet/contracts/build.py --check   # exit 1 if the artifact is stale

Deterministic: fixed compiler settings, a fixed source name, no metadata hash in the bytecode
(so comment-only edits do not change the code), and stable JSON output. Run time never needs
node: paywire loads the committed artifact.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
SOURCE = HERE / "DevUSDC.sol"
ARTIFACT = HERE / "DevUSDC.json"
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

# solcjs is a JS module, not a CLI we can trust to be on PATH: drive it through node.
_NODE_DRIVER = """
const solc = require(process.argv[1]);
let input = '';
process.stdin.on('data', (d) => { input += d; });
process.stdin.on('end', () => {
  process.stdout.write(JSON.stringify({version: solc.version(), output: JSON.parse(solc.compile(input))}));
});
"""


def compile_artifact() -> dict[str, Any]:
    """Compile DevUSDC.sol and return the artifact dict (raises on any compiler error)."""
    if not SOLC.is_dir():
        raise SystemExit(f"solc not found at {SOLC}: run `npm ci` in {REPO}")
    source = SOURCE.read_text()
    std_input = {
        "language": "Solidity",
        "sources": {"DevUSDC.sol": {"content": source}},
        "settings": SETTINGS,
    }
    proc = subprocess.run(
        ["node", "-e", _NODE_DRIVER, str(SOLC)],
        input=json.dumps(std_input),
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(proc.stdout)
    output = result["output"]
    diagnostics = output.get("errors", [])
    for warning in (e for e in diagnostics if e["severity"] != "error"):
        print(warning["formattedMessage"], file=sys.stderr)
    errors = [e for e in diagnostics if e["severity"] == "error"]
    if errors:
        raise SystemExit("\n".join(e["formattedMessage"] for e in errors))
    contract = output["contracts"]["DevUSDC.sol"][CONTRACT]
    slots = {s["label"]: int(s["slot"]) for s in contract["storageLayout"]["storage"]}
    if slots.get("minter") != MINTER_SLOT:
        raise SystemExit(f"minter must live in slot {MINTER_SLOT}, layout is {slots}")
    return {
        "contractName": CONTRACT,
        "sourceName": "DevUSDC.sol",
        "sourceSha256": hashlib.sha256(source.encode()).hexdigest(),
        "compiler": {"name": "solcjs", "version": result["version"], "settings": SETTINGS},
        "minterSlot": MINTER_SLOT,
        "storageLayout": slots,
        "abi": contract["abi"],
        "bytecode": "0x" + contract["evm"]["bytecode"]["object"],
        "deployedBytecode": "0x" + contract["evm"]["deployedBytecode"]["object"],
    }


def render(artifact: dict[str, Any]) -> str:
    return json.dumps(artifact, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if DevUSDC.json is stale")
    args = parser.parse_args(argv)
    text = render(compile_artifact())
    if args.check:
        if not ARTIFACT.exists() or ARTIFACT.read_text() != text:
            print(f"{ARTIFACT.name} is stale: run {Path(__file__).name}", file=sys.stderr)
            return 1
        print(f"{ARTIFACT.name} is up to date")
        return 0
    ARTIFACT.write_text(text)
    print(f"wrote {ARTIFACT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
