"""The A2A face: JSON-RPC at /a2a on the one pipeline."""
