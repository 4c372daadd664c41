"""norm ops (to be filled)."""
