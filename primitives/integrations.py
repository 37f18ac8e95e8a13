"""integrations primitives (being implemented)."""
