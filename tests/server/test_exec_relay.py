"""The exec relay's rules on their own: how many commands run at once, who may claim an order,
what a command may be, and what other users read of an Exec event."""

from __future__ import annotations

import shlex
from collections.abc import AsyncIterator

from hypothesis import given
from hypothesis import strategies as st

from arranger.server.exec_relay import (
    ARGUMENTS,
    EXEC,
    HIDDEN,
    MAX_ARGS,
    MAX_COMMAND_BYTES,
    ExecRelay,
    ExecSession,
    command_problem,
    exec_event,
    public_exec_event,
    visible_events,
)
from arranger.server.model import EventRecord
from arranger.v1 import agent_pb2


async def _nothing() -> AsyncIterator[agent_pb2.ExecFromAgent]:
    return
    yield  # pragma: no cover


async def test_commands_at_once_are_bounded_per_user_and_in_all() -> None:
    relay = ExecRelay(per_user=2, total=3)
    first, second = relay.open("n1", "alice"), relay.open("n1", "alice")
    assert isinstance(first, ExecSession) and isinstance(second, ExecSession)
    assert "user 'alice' runs 2 commands already" in str(relay.open("n1", "alice"))
    third = relay.open("n2", "bob")
    assert isinstance(third, ExecSession)
    assert "3 commands run on this server already" in str(relay.open("n2", "carol"))
    relay.close(first)
    assert isinstance(relay.open("n1", "alice"), ExecSession)
    assert len(relay) == 3


async def test_an_order_is_claimed_once_by_the_node_it_was_sent_to() -> None:
    relay = ExecRelay()
    session = relay.open("n1", "alice")
    assert isinstance(session, ExecSession)
    assert len(session.exec_id) == 32  # 128 random bits
    assert relay.claim(session.exec_id, "n2", _nothing()) is None  # another node
    assert relay.claim("0" * 32, "n1", _nothing()) is None  # no such order
    assert relay.claim(session.exec_id, "n1", _nothing()) is session
    assert relay.claim(session.exec_id, "n1", _nothing()) is None  # only once
    relay.close(session)
    assert relay.claim(session.exec_id, "n1", _nothing()) is None
    assert session.to_agent.get_nowait() is None  # the agent's call is told to end


async def test_an_ended_session_tells_the_agent_whatever_is_queued() -> None:
    relay = ExecRelay()
    session = relay.open("n1", "alice")
    assert isinstance(session, ExecSession)
    while not session.to_agent.full():
        session.to_agent.put_nowait(agent_pb2.ExecToAgent(input=b"x"))
    relay.close(session)
    assert session.to_agent.get_nowait() is None
    assert session.agent.cancelled()


def test_a_command_is_bounded_and_named_by_its_field() -> None:
    assert command_problem(["python", "-c", "print(1)"]) == ""
    assert command_problem([]) == "start.command: give the command to run"
    assert command_problem([""]).startswith("start.command: the program's name is empty")
    assert "NUL" in command_problem(["sh", "a\0b"])
    assert f"at most {MAX_ARGS}" in command_problem(["x"] * (MAX_ARGS + 1))
    assert str(MAX_COMMAND_BYTES) in command_problem(["x" * (MAX_COMMAND_BYTES + 1)])


def test_an_exec_event_names_who_ran_what_and_hides_its_arguments_from_others() -> None:
    said = exec_event("alice", ["python", "-c", "print('secret')"], "job-learner")
    assert (
        said == "alice ran python in pod job-learner; arguments: -c 'print('\"'\"'secret'\"'\"')'"
    )
    assert public_exec_event(said) == f"alice ran python in pod job-learner{ARGUMENTS}{HIDDEN}"
    assert exec_event("alice", ["id"], "p") == public_exec_event(exec_event("alice", ["id"], "p"))
    events = [
        EventRecord(1.0, EXEC, said, "mine"),
        EventRecord(2.0, EXEC, said, "theirs"),
        EventRecord(3.0, "Started", f"x{ARGUMENTS}y", "theirs"),
    ]
    shown = visible_events(events, lambda job_id: job_id == "mine")
    assert [e.message for e in shown] == [said, public_exec_event(said), f"x{ARGUMENTS}y"]


@given(st.lists(st.text(min_size=1), min_size=1, max_size=6), st.text(min_size=1))
def test_no_argument_shows_in_what_others_read(command: list[str], secret: str) -> None:
    """Whatever the program's name holds, nothing after it shows to other users."""
    said = exec_event("alice", [*command, secret], "p")
    head = f"alice ran {shlex.quote(command[0])} in pod p"  # where the arguments begin
    cut = said.index(ARGUMENTS)
    assert cut <= len(head) and said.startswith(head)
    assert public_exec_event(said) == said[:cut] + ARGUMENTS + HIDDEN
