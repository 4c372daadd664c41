"""image ops (to be filled)."""
