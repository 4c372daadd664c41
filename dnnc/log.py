"""dnnc's messages: one `logging` logger, "dnnc", which every module logs to through a child of
its own (`logging.getLogger(__name__)`: "dnnc.backends.executable", "dnnc.passes.manager",
...), so an application filters or redirects them as it does any library's.

Levels: INFO for progress (a compile's stages, each segment compiled), logged only when the
caller asked for progress (`progress=True`, or by default when stderr is a terminal); DEBUG
for details (each pass's milliseconds and node count; `dnnc -v`); WARNING and above for what a
user should act on.

The "dnnc" logger writes its records to stderr as `dnnc: message` (the form every line of the
`dnnc` command has) through `HANDLER`, at INFO, and does not propagate them: a compile asked
for progress shows it whether or not the application configured logging. To take them over:

    logger = logging.getLogger("dnnc")
    logger.setLevel(logging.WARNING)      # progress off, warnings still shown
    logger.removeHandler(dnnc.log.HANDLER); logger.propagate = True   # to your own handlers

The `dnnc` command sets the level from `-q` (WARNING) and `-v` (DEBUG). This module only
configures the "dnnc" logger; it never touches the root logger or another library's.
"""

from __future__ import annotations

import logging
import sys

LOGGER = logging.getLogger("dnnc")


class _Stderr(logging.Handler):
    """Writes to the `sys.stderr` of the moment (a test's capture, a redirected stream), not
    the one of import time as `logging.StreamHandler` would, through `tqdm.write`: a progress
    bar being drawn there (`dnnc/progress.py`) is lifted off its line first and drawn again
    after, so the message gets a line of its own."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        try:
            tqdm.write(self.format(record), file=sys.stderr)
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


HANDLER = _Stderr()
HANDLER.setFormatter(logging.Formatter("dnnc: %(message)s"))


def _configure() -> None:
    if HANDLER not in LOGGER.handlers:
        LOGGER.addHandler(HANDLER)
    if LOGGER.level == logging.NOTSET:
        LOGGER.setLevel(logging.INFO)
    LOGGER.propagate = False


def set_verbosity(quiet: bool = False, verbose: bool = False) -> None:
    """The `dnnc` command's -q (warnings and errors only) and -v (debug details too)."""
    LOGGER.setLevel(logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO)


_configure()
