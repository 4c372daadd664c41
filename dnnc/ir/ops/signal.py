"""signal ops (to be filled)."""
