"""Copy-paste snippets for one catalogue entry: curl for the 402, `paywire pay`, Python, MCP.

Built here, in Python, so quoting is done by the standard library and never by hand: shell words
by `shlex.quote`, JSON by `json.dumps`, Python literals by `pprint` (repr). A description or an
example written by a skill author (quotes, `$(...)`, backticks, newlines) stays one inert word.
The catalogue page only puts these strings into the DOM as text.

What a payer needs differs by gateway (`Site`): a devnet gateway has a demo payer (its keys in
its data folder) and serves its Solana node at `/devnet/solana`; on a production gateway the
payer brings a key (PAYWIRE_PAYER_KEY) and builds Solana payments on their own node
(PAYWIRE_SOLANA_RPC_URL).
"""

from __future__ import annotations

import json
import posixpath
import pprint
import shlex
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from x402.mechanisms.svm.constants import NETWORK_CONFIGS as SOLANA_NETWORKS

PAY_DEFAULT_MAX_USD = Decimal("0.10")  # `paywire pay --max` default: above it the snippet says --max
# A model operation's body sent as multipart (a file upload): field holding the file.
FORM_FILE_FIELDS = {"audio.transcriptions": "file", "audio.translations": "file", "images.edits": "image"}
_SAMPLE_FILES = {"file": "speech.wav", "image": "photo.png"}


def operation_path(operation: str) -> str:
    """`chat.completions` -> `/v1/chat/completions`: the OpenAI route of a model operation."""
    return "/v1/" + operation.replace(".", "/")


def model_example(model_id: str, operation: str, example: dict[str, Any] | None = None) -> dict[str, Any]:
    """A valid request body for `operation` on `model_id` (tests validate each against every model)."""
    if operation in ("chat.completions", "edits"):
        if example and isinstance(example.get("messages"), list):
            return {**example, "model": model_id}
        return {"model": model_id, "messages": [{"role": "user", "content": "Say hello in five words."}],
                "max_tokens": 64}
    bodies: dict[str, dict[str, Any]] = {
        "completions": {"prompt": "Say hello in five words.", "max_tokens": 64},
        "embeddings": {"input": "The soup was excellent."},
        "audio.speech": {"input": "Hello from paywire.", "voice": "alloy"},
        "audio.generations": {"prompt": "rain on a tin roof", "duration_seconds": 5},
        "images.generations": {"prompt": "a lighthouse at dawn, watercolor", "n": 1},
        "images.edits": {"prompt": "add a red scarf"},
        "audio.transcriptions": {},
        "audio.translations": {},
    }
    return {"model": model_id, **bodies.get(operation, {})}


def json_text(body: Any) -> str:
    """One line of JSON, as sent (non-ASCII kept: shells and terminals take UTF-8)."""
    return json.dumps(body, ensure_ascii=False)


def _python_literal(body: Any) -> str:
    return pprint.pformat(body, width=96, sort_dicts=False)


@dataclass(frozen=True)
class Site:
    """What a payer's snippets need to know of the gateway besides its URL."""

    # a devnet gateway: its data folder, where `paywire serve` wrote the demo payer's keys (the
    # snippets pay with them); None: a production gateway (the payer's own key)
    devnet_dir: str | None = None
    # the Solana network a payment may use (CAIP-2), if any: its public JSON-RPC is where a
    # production payer's own node goes
    solana_network: str | None = None

    @property
    def devnet(self) -> bool:
        return self.devnet_dir is not None

    def solana_rpc_example(self) -> str | None:
        """The public JSON-RPC of the Solana network paid on (the x402 SDK's default for it), for
        a production payer to replace with their own node; None: no Solana, or the devnet."""
        if self.devnet or self.solana_network is None:
            return None
        found = SOLANA_NETWORKS.get(self.solana_network)
        return found["rpc_url"] if found else None


@dataclass(frozen=True)
class Entry:
    """What the snippets need of one catalogue entry."""

    base_url: str  # the gateway's public base URL (what its quotes name)
    path: str  # the route, e.g. /v1/marketplace/api/token-count-508 or /v1/chat/completions
    body: dict[str, Any]  # the example request body
    kind: str  # "resource" or "model"
    operation: str | None = None  # a model's operation (None for resources)
    most_usd: Decimal | None = None  # a fixed price, when there is one (for --max)
    site: Site = field(default_factory=Site)  # (default: a production gateway)

    @property
    def url(self) -> str:
        return self.base_url + self.path

    @property
    def form_field(self) -> str | None:
        return FORM_FILE_FIELDS.get(self.operation or "")


