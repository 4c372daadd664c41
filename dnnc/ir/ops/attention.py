"""attention ops (to be filled)."""
