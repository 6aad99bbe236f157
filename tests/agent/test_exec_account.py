"""A command run in a pod runs as the pod's account, by the numbers its run record keeps,
whatever the agent runs as now: a root agent that adopted a pod recorded by an agent running
as a user runs that pod's commands as that user, never as root; a record without an account
runs nothing. A real root agent, a real account."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import psutil
import pytest

from arranger.agent import exec_session
from arranger.agent.exec_session import NOT_RUN, ExecCommand, Input
from arranger.states import PodState
from tests.agent.rootagent import local_users, needs_root, order, root_agent, shared_dir
from tests.conftest import eventually

pytestmark = pytest.mark.e2e


@needs_root
async def test_a_command_runs_as_the_account_the_pods_record_names() -> None:
    with local_users(1) as (alice,), shared_dir() as top:
        async with root_agent(top / "node", run_as="owner") as node:
            sup = node.agent.supervisor
            node.launch(order("jx/pod", ["/bin/sh", "-c", "exec sleep 3600"], owner=alice.pw_name))

            def running() -> bool:
                run = sup.runs.get("jx/pod")
                return run is not None and run.state == PodState.RUNNING

            await eventually(running, 30, "the pod to run")
            run = sup.runs["jx/pod"]

            def sleeping() -> list[psutil.Process]:
                tree = psutil.Process(run.pid).children(recursive=True)
                return [p for p in tree if p.name() == "sleep"]

            sleeps = await eventually(sleeping, 10, "the pod's program")
            assert [p.uids().real for p in sleeps] == [alice.pw_uid]
            path = sup.files.record_path("jx/pod")
            record = json.loads(path.read_text())
            assert record["exec"]["user"][0] == alice.pw_uid

            async def ran(user: object) -> tuple[int, str, str]:
                record["exec"]["user"] = user  # as an agent of that account would write it
                path.write_text(json.dumps(record))
                out = bytearray()

                async def send(stream: str, data: bytes) -> None:
                    out.extend(data)

                async def inputs() -> AsyncIterator[Input]:
                    await asyncio.Future()
                    yield Input()

                command = ExecCommand(run.key, ["/bin/sh", "-c", "id -u"])
                gone = asyncio.Event()
                code, why = await exec_session.serve(sup, command, inputs(), send, gone)
                return code, why, out.decode().strip()

            try:
                # An agent running as alice (no switching) wrote her numbers: a root agent
                # that adopted the pod runs the command as her, not as itself.
                code, why, said = await ran([alice.pw_uid, alice.pw_gid, [alice.pw_gid]])
                assert (code, said) == (0, str(alice.pw_uid)), why
                code, why, said = await ran(None)  # no account kept: nothing runs
                assert code == NOT_RUN and said == "" and why.startswith("cannot run it"), why
            finally:
                sup.processes.stop(run.key, 0)