def curl_snippet(entry: Entry) -> str:
    """An unpaid call: the gateway answers HTTP 402 with the quote (the PAYMENT-REQUIRED header)."""
    url = shlex.quote(entry.url)
    if entry.form_field:
        sample = _SAMPLE_FILES[entry.form_field]
        fields = [f"{k}={v}" for k, v in entry.body.items() if isinstance(v, str)]
        words = " ".join(f"-F {shlex.quote(f)}" for f in fields)
        return f"curl -i -X POST {url} {words} -F {shlex.quote(f'{entry.form_field}=@{sample}')}"
    if entry.kind == "resource":  # the probe indexers send: no input, the resource's price
        return f"curl -i -X POST {url} -d '{{}}'"
    return (f"curl -i -X POST {url} -H 'Content-Type: application/json' "
            f"-d {shlex.quote(json_text(entry.body))}")


def pay_snippet(entry: Entry) -> str | None:
    """`paywire pay`: quote, check against --max, sign, call again, print the receipt. None for
    multipart routes (it sends JSON bodies only)."""
    if entry.form_field:
        return None
    text = f"paywire pay {shlex.quote(entry.url)} --data {shlex.quote(json_text(entry.body))}"
    if entry.most_usd is not None and entry.most_usd > PAY_DEFAULT_MAX_USD:
        text += f" --max {format(entry.most_usd.normalize(), 'f')}"
    return text


# Who pays, and where a Solana payment is built (recent blockhash, the token's mint).
_DEVNET_PAYER = '''\
# Default: the devnet demo payer `paywire serve` wrote (its EVM key).
KEY = os.environ.get("PAYWIRE_PAYER_KEY") or json.loads(
    Path({keys}).read_text())["evm_payer"]
SOLANA_RPC = os.environ.get("PAYWIRE_SOLANA_RPC_URL", f"{{GATEWAY}}/devnet/solana")
'''
_PAYER_KEY = '''\
KEY = os.environ["PAYWIRE_PAYER_KEY"]
# A Solana payment is built on your own Solana node: its JSON-RPC URL in PAYWIRE_SOLANA_RPC_URL
# (unset: the x402 SDK uses the network's public endpoint, which is rate-limited).
SOLANA_RPC = os.environ.get("PAYWIRE_SOLANA_RPC_URL") or None
'''


def _payer_lines(site: Site) -> str:
    if site.devnet_dir is None:
        return _PAYER_KEY
    keys = json.dumps(posixpath.join(site.devnet_dir, "devnet-keys.json"))
    return _DEVNET_PAYER.format(keys=keys)


_PAYER = '''\
import asyncio
import base64
import json
import os
from pathlib import Path

import httpx
from eth_account import Account
{extra_import}from x402 import x402Client
from x402.http.clients.httpx import x402AsyncTransport
from x402.mechanisms.evm.exact import register_exact_evm_client
from x402.mechanisms.evm.signers import EthAccountSigner
from x402.mechanisms.svm.exact import register_exact_svm_client
from x402.mechanisms.svm.signers import KeypairSigner

GATEWAY = os.environ.get("PAYWIRE_URL", {base})
# The payer: an EVM private key (0x...) pays on Base, a Solana base58 secret key on Solana.
{payer}{constants}

async def main() -> None:
    payer = x402Client()  # refuses to pay more than $1 a call unless told otherwise
    if KEY.startswith("0x"):
        register_exact_evm_client(payer, EthAccountSigner(Account.from_key(KEY)))
    else:
        register_exact_svm_client(payer, KeypairSigner.from_base58(KEY), rpc_url=SOLANA_RPC)
    async with httpx.AsyncClient(transport=x402AsyncTransport(payer), timeout=120) as http:
{call}
        paid = response.headers.get("PAYMENT-RESPONSE")
        if paid:
            receipt = json.loads(base64.b64decode(paid))
            print(f"paid on {{receipt['network']}}: transaction {{receipt['transaction']}}")


asyncio.run(main())
'''

