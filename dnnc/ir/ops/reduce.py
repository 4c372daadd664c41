"""reduce ops (to be filled)."""
