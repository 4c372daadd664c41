"""loss ops (to be filled)."""
