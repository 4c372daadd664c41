"""How a `dnnc` command ends: the exit statuses, the one line a failure prints, and Ctrl-C.

`main` maps outcomes to exit statuses through one table (`EXIT_STATUS`, docs/cli.md "Exit
codes"): 0 ok, 1 a finding (`compare`: a divergence), 2 bad usage or input, 3 dnnc failed on
valid input (an internal error: a bug to report), 130 interrupted. This module never parses
options or runs a command; a command reports a mistake by raising `UsageError` (or any
exception the table names) and never exits the process itself.
"""

from __future__ import annotations

import os
import threading

from ...errors import CompileError, DNNCError


class UsageError(Exception):
    """A bad option value the CLI itself found; printed as one line."""


EXIT_OK, EXIT_FINDING, EXIT_USAGE, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130

EXIT_STATUS = [
    (UsageError, EXIT_USAGE, "error"),
    (CompileError, EXIT_FAILED, "error"),   # a stage of dnnc failed on input it accepted
    (DNNCError, EXIT_USAGE, "error"),       # a bad or unsupported model, input or argument
    (OSError, EXIT_USAGE, "error"),         # a path that cannot be read or written
    (Exception, EXIT_FAILED, "internal error"),
]
"""What each failure exits with and how its line starts; the first row whose type matches."""


def one_line(exc: BaseException) -> str:
    """`exc` as the one line a failure prints after `dnnc: error: `."""
    if isinstance(exc, OSError) and exc.filename and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    # multi-line messages (UnsupportedOpError's list) are joined: "...: a; b"
    text = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    text = text.replace(":; ", ": ")
    if isinstance(exc, (DNNCError, UsageError, OSError)):
        return text
    return f"{type(exc).__name__}: {text} (a dnnc bug: please report it with the traceback " \
           f"that DNNC_DEBUG=1 prints)"


FORCE_EXIT_SECONDS = 3.0
"""How long a Ctrl-C waits for the KeyboardInterrupt to end the command before dnnc exits
anyway: third-party code may swallow it (Cython's module setup in numpy's lazily imported
random package did, 1 in ~25 tries under load), and a second Ctrl-C exits at once."""


def _force_exit() -> None:
    # on a terminal, first clear the line a progress bar may be drawn on (ANSI erase-line)
    os.write(2, (b"\r\x1b[K" if os.isatty(2) else b"") + b"dnnc: interrupted\n")
    os._exit(EXIT_INTERRUPTED)


def on_interrupt(signum, frame) -> None:
    """`main`'s SIGINT handler: a KeyboardInterrupt, and an exit after FORCE_EXIT_SECONDS or
    at a second Ctrl-C should the interrupt be swallowed (`main` resets `pending`)."""
    if getattr(on_interrupt, "pending", False):   # a second Ctrl-C
        _force_exit()
    on_interrupt.pending = True
    watchdog = threading.Timer(FORCE_EXIT_SECONDS, _force_exit)
    watchdog.daemon = True    # never keeps a finished process alive
    watchdog.start()
    raise KeyboardInterrupt
