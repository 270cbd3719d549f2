"""Metrics, the call observer, request ids and log lines."""
