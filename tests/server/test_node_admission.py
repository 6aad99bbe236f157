"""Which agent a node is: two agents with one node name (a cloned machine, a copied config)
do not share it, the second refused while the first holds the name, the first's pods and
node untouched; an agent that refuses the server (it belongs to another cluster) is never a
Ready node there. Real server, real agents on 127.0.0.1, real pod processes."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import grpc
import pytest

from arranger.agent.agent import Agent
from arranger.client.dev import DevCluster
from arranger.client.sdk import AsyncClient
from arranger.server.node_holders import NodeHolders
from arranger.states import PodState
from arranger.v1 import agent_pb2, agent_pb2_grpc
from tests.conftest import FAST, bare_server, eventually, job_spec, script
from tests.played_agent import launches, played_agent, registration, running

SLEEPS = "import signal\nsignal.pause()  # runs until stopped\n"


def refusals(cluster: DevCluster, reason: str = "node_name_held") -> float:
    """refusals: the server's count of registrations that made no node, for `reason`."""
    series = f'arranger_agent_registrations_refused_total{{reason="{reason}"}}'.encode()
    for line in cluster.server.metrics.exposition().splitlines():
        if line.startswith(series):
            return float(line.split()[-1])
    return 0.0


@pytest.mark.e2e
async def test_a_second_agent_with_a_name_in_use_is_refused_and_the_first_runs_on(
    cluster: DevCluster, client: AsyncClient, tmp_path: Path
) -> None:
    sleeps = script(tmp_path, "sleeps.py", SLEEPS)
    await client.submit(job_spec("steady", leader=sleeps, workers=3))
    server = cluster.server
    view = server.controller.view
    await eventually(lambda: view.find("steady").stage.value == "Running", what="the job to run")
    pods = {p.name: (p.node, p.uid, p.attempt) for p in view.find("steady").pods.values()}
    first = cluster.agents[0]
    name = first.config.node_name
    holder = server.links[name]
    twin = Agent(dataclasses.replace(first.config, data_dir=tmp_path / "twin"), cluster.capacity)
    twin.start()
    try:
        await eventually(lambda: refusals(cluster) >= 2, what="the twin refused, twice")
        assert twin.last_error.startswith(
            f"ALREADY_EXISTS: register.nodeName: node {name!r} is held by another agent (id "
        ), twin.last_error
        assert not twin.connected.is_set()
        assert server.links[name] is holder and not holder.closed
        nodes = {n.name: n for n in await client.nodes()}
        assert nodes[name].state == "Ready"
        job = view.find("steady")
        assert {p.name: (p.node, p.uid, p.attempt) for p in job.pods.values()} == pods
        assert job.stage.value == "Running" and job.leader_restarts == 0
        assert not any(job.set_restarts.values())
        assert first.supervisor.runs and all(
            run.state == PodState.RUNNING for run in first.supervisor.runs.values()
        )
    finally:
        await twin.stop()


def test_a_name_passes_to_another_agent_only_once_its_holder_is_gone() -> None:
    holders = NodeHolders()
    assert holders.claim("n1", "a" * 32, holder_live=False) == ""  # the first holds it
    assert holders.claim("n1", "a" * 32, holder_live=True) == ""  # itself, reconnecting
    assert "held by another agent" in holders.claim("n1", "b" * 32, holder_live=True)
    assert holders.claim("n1", "", holder_live=True) == ""  # an older agent: as before
    assert "held by another agent" in holders.claim("n1", "b" * 32, holder_live=True)
    assert holders.refused == 2
    # The holder's stream closed and the node timed out: a reinstalled machine takes it.
    assert holders.claim("n1", "b" * 32, holder_live=False) == ""
    assert "held by another agent" in holders.claim("n1", "a" * 32, holder_live=True)


@pytest.mark.e2e
async def test_an_agent_of_another_cluster_is_never_a_ready_node_here(
    cluster: DevCluster, client: AsyncClient, tmp_path: Path
) -> None:
    first = cluster.agents[0]
    data = tmp_path / "foreign"
    data.mkdir(mode=0o700)
    (data / "cluster-id").write_text("f" * 32 + "\n")  # joined another cluster before
    config = dataclasses.replace(first.config, node_name="foreign-0", data_dir=data)
    foreign = Agent(config, cluster.capacity)
    foreign.start()
    try:
        await eventually(
            lambda: refusals(cluster, "not_accepted") >= 2, what="the agent to refuse, twice"
        )
        assert "obeys no other" in (foreign.last_error or ""), foreign.last_error
        assert "foreign-0" not in cluster.server.controller.nodes
        assert "foreign-0" not in cluster.server.links
        assert "foreign-0" not in {n.name for n in await client.nodes()}
    finally:
        await foreign.stop()


async def test_a_twin_that_comes_first_after_a_restart_is_refused(tmp_path: Path) -> None:
    """The holder is stored with the node: after a restart, a twin registering before the
    node's own agent (with no pods) is refused, and the job the node runs is left alone."""
    data = tmp_path / "server"
    config = dataclasses.replace(FAST, listen="127.0.0.1:0", data_dir=data)
    original = registration("n1", agent_id="a" * 32)
    async with bare_server(data, config) as server:
        address = f"127.0.0.1:{server.port}"
        async with (
            played_agent(address, original) as stream,
            AsyncClient(address, timeout_s=10) as client,
        ):
            await eventually(lambda: "n1" in server.controller.nodes, what="node n1")
            await client.submit(job_spec("steady", ["sleep", "1000"]))
            for _ in range(2):
                (order,) = await launches(stream, 1)
                await stream.write(running(order))
                original.pods.append(
                    agent_pb2.PodReport(
                        pod_uid=order.pod_uid, attempt=order.attempt, state="Running", pid=4242
                    )
                )
            await eventually(lambda: server.controller.view.find("steady").stage.value == "Running")
    async with bare_server(data, config) as server:
        address = f"127.0.0.1:{server.port}"
        assert server.controller.nodes["n1"].agent_id == "a" * 32
        # The twin says only its register (a write after the refusal would hide it: gRPC's
        # client reports such a write's failure in place of the server's status).
        async with grpc.aio.insecure_channel(address) as channel:
            twin = agent_pb2_grpc.AgentServiceStub(channel).Connect()
            await twin.write(agent_pb2.AgentMessage(register=registration("n1", agent_id="b" * 32)))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                async with asyncio.timeout(10):  # admitted, it would read on
                    while True:
                        await twin.read()
            twin.cancel()
        assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert "held by another agent" in (refused.value.details() or "")
        async with played_agent(address, original) as stream:
            assert (await stream.read()).HasField("registered")
            await eventually(lambda: server.controller.nodes["n1"].connected, what="n1 back")
            job = server.controller.view.find("steady")
            assert job.stage.value == "Running" and job.leader_restarts == 0
            assert not any(job.set_restarts.values())
            assert all(p.state == PodState.RUNNING for p in job.pods.values())
