"""`paywire`: one module per command."""
