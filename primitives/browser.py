"""browser primitives (being implemented)."""
