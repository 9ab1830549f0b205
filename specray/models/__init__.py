"""Models: loading by zoo entry, HF name or path, and the tiny zoo built locally."""
