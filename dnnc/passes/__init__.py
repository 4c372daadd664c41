"""Graph passes (to come)."""
