"""The devnet's HTTP routes and its own process (`paywire devnet`)."""
