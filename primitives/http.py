"""HTTP primitives. Implemented by the HTTP-primitives work."""
