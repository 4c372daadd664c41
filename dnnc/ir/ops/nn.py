"""nn ops (to be filled)."""
