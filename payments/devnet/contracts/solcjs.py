"""Run a solcjs compiler (an npm `solc` package) on standard JSON input, through node.

solcjs is a JS module, not a CLI we can trust to be on PATH: node loads the package named by its
folder, so several pinned compilers live side by side (`solc`, `solc-0.8.17`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

_NODE_DRIVER = """
const solc = require(process.argv[1]);
let input = '';
process.stdin.on('data', (d) => { input += d; });
process.stdin.on('end', () => {
  process.stdout.write(JSON.stringify({version: solc.version(), output: JSON.parse(solc.compile(input))}));
});
"""


def compile_standard_json(solc: Path, std_input: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(compiler version, solc's output) for `std_input`; warnings to stderr, errors raise SystemExit."""
    if not solc.is_dir():
        raise SystemExit(f"solc not found at {solc}: run `npm ci` in the paywire checkout")
    proc = subprocess.run(
        ["node", "-e", _NODE_DRIVER, str(solc)],
        input=json.dumps(std_input),
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(proc.stdout)
    diagnostics = result["output"].get("errors", [])
    for warning in (e for e in diagnostics if e["severity"] != "error"):
        print(warning["formattedMessage"], file=sys.stderr)
    errors = [e["formattedMessage"] for e in diagnostics if e["severity"] == "error"]
    if errors:
        raise SystemExit("\n".join(errors))
    return result["version"], result["output"]
