"""MCP: the face at /mcp (server) and `paywire mcp` (a paying stdio client)."""
