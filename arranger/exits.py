"""exits: what a process's exit code says. Shells and container runtimes write a process
killed by signal N as the code 128 + N."""

from __future__ import annotations

import signal


def signal_of(code: int | None) -> str:
    """signal_of: the signal an exit code stands for ("SIGKILL" for 137), else ""."""
    if code is None or not 128 < code < 128 + signal.NSIG:
        return ""
    try:
        return signal.Signals(code - 128).name
    except ValueError:
        return ""
