"""Pod times by the server's clock, whatever the node's clock says: the server measures each
node's offset from the time its agent puts in Register and every heartbeat, shows it in
`arranger nodes`, and takes it off the start and end times the agent reports. An agent of an
older release, which says no time, is taken as before. Real server, a played agent over
loopback whose clock runs 15 minutes ahead."""

from __future__ import annotations

import re
import time
from pathlib import Path

from arranger.client.sdk import AsyncClient
from arranger.server.model import NodeRecord
from arranger.v1 import agent_pb2
from tests.client.test_cli import arranger
from tests.conftest import bare_server, eventually, job_spec
from tests.played_agent import launches, played_agent, registration

AHEAD_S = 900.0


def seconds(stamp: object) -> float:
    return stamp.ToMicroseconds() / 1e6  # type: ignore[attr-defined]


async def test_pod_times_are_shown_by_the_servers_clock(tmp_path: Path) -> None:
    async with bare_server(tmp_path / "server") as server:
        address = f"127.0.0.1:{server.port}"
        register = registration("ahead", sent_at=time.time() + AHEAD_S)
        async with (
            played_agent(address, register) as stream,
            AsyncClient(address, timeout_s=10) as client,
        ):
            await eventually(lambda: "ahead" in server.controller.nodes, what="the node")
            await client.submit(job_spec("timed", ["true"], workers=1))
            began = time.time()
            reports = []
            for _ in range(2):  # the leader, then (once it runs) its worker
                (order,) = await launches(stream, 1)
                report = agent_pb2.PodReport(
                    pod_uid=order.pod_uid,
                    attempt=order.attempt,
                    state="Running",
                    pid=4242,
                    ports={name: 40_000 for name in order.ports},
                    start_time=began + AHEAD_S,
                )
                reports.append(report)
                await stream.write(
                    agent_pb2.AgentMessage(pod_reports=agent_pb2.PodReports(reports=[report]))
                )
            beat = agent_pb2.Heartbeat(sent_at=time.time() + AHEAD_S)
            beat.usage.cpu_percent = 1.0
            await stream.write(agent_pb2.AgentMessage(heartbeat=beat))

            async def ran() -> bool:
                status = (await client.get("timed")).status
                return status.leader.state == "Running" and status.workers[0].state == "Running"

            await eventually(ran, what="the pods to run")
            ended = time.time()
            for report in reports:
                report.state, report.exit_code = "Succeeded", 0
                report.finish_time = ended + AHEAD_S
            await stream.write(
                agent_pb2.AgentMessage(pod_reports=agent_pb2.PodReports(reports=reports))
            )

            async def succeeded() -> bool:
                return (await client.get("timed")).status.stage == "Succeeded"

            await eventually(succeeded, what="the job to end")
            status = (await client.get("timed")).status
            for pod in (status.leader, *status.workers):
                assert abs(seconds(pod.start_time) - began) < 5, pod
                assert abs(seconds(pod.finish_time) - ended) < 5, pod
                assert seconds(pod.finish_time) >= seconds(pod.start_time)
            (node,) = await client.nodes()
            assert node.HasField("clock_offset_seconds")
            assert abs(node.clock_offset_seconds - AHEAD_S) < 5
            shown = server.metrics.exposition().decode()
            offset = re.search(r'arranger_node_clock_offset_seconds\{node="ahead"\} (\S+)', shown)
            assert offset is not None and abs(float(offset.group(1)) - AHEAD_S) < 5
            assert 'arranger_node_agent_info{node="ahead",version="test"} 1.0' in shown
        rc, out, err = await arranger("nodes", server=address)
        assert rc == 0 and "(clock +15m)" in out, out + err


def test_an_offset_within_a_messages_delay_is_taken_as_none() -> None:
    # Two agents on clocks that agree measure a few milliseconds off, each by its own
    # message's delay: taken off, that noise would reorder pods that started together.
    node = NodeRecord("n1", "127.0.0.1", 1000, 2**30, clock_offset=-0.04)
    assert node.server_time(1000.0, now=2000.0) == 1000.0
    node.clock_offset = 900.0
    assert node.server_time(1900.0, now=2000.0) == 1000.0
    assert node.server_time(2950.0, now=2000.0) == 2000.0  # never after now
    assert node.server_time(None, now=2000.0) is None
