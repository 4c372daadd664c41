"""quant ops (to be filled)."""
