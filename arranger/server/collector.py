"""collector keeps Python's cyclic garbage collector from stalling the server.

A full collection walks every tracked object: with thousands of nodes and jobs in memory it
stops the event loop for 100-400 ms, which every submit waiting then pays. The server's
records live long and form no cycles, so once a full collection has run, what survived it is
frozen (`gc.freeze`: kept out of later collections; reference counting still frees it), and
only what was made since is walked. Cyclic garbage among frozen objects would wait, so every
`full_every_s` everything is unfrozen and the next full collection looks at it all again.
"""

from __future__ import annotations

import gc
import time
from typing import Any

FULL_EVERY_S = 3_600.0


class Collector:
    """Collector: survivors of each full collection are frozen; all is unfrozen again after
    `full_every_s`. `install` and `remove` add and take away the hook (process-wide)."""

    def __init__(self, full_every_s: float = FULL_EVERY_S) -> None:
        self.full_every_s = full_every_s
        self._since = time.monotonic()

    def install(self) -> None:
        if self._hook not in gc.callbacks:
            gc.callbacks.append(self._hook)

    def remove(self) -> None:
        if self._hook in gc.callbacks:
            gc.callbacks.remove(self._hook)
        gc.unfreeze()

    def _hook(self, phase: str, info: dict[str, Any]) -> None:
        if phase != "stop" or info["generation"] != 2:
            return
        now = time.monotonic()
        if now - self._since >= self.full_every_s:
            self._since = now
            gc.unfreeze()  # the next full collection walks everything again
        else:
            gc.freeze()
