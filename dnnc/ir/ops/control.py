"""control ops (to be filled)."""
