"""linalg ops (to be filled)."""
