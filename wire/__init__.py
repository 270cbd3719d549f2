"""What every layer shares about the wire: JSON read and written with bounded nesting and number
length (orjson; the stdlib where they differ). Below skills and payments, which both use it."""
