"""dnnc's version: what artifacts, tuning records and the CLI report. A module of its own, below
every layer, so that any of them can read it without importing the package's API."""

__version__ = "0.1.0"
