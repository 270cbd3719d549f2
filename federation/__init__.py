"""Federation: the marketplace resells other x402 sellers' resources (issue 24). Sources are
imported into the ledger, priced with the operator's margin, sold as skills, and each call pays
its upstream from the operator's wallet exactly once (docs/federation.md)."""
