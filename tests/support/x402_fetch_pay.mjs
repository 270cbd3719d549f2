// Paid calls made by the official JavaScript x402 client, unchanged (test-time only): `@x402/fetch`
// wrapping Node's fetch, with ONE scheme client from `@x402/evm` registered, so that scheme is the
// one it pays. tests/test_x402_fetch.py runs it against a devnet gateway.
//
// Config: a JSON object read from the file named by argv[2], else from stdin (never from the
// command line itself: it holds a private key):
//   {"url": "http://127.0.0.1:8000", "path": "/v1/chat/completions", "body": {...},
//    "privateKey": "0x...", "rpcUrl": "http://127.0.0.1:8545", "scheme": "batch-settlement",
//    "network": "eip155:84532", "calls": 10}
// Output: one JSON line per call, in order: {"call", "status", "paymentResponse" (the decoded
// PAYMENT-RESPONSE header, or null), "body" (the response's text)}. A call the client could not
// pay prints {"call", "error"} and the script exits 1.
import { readFile } from "node:fs/promises";
import { toClientEvmSigner } from "@x402/evm";
import { BatchSettlementEvmScheme } from "@x402/evm/batch-settlement/client";
import { UptoEvmScheme } from "@x402/evm/upto/client";
import { decodePaymentResponseHeader, wrapFetchWithPayment, x402Client } from "@x402/fetch";
import { createPublicClient, http } from "viem";
import { privateKeyToAccount } from "viem/accounts";

const SCHEME_CLIENTS = {
  // channel state (deposit, running total) lives in the scheme's default in-memory storage, so
  // the calls of one run share a channel; with no local state it reads the channel on chain
  "batch-settlement": (signer) => new BatchSettlementEvmScheme(signer),
  upto: (signer) => new UptoEvmScheme(signer),
};

async function readConfig() {
  if (process.argv[2]) return JSON.parse(await readFile(process.argv[2], "utf8"));
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return JSON.parse(Buffer.concat(chunks).toString("utf8"));
}

function emit(line) {
  process.stdout.write(JSON.stringify(line) + "\n");
}

const config = await readConfig();
const makeScheme = SCHEME_CLIENTS[config.scheme];
if (!makeScheme) {
  process.stderr.write(`unknown scheme ${JSON.stringify(config.scheme)}: one of ` +
    `${Object.keys(SCHEME_CLIENTS).join(", ")}\n`);
  process.exit(2);
}
// the signer reads the chain (channel balances) through the devnet's JSON-RPC
const reader = createPublicClient({ transport: http(config.rpcUrl) });
const signer = toClientEvmSigner(privateKeyToAccount(config.privateKey), reader);
const client = new x402Client().register(config.network ?? "eip155:84532", makeScheme(signer));
const fetchWithPayment = wrapFetchWithPayment(fetch, client);

for (let call = 0; call < (config.calls ?? 1); call++) {
  let response;
  try {
    response = await fetchWithPayment(new URL(config.path, config.url), {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(config.body ?? {}),
    });
  } catch (error) {
    emit({ call, error: error instanceof Error ? error.message : String(error) });
    process.exit(1);
  }
  const header = response.headers.get("PAYMENT-RESPONSE");
  emit({
    call,
    status: response.status,
    paymentResponse: header ? decodePaymentResponseHeader(header) : null,
    body: await response.text(),
  });
}
