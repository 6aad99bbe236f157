"""errors holds the base of every failure the CLI reports as one line, without a traceback."""

from __future__ import annotations

EXIT_INTERRUPTED = 130  # how a command ends on Ctrl-C, as a shell says it
# What a command asks to be said if Ctrl-C ends it now (the CLI leaves at once, unwinding
# nothing): `submit --wait` says its job runs on. The newest is said; empty: nothing.
ON_INTERRUPT: list[str] = []


class UserFacingError(Exception):
    """UserFacingError is a failure the user caused or can fix (a refusal, a bad file, an
    unreachable server); its message is one line that names the cause."""
