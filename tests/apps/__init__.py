"""Test apps: small SaaS stand-ins the engine and primitives are tested against (not shipped in the package)."""
