"""listing keeps jobs in listing order, oldest first, so that a page costs what it returns.

A job's place is its key, (submit time, id): a total order, and the one a page token and a
watch's resume token name. `JobOrder` holds every job's key in a sorted list, and each owner's
in one of their own, so that finding where a page starts is a binary search and a page of one
owner's jobs never walks past anyone else's.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator

from arranger.server.model import JobRecord

Key = tuple[float, str]  # (submit time, job id)
FIRST: Key = (-math.inf, "")  # before every job


def key_of(job: JobRecord) -> Key:
    return (job.submit_time, job.id)


def key_token(key: Key) -> str:
    """key_token writes a key as text (the page token); `parse_key` reads it back."""
    return f"{key[0]!r}/{key[1]}"


def parse_key(text: str) -> Key | None:
    """parse_key: the key `key_token` wrote, None if the text is not one."""
    when, slash, job_id = text.partition("/")
    if not slash or not job_id or "/" in job_id:
        return None
    try:
        seconds = float(when)
    except ValueError:
        return None
    return (seconds, job_id) if math.isfinite(seconds) else None


class JobOrder:
    """JobOrder: the keys of the controller's jobs (deleted ones too, until they are reaped),
    sorted, all together and per owner. Adding a job that is newer than every other (a submit)
    appends; anything else costs a binary search and a move of the list's tail."""

    def __init__(self) -> None:
        self._all: list[Key] = []
        self._by_owner: dict[str, list[Key]] = {}

    def __len__(self) -> int:
        return len(self._all)

    def newest(self) -> Key | None:
        return self._all[-1] if self._all else None

    def add(self, job: JobRecord) -> None:
        key = key_of(job)
        _insert(self._all, key)
        _insert(self._by_owner.setdefault(job.owner, []), key)

    def remove(self, job: JobRecord) -> None:
        key = key_of(job)
        _remove(self._all, key)
        mine = self._by_owner.get(job.owner)
        if mine is not None:
            _remove(mine, key)
            if not mine:
                del self._by_owner[job.owner]

    def after(self, key: Key | None, owner: str | None = None) -> Iterator[str]:
        """after yields the ids of the jobs after `key` (None: from the oldest), of `owner`
        only when given, oldest first. The order must not change while it is iterated."""
        keys = self._all if owner is None else self._by_owner.get(owner, [])
        i = 0 if key is None else bisect.bisect_right(keys, key)
        while i < len(keys):
            yield keys[i][1]
            i += 1


def _insert(keys: list[Key], key: Key) -> None:
    if not keys or keys[-1] < key:
        keys.append(key)
    else:
        bisect.insort(keys, key)


def _remove(keys: list[Key], key: Key) -> None:
    i = bisect.bisect_left(keys, key)
    if i < len(keys) and keys[i] == key:
        del keys[i]
