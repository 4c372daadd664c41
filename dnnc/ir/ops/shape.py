"""shape ops (to be filled)."""
