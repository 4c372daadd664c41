"""Progress of long work (a compile's segments, `dnnc compare`'s bisection): on a terminal a
tqdm bar with its rate and ETA, redrawn as each step starts; where stderr is a file or a pipe
(a CI log) one INFO line per step on the `dnnc` logger instead, since a bar there is noise;
nothing at all when progress is off (`progress=False`, `dnnc -q`). A compile's steps are its
kernels, each as it is lowered and scheduled, then each segment's machine code; in lines mode
those are DEBUG lines (`dnnc -v`, `detail`), the segment's start an INFO one.

Work that took `SUMMARY_SECONDS` or more ends with one INFO line (`summarise`) whether or not
stderr is a terminal and progress was asked for (from Python, progress defaults to off where
stderr is a file: an 11 s compile used to pass in silence); none when progress is off
explicitly or the `dnnc` logger is above INFO (`logging`, `dnnc -q`).

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
SUMMARY_SECONDS = 3.0   # work this long ends with a summary line (`summarise`)


def summarise(message: str, seconds: float, progress: bool | None) -> None:
    """`message` and `seconds` as one INFO line ("compiled resnet18 for llvm: 49 kernels in
    11.2 s") if the work took `SUMMARY_SECONDS` or more, unless `progress` is False."""
    if progress is not False and seconds >= SUMMARY_SECONDS:
        log.info("%s in %.1f s", message, seconds)


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

    def step(self, message: str, detail: bool = False) -> None:
        """A step starts: the bar's postfix, or a line (at DEBUG for a `detail`, one of many
        small steps such as a kernel's)."""
        if self.bar is not None:
            self.bar.set_postfix_str(message)   # redraws: the elapsed time moves on
        elif self.lines:
            log.log(logging.DEBUG if detail else logging.INFO, message)

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
