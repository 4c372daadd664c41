"""Autotuning (to come)."""
