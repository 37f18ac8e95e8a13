"""Drivers the primitives talk through (HTTP, auth, databases, browser, receivers, LLM judge, limits); no DAG knowledge."""
