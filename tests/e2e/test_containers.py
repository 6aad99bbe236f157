"""Jobs that mix containers and processes on a real cluster (server + 2 agents, real podman):
a learner in a busybox container serves the address its actors, plain processes, reach it
at; stopping a job removes its containers. Skipped where podman cannot run the test image."""

from __future__ import annotations

from pathlib import Path

from arranger.client.dev import DevCluster
from arranger.client.sdk import AsyncClient
from tests.conftest import eventually, job_spec, script
from tests.containers import IMAGE, busybox_image, containers_of

# The learner takes a line from each actor on its rpc port (its readiness port: the actors
# start once it listens), then records what it got.
LEARNER = (
    """nc -ll -p "$ARRANGER_PORT_RPC" -e sh -c 'cat >> /out/heard' & """
    'until [ "$(grep -c actor /out/heard 2>/dev/null)" -ge "$ARRANGER_NUM_WORKERS" ]; '
    "do sleep 0.1; done; kill $!; env > /out/learner.env; sort /out/heard > /out/heard.sorted"
)

ACTOR = """
import os, socket
host, port = os.environ["ARRANGER_LEADER_HOST"], int(os.environ["ARRANGER_LEADER_PORT"])
hello = f"actor {os.environ['ARRANGER_WORKER_RANK']} of {os.environ['ARRANGER_LEADER_ADDR']}\\n"
with socket.create_connection((host, port), timeout=10) as s:
    s.sendall(hello.encode())
"""


async def test_a_container_learner_and_process_actors_succeed_together(
    cluster: DevCluster, client: AsyncClient, tmp_path: Path
) -> None:
    busybox_image()
    out = tmp_path / "out"
    out.mkdir()
    spec = job_spec(
        "mixed",
        leader=["sh", "-c"],
        worker=script(tmp_path, "actor", ACTOR),
        workers=2,
        volumes=[{"name": "out", "hostPath": str(out), "mountPath": "/out"}],
    )
    learner = spec["spec"]["leader"]["template"]
    learner.update(image=IMAGE, args=[LEARNER], env={"MODE": "train"}, readiness={"port": "rpc"})
    await client.submit(spec)
    done = await client.wait("mixed", timeout_s=90)
    assert done.status.stage == "Succeeded", done.status.message

    address = done.status.leader_address
    assert address.startswith("127.0.0.1:")
    assert (out / "heard.sorted").read_text() == f"actor 0 of {address}\nactor 1 of {address}\n"
    env = dict(line.split("=", 1) for line in (out / "learner.env").read_text().splitlines())
    assert env["MODE"] == "train" and env["ARRANGER_ROLE"] == "leader"
    assert env["ARRANGER_VOLUME_OUT"] == "/out" and env["ARRANGER_NUM_WORKERS"] == "2"
    assert env["ARRANGER_LEADER_ADDR"] == address and env["ARRANGER_JOB_NAME"] == "mixed"
    for agent in cluster.agents:
        assert containers_of(busybox_image(), agent.config.node_name) == []


async def test_stopping_a_job_removes_its_containers(
    cluster: DevCluster, client: AsyncClient, tmp_path: Path
) -> None:
    podman = busybox_image()
    spec = job_spec("boxed", leader=["sh", "-c"], worker=["sh", "-c"], workers=2)
    for template in (spec["spec"]["leader"]["template"], spec["spec"]["workerSets"][0]["template"]):
        template.update(image=IMAGE, args=["while :; do sleep 1; done"])
    await client.submit(spec)
    nodes = [agent.config.node_name for agent in cluster.agents]

    def boxes() -> list[str]:
        return [name for node in nodes for name in containers_of(podman, node)]

    await eventually(lambda: len(boxes()) == 3, 60, "three containers")
    await client.stop("boxed")
    done = await client.wait("boxed", timeout_s=60)
    assert (done.status.stage, done.status.reason) == ("Succeeded", "Stopped")
    await eventually(lambda: boxes() == [], 30, "the containers to be removed")
