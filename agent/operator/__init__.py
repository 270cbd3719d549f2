"""The operator API and page under /admin."""