# model operation -> the openai client call (raw response: the receipt is a header) and what it prints
_OPENAI_CALLS = {
    "chat.completions": ("client.chat.completions.with_raw_response.create(**BODY)",
                         "print(response.parse().choices[0].message.content)"),
    "completions": ("client.completions.with_raw_response.create(**BODY)",
                    "print(response.parse().choices[0].text)"),
    "embeddings": ("client.embeddings.with_raw_response.create(**BODY)",
                   "print(len(response.parse().data[0].embedding), 'dimensions')"),
    "audio.speech": ("client.audio.speech.with_raw_response.create(**BODY)",
                     "Path('speech.mp3').write_bytes(response.content)"),
    "images.generations": ("client.images.with_raw_response.generate(**BODY)",
                           "print(response.parse().data[0].url or 'image received (b64_json)')"),
    "images.edits": ("client.images.with_raw_response.edit(**BODY, image=Path('photo.png'))",
                     "print(response.parse().data[0].url or 'image received (b64_json)')"),
    "audio.transcriptions": ("client.audio.transcriptions.with_raw_response.create("
                             "**BODY, file=Path('speech.wav'))", "print(response.parse().text)"),
    "audio.translations": ("client.audio.translations.with_raw_response.create("
                           "**BODY, file=Path('speech.wav'))", "print(response.parse().text)"),
}


def python_snippet(entry: Entry) -> str:
    """A Python program that pays: the openai package over an x402 transport for a model's OpenAI
    route (as in docs/models.md), else a plain x402 httpx client."""
    openai_call = _OPENAI_CALLS.get(entry.operation or "") if entry.kind == "model" else None
    indent = " " * 8
    if openai_call is not None:
        call, show = openai_call
        constants = f"BODY = {_indented(_python_literal(entry.body), 7)}\n"
        lines = [
            'client = AsyncOpenAI(base_url=f"{GATEWAY}/v1", api_key="unused", http_client=http)',
            f"response = await {call}",
            show,
        ]
        return _PAYER.format(extra_import="from openai import AsyncOpenAI\n", base=json.dumps(entry.base_url),
                             payer=_payer_lines(entry.site), constants=constants,
                             call="\n".join(indent + line for line in lines))
    constants = (f"URL = GATEWAY + {json.dumps(entry.path)}\n"
                 f"BODY = {_indented(_python_literal(entry.body), 7)}\n")
    lines = ["response = await http.post(URL, json=BODY)",
             "print(response.status_code, response.text)"]
    return _PAYER.format(extra_import="", base=json.dumps(entry.base_url), payer=_payer_lines(entry.site),
                         constants=constants, call="\n".join(indent + line for line in lines))


def _indented(text: str, columns: int) -> str:
    return text.replace("\n", "\n" + " " * columns)


def mcp_config(base_url: str) -> str:
    """An MCP client's configuration (`mcpServers`, as Claude, Cursor and others read it) for
    paywire's remote MCP server: streamable HTTP, which the client must be told (`type`)."""
    return json.dumps({"mcpServers": {"paywire": {"type": "http", "url": f"{base_url}/mcp"}}}, indent=2)


def mcp_stdio_env(site: Site) -> dict[str, str]:
    """What `paywire mcp` reads (docs/configuration.md's table, agent/mcp/proxy.py): on the devnet
    the folder of the demo payer's keys; in production the payer's key (from a file, so it stays
    out of the agent's configuration), the Solana node when Solana is paid on, and the spend caps."""
    if site.devnet_dir is not None:
        return {"PAYWIRE_DATA_DIR": site.devnet_dir}
    env = {"PAYWIRE_PAYER_KEY_FILE": "/path/to/your/payer-key"}
    rpc = site.solana_rpc_example()
    if rpc is not None:
        env["PAYWIRE_SOLANA_RPC_URL"] = rpc
    return {**env, "PAYWIRE_MCP_MAX_PER_CALL": "0.10", "PAYWIRE_MCP_MAX_PER_DAY": "1.00"}


def mcp_stdio_config(base_url: str, site: Site) -> str:
    """The same, through `paywire mcp`: a local stdio server that pays from the user's key."""
    return json.dumps({"mcpServers": {"paywire": {
        "command": "paywire", "args": ["mcp", "--server", f"{base_url}/mcp"],
        "env": mcp_stdio_env(site)}}}, indent=2)


def mcp_stdio_command(base_url: str) -> str:
    return f"paywire mcp --server {shlex.quote(base_url + '/mcp')}"


def snippets(entry: Entry) -> dict[str, str]:
    """Every snippet of one entry, by name (the page shows them in this order)."""
    out = {"curl": curl_snippet(entry)}
    pay = pay_snippet(entry)
    if pay is not None:
        out["pay"] = pay
    out["python"] = python_snippet(entry)
    out["mcp"] = mcp_config(entry.base_url)
    out["mcp_stdio"] = mcp_stdio_config(entry.base_url, entry.site)
    return out
