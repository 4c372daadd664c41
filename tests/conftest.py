"""Test-wide settings: every compile verifies the graph after each pass."""

import os

os.environ.setdefault("DNNC_VERIFY", "1")
