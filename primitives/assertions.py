"""Assertion primitives. Implemented by the HTTP-primitives work."""
