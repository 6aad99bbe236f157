"""signals lets the long-running commands end cleanly on SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import signal


async def until_stop_signal() -> None:
    """until_stop_signal returns once the process receives SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
