"""exec_relay pairs a user's ExecPod call with the call its pod's agent makes back.

Agents dial the server; the server never dials them. So a command run in a pod travels on a
call of its own that the agent opens when told to: the server sends an ExecOrder over the
agent's stream carrying a secret id made for that order alone, and the agent calls
`AgentService.Exec`, naming the id (and, with TLS, being the node its certificate names). From
then on the relay copies the user's input to the agent and the agent's output to the user,
one message at a time each way, so that what either side holds is bounded by gRPC's flow
control and a queue of QUEUED messages. An id is claimed once; one not claimed within
ANSWER_S (an agent gone, or of a release that knows no ExecOrder) ends the user's call with
the reason.

At most PER_USER commands of one user and TOTAL of all run at once.
"""

from __future__ import annotations

import asyncio
import secrets
import shlex
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from arranger.server.model import EventRecord
from arranger.v1 import agent_pb2

ANSWER_S = 15.0  # how long the agent has to call back
QUEUED = 8  # input messages held for the agent at most
PER_USER = 8
TOTAL = 256
MAX_INPUT = 64 * 1024  # bytes in one input message
MAX_ARGS = 256
MAX_COMMAND_BYTES = 64 * 1024
MAX_SIZE = 65535  # a terminal's rows or columns
EXEC = "Exec"  # the kind of the event each use leaves
ARGUMENTS = "; arguments: "  # what an Exec event's message says before the command's arguments
HIDDEN = "(hidden)"

AgentStream = AsyncIterator[agent_pb2.ExecFromAgent]


@dataclass(eq=False)
class ExecSession:
    """ExecSession: one command between its user's call and its agent's. `agent` is the agent's
    stream of output once it has called; `to_agent` what goes to it (None: the end)."""

    exec_id: str
    node: str
    user: str
    agent: asyncio.Future[AgentStream] = field(default_factory=asyncio.Future)
    to_agent: asyncio.Queue[agent_pb2.ExecToAgent | None] = field(
        default_factory=lambda: asyncio.Queue(QUEUED)
    )
    refused: str = ""  # why the user's input ended the command, naming the field
    ended: bool = False  # the agent said how the command ended

    def end(self) -> None:
        """end tells the agent's call to end (its command ends with it), whatever is queued."""
        while not self.to_agent.empty():
            self.to_agent.get_nowait()
        self.to_agent.put_nowait(None)
        if not self.agent.done():
            self.agent.cancel()


class ExecRelay:
    """ExecRelay: the commands under way, by their secret id."""

    def __init__(self, per_user: int = PER_USER, total: int = TOTAL) -> None:
        self.per_user, self.total = per_user, total
        self._sessions: dict[str, ExecSession] = {}
        self._users: Counter[str] = Counter()

    def open(self, node: str, user: str) -> ExecSession | str:
        """open: a new session for a command on `node`, or why not (a limit reached)."""
        if len(self._sessions) >= self.total:
            return f"exec: {self.total} commands run on this server already; try again later"
        if self._users[user] >= self.per_user:
            return f"exec: user {user!r} runs {self.per_user} commands already (the most)"
        session = ExecSession(secrets.token_hex(16), node, user)
        self._sessions[session.exec_id] = session
        self._users[user] += 1
        return session

    def close(self, session: ExecSession) -> None:
        """close ends the session (see ExecSession.end) and forgets it."""
        session.end()
        if self._sessions.pop(session.exec_id, None) is not None:
            self._users[session.user] -= 1
            if not self._users[session.user]:
                del self._users[session.user]

    def claim(self, exec_id: str, node: str, stream: AgentStream) -> ExecSession | None:
        """claim hands the agent's stream to the session with that id, if it is open, was
        ordered of that node and not claimed yet; None otherwise."""
        session = self._sessions.get(exec_id)
        if session is None or session.node != node or session.agent.done():
            return None
        session.agent.set_result(stream)
        return session

    def __len__(self) -> int:
        return len(self._sessions)


def command_problem(command: Sequence[str]) -> str:
    """command_problem: why a command may not be run ("" when it may), naming the field."""
    if not command:
        return "start.command: give the command to run"
    if len(command) > MAX_ARGS:
        return f"start.command: {len(command)} arguments; at most {MAX_ARGS}"
    if sum(len(arg.encode(errors="surrogateescape")) for arg in command) > MAX_COMMAND_BYTES:
        return f"start.command: more than {MAX_COMMAND_BYTES} bytes"
    if any("\0" in arg for arg in command):
        return "start.command: an argument holds a NUL byte"
    if not command[0]:
        return "start.command: the program's name is empty"
    return ""


def size_problem(field: str, rows: int, cols: int) -> str:
    """size_problem: why a terminal size may not be taken ("" when it may)."""
    if rows > MAX_SIZE or cols > MAX_SIZE:
        return f"{field}: rows and cols at most {MAX_SIZE}"
    return ""


def exec_event(user: str, command: Sequence[str], pod: str) -> str:
    """exec_event: what the job's Exec event says: who ran which program where, then its
    arguments (which `public_exec_event` hides from other users)."""
    said = f"{user} ran {shlex.quote(command[0])} in pod {pod}"
    return said + ARGUMENTS + shlex.join(command[1:]) if len(command) > 1 else said


def public_exec_event(message: str) -> str:
    """public_exec_event: an Exec event's message as other users read it: everything from its
    first ARGUMENTS on is hidden, as a spec's arguments are."""
    head, found, _ = message.partition(ARGUMENTS)
    return head + ARGUMENTS + HIDDEN if found else head


def visible_events(
    events: Iterable[EventRecord], private: Callable[[str], bool]
) -> list[EventRecord]:
    """visible_events: the events as a reader sees them, where `private(job_id)` says whether
    the reader may read that job's private values: Exec events of other jobs lose their
    arguments."""
    return [
        replace(e, message=public_exec_event(e.message))
        if e.kind == EXEC and not private(e.job_id)
        else e
        for e in events
    ]
