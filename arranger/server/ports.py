"""ports: what the server's servicers and pages need of the rest of the server, each named for
what it is used for (DESIGN §5).

A servicer is handed its ports when the server is built (`app.py`); it never holds the
server itself. A port is a small protocol, or a plain callable where one call is all it
needs; tests hand in their own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Set
from typing import Protocol

from arranger.sched import Res
from arranger.server.effects import Effects
from arranger.server.model import ExperimentRecord, JobRecord
from arranger.server.store import Store
from arranger.spec import JobSpec

Clock = Callable[[], float]
Commit = Callable[[Effects], Awaitable[None]]  # the one path for changes (changes.ChangePath)
Deserved = Callable[[], dict[str, Res]]  # each queue's share at the last cycle
Closed = Callable[[], str]  # why calls are refused now ("" while the server serves)


class StoreReads(Protocol):
    """StoreReads: the store, for reads of what only the store keeps (events, history,
    packages, tokens)."""

    @property
    def store(self) -> Store:
        """store: the open store (once the server has started)."""
        ...

    async def written(self) -> None:
        """written returns once every change made before the call is stored: a read that
        follows sees what memory showed at the call."""
        ...


class Submissions(Protocol):
    """Submissions: the submit port; a job is stored before it is answered or listed."""

    @property
    def unannounced(self) -> Set[str]:
        """unannounced: jobs submitted whose commit has not yet told watchers (not listed)."""
        ...

    async def submit(self, spec: JobSpec, owner: str) -> JobRecord:
        """submit stores a new job of an admitted spec (StoreError: it is not stored)."""
        ...

    async def submit_experiment(self, spec: JobSpec, owner: str) -> ExperimentRecord:
        """submit_experiment stores a new experiment and its members, of an admitted spec
        with a sweep, in one write (StoreError: none of it is stored)."""
        ...
