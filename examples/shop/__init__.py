"""The shop example environment: a deterministic cross-border shopping world."""
