"""Alembic's migrations of the ledger's tables (`payments/schema.py` runs them; see env.py)."""
