"""errors holds the base of every failure the CLI reports as one line, without a traceback."""

from __future__ import annotations


class UserFacingError(Exception):
    """UserFacingError is a failure the user caused or can fix (a refusal, a bad file, an
    unreachable server); its message is one line that names the cause."""
