"""X402Contracts.json, paywire's own x402 contracts for the devnets (payments/devnet/contracts/build.py).

The rebuild itself (`build.py --check`, both artifacts) runs in
tests/test_devnet_evm.py::test_artifact_is_built_from_the_committed_source.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from x402.mechanisms.evm import constants as evm
from x402.mechanisms.evm.batch_settlement import abi as batch_abi
from x402.mechanisms.evm.batch_settlement import constants as batch

from payments.devnet.contracts import build
from tests.support.x402_devnet import x402_artifact

# The SDK's addresses, by our contract name: where it sends its calls.
SDK_ADDRESSES = {
    "X402ExactPermit2Proxy": evm.X402_EXACT_PERMIT2_PROXY_ADDRESS,
    "X402UptoPermit2Proxy": evm.X402_UPTO_PERMIT2_PROXY_ADDRESS,
    "Multicall3": evm.MULTICALL3_ADDRESS,
    "X402BatchSettlement": batch.BATCH_SETTLEMENT_ADDRESS,
    "X402Erc3009DepositCollector": batch.ERC3009_DEPOSIT_COLLECTOR_ADDRESS,
    "X402Permit2DepositCollector": batch.PERMIT2_DEPOSIT_COLLECTOR_ADDRESS,
}
# The SDK's ABIs, by our contract name: what it encodes its calls and decodes answers with.
SDK_ABIS: dict[str, list[dict[str, Any]]] = {
    "X402ExactPermit2Proxy": evm.X402_EXACT_PERMIT2_PROXY_ABI
    + evm.X402_EXACT_PERMIT2_PROXY_SETTLE_WITH_PERMIT_ABI,
    "X402UptoPermit2Proxy": evm.X402_UPTO_PERMIT2_PROXY_ABI
    + evm.X402_UPTO_PERMIT2_PROXY_SETTLE_WITH_PERMIT_ABI,
    "Multicall3": evm.MULTICALL3_TRY_AGGREGATE_ABI,
    "X402BatchSettlement": batch_abi.BATCH_SETTLEMENT_ABI,
}


def _type(param: dict[str, Any]) -> str:
    """A parameter's canonical ABI type, tuples spelled out."""
    kind = param["type"]
    if kind.startswith("tuple"):
        return "(" + ",".join(_type(c) for c in param["components"]) + ")" + kind[len("tuple") :]
    return kind


def _signatures(abi: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """Each `kind` entry (function, event) by its signature -> what else a caller relies on."""
    found = {}
    for item in abi:
        if item["type"] != kind:
            continue
        signature = f"{item['name']}({','.join(_type(i) for i in item['inputs'])})"
        if kind == "function":
            found[signature] = [_type(o) for o in item.get("outputs", [])]
        else:
            found[signature] = [i.get("indexed", False) for i in item["inputs"]]
    return found


def test_every_contract_sits_where_the_sdk_calls_it() -> None:
    contracts = x402_artifact()["contracts"]
    assert {name: entry["address"] for name, entry in contracts.items()} == {
        name: SDK_ADDRESSES[name] for name in contracts
    }
    assert {placed.name for placed in build.X402_CONTRACTS} == set(contracts)


@pytest.mark.parametrize("name", list(SDK_ABIS))
def test_each_contract_offers_the_sdks_abi(name: str) -> None:
    """Every function the SDK calls, with the same inputs and outputs; every event it decodes."""
    ours = x402_artifact()["contracts"][name]["abi"]
    for kind in ("function", "event"):
        sdk = _signatures(SDK_ABIS[name], kind)
        assert {sig: _signatures(ours, kind).get(sig) for sig in sdk} == sdk


def test_artifact_is_built_from_the_committed_sources() -> None:
    artifact = x402_artifact()
    assert artifact["compiler"]["version"].startswith("0.8.37+")
    assert artifact["compiler"]["settings"]["evmVersion"] == "cancun"
    sources = {
        name: hashlib.sha256((build.HERE / name).read_bytes()).hexdigest() for name in artifact["sources"]
    }
    assert artifact["sources"] == sources
    for entry in artifact["contracts"].values():
        assert entry["sourceSha256"] == sources[entry["source"]]
        # Installed as runtime code: nothing may depend on a constructor having run.
        assert not any(item["type"] == "constructor" for item in entry["abi"])
        assert entry["deployedBytecode"].startswith("0x") and len(entry["deployedBytecode"]) > 2
