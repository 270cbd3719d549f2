"""x402 `batch-settlement` channels on paywire's ledger (issue 23 §2; the design:
docs/notes/issue-23-channels.md): `wire` (payloads, digests, corrective requirement, receipts),
`requirements` (the hookless SDK server scheme, minDeposit), `store` (the channel rows and the
reserve / commit / release writes). Imports no agent code."""
