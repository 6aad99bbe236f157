"""A pod that ended while no agent ran keeps its own end time: the next agent reports when
the pod's shim recorded its exit (the exit file's time), not when it came back. Real
supervisor, real shim and pod process."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from arranger.agent.orders import LaunchOrder
from arranger.agent.process import recorded_exit
from arranger.agent.runs import PodRun
from arranger.agent.wire import pod_report
from arranger.states import PodState
from tests.agent.test_log_limit import supervisor
from tests.conftest import Gate, eventually


async def test_an_exit_recorded_while_no_agent_ran_keeps_its_time(tmp_path: Path) -> None:
    ended: dict[str, PodRun] = {}
    first = supervisor(tmp_path / "agent", ended)
    async with Gate() as gate:
        first.launch(
            LaunchOrder(
                uid="j/p",
                attempt=0,
                job_id="j",
                pod_name="p",
                command=tuple(gate.command(tmp_path, "waits")),
            )
        )
        await eventually(lambda: first.runs["j/p"].state == PodState.RUNNING, what="the pod")
        for task in list(first._tasks):  # the agent dies; the pod runs on
            task.cancel()
        await asyncio.gather(*first._tasks, return_exceptions=True)
        gate.open()  # the pod ends while no agent runs: its shim records the exit
        exit_file = first.files.exit_path("j/p", 0)
        await eventually(lambda: recorded_exit(exit_file) == 0, what="the exit recorded")
    at = time.time() - 100.0  # as if the next agent came 100 s later
    os.utime(exit_file, (at, at))
    second = supervisor(tmp_path / "agent", ended)
    (run,) = second.recover()
    assert run.state == PodState.SUCCEEDED
    assert abs(run.finish_time - at) < 0.01
    assert abs(pod_report(run).finish_time - at) < 0.01
