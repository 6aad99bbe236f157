"""A node whose agent enforces GPU shares and says, in a heartbeat, that its enforcement has
failed takes no new share of a GPU (an event says so) until it holds again; pods running there
are left alone, and whole GPUs still go there. A real server; the agent is played by the test
over the real AgentService stream."""

from __future__ import annotations

from pathlib import Path

from arranger.client.sdk import AsyncClient
from arranger.v1 import agent_pb2, node_pb2
from tests.conftest import bare_server, eventually, job_spec
from tests.played_agent import launches, played_agent, registration

GPU = node_pb2.Gpu(index=0, uuid="GPU-0", model="H100", memory=80 * 2**30)


def beat(held: bool) -> agent_pb2.AgentMessage:
    heartbeat = agent_pb2.Heartbeat(gpu_sharing=node_pb2.GpuSharing(enforced=held))
    heartbeat.usage.cpu_percent = 1.0
    return agent_pb2.AgentMessage(heartbeat=heartbeat)


def share_job(name: str, gpu: float) -> dict[str, object]:
    spec = job_spec(name, ["sleep", "60"], workers=0)
    spec["spec"]["workerSets"][0]["maxCounts"] = 1  # type: ignore[index]  # none at first
    spec["spec"]["leader"]["template"]["resources"]["gpu"] = gpu  # type: ignore[index]
    return spec


async def test_a_node_whose_share_enforcement_fails_takes_no_new_share(tmp_path: Path) -> None:
    async with bare_server(tmp_path / "server") as server:
        address = f"127.0.0.1:{server.port}"
        register = registration(
            "mps-0", gpus=[GPU], gpu_sharing=node_pb2.GpuSharing(enforced=True, isolation=True)
        )
        async with (
            played_agent(address, register) as stream,
            AsyncClient(address, timeout_s=10) as client,
        ):
            await eventually(lambda: "mps-0" in server.controller.nodes, what="the node")
            await client.submit(share_job("first", 0.5))
            (first,) = await launches(stream, 1)  # enforced: the share goes there

            await stream.write(beat(False))  # its MPS daemon died
            await eventually(
                lambda: server.controller.nodes["mps-0"].shares == "lost", what="the loss"
            )
            events = [e for e in await client.events() if e.kind == "GpuSharesUnenforced"]
            assert [e.message for e in events] == [
                "node mps-0: its agent no longer holds GPU shares to their limits; no new share "
                "goes there until it does again (pods running there run on)"
            ]
            exposed = server.metrics.exposition().decode()
            assert 'arranger_node_gpu_shares_enforced{node="mps-0"} -1.0' in exposed
            await client.submit(share_job("second", 0.25))
            explained = await client.explain("second")
            assert "GPU share enforcement failing there" in str(explained)
            kept = (await client.get("first")).status
            assert kept.stage not in ("Stopping", "Failed") and kept.leader.state == "Launching"

            await stream.write(beat(True))  # back
            (second,) = await launches(stream, 1)
            assert second.pod_uid != first.pod_uid
            kinds = [e.kind for e in await client.events()]
            assert kinds.count("GpuSharesEnforced") == 1
            nodes = {n.name: n for n in await client.nodes()}
            assert nodes["mps-0"].gpu_sharing.enforced
            exposed = server.metrics.exposition().decode()
            assert 'arranger_node_gpu_shares_enforced{node="mps-0"} 1.0' in exposed
