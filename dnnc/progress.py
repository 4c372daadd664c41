"""Progress of long work (a compile's segments, `dnnc compare`'s bisection): on a terminal a
tqdm bar with its rate and ETA, redrawn as each step starts; where stderr is a file or a pipe
(a CI log) one INFO line per step on the `dnnc` logger instead, since a bar there is noise;
nothing at all when progress is off (`progress=False`, `dnnc -q`).

A bar is drawn with `leave=False`: it is erased when the work ends or is interrupted, so a
Ctrl-C leaves the one `dnnc: interrupted` line and a finished command its result alone. This
module only reports progress; it never decides what work is done.
"""

from __future__ import annotations

import logging
import sys

log = logging.getLogger(__name__)


class Progress:
    """`total` steps of work: `step(message)` as each starts (the bar's postfix, or a line),
    `done()` as each ends; used as a context manager, which erases the bar however the work
    ends."""

    def __init__(self, total: int, enabled: bool, unit: str = "step"):
        self.bar = None
        self.lines = False
        if not enabled:
            return
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="dnnc", unit=unit, file=sys.stderr, leave=False,
                            dynamic_ncols=True)
        else:
            self.lines = True

    def step(self, message: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(message)   # redraws: the elapsed time moves on
        elif self.lines:
            log.info(message)

    def done(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
