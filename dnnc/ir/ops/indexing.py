"""indexing ops (to be filled)."""
