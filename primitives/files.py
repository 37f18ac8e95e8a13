"""File primitives P01-P03 (workspace files). Implemented by the file-primitives work."""
