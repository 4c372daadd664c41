"""Progress of long work (a compile's segments, `dnnc compare`'s bisection): on a terminal a
tqdm bar with its rate and ETA, redrawn as each step starts; where stderr is a file or a pipe
(a CI log) one INFO line per step on the `dnnc` logger instead, since a bar there is noise;
nothing at all when progress is off (`progress=False`, `dnnc -q`).

A bar is drawn with `leave=False`: it is erased when the work ends or is interrupted, so a
Ctrl-C leaves the one `dnnc: interrupted` line and a finished command its result alone. A
thread redraws it every `REDRAW_SECONDS`, so its elapsed time moves during one long step
(LLVM optimising a whole segment: 20 s on resnet50; llvmlite's calls release the GIL). This
module only reports progress; it never decides what work is done.
"""

from __future__ import annotations

import logging
import sys
import threading

log = logging.getLogger(__name__)

REDRAW_SECONDS = 1.0


class Progress:
    """`total` steps of work: `step(message)` as each starts (the bar's postfix, or a line),
    `done()` as each ends; used as a context manager, which erases the bar however the work
    ends."""

    def __init__(self, total: int, enabled: bool, unit: str = "step"):
        self.bar = None
        self.lines = False
        self._stop = threading.Event()
        if not enabled:
            return
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="dnnc", unit=unit, file=sys.stderr, leave=False,
                            dynamic_ncols=True)
            threading.Thread(target=self._redraw, args=(self.bar,), daemon=True).start()
        else:
            self.lines = True

    def _redraw(self, bar) -> None:
        while not self._stop.wait(REDRAW_SECONDS):
            bar.refresh()

    def step(self, message: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(message)   # redraws: the elapsed time moves on
        elif self.lines:
            log.info(message)

    def done(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        self._stop.set()
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
