"""The scheduling core driving a real cluster: policies, queues, cordon and drain."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from arranger.client.sdk import ArrangerError, AsyncClient, queue_message
from tests.conftest import eventually, job_spec, script

SLEEP = "import signal; signal.pause()  # runs until stopped\n"


async def test_leader_first_puts_the_learner_on_the_idle_node_and_actors_on_the_busy_one(
    client: AsyncClient, tmp_path: Path
) -> None:
    sleep = script(tmp_path, "s", SLEEP)
    await client.submit(job_spec("filler", leader=sleep, cpu=1))  # 2 cores on dev-0 (BinPack)
    filler = (await client.wait("filler", stages=["Running"], timeout_s=30)).status
    busy = filler.leader.node
    spec = job_spec("lf", leader=sleep, workers=2, cpu=0.5, minWorkersNum=2)
    spec["spec"]["schedulerPolicy"] = {"basicPolicy": "LeaderFirst"}
    await client.submit(spec)
    st = (await client.wait("lf", stages=["Running"], timeout_s=30)).status
    assert st.leader.node != busy
    assert [w.node for w in st.workers] == [busy, busy]
    for name in ("lf", "filler"):
        await client.delete(name)


async def test_queues_cap_what_their_jobs_hold(client: AsyncClient, tmp_path: Path) -> None:
    sleep = script(tmp_path, "s", SLEEP)
    await client.create_queue(queue_message("team", weight=2, cpu="2"))
    with pytest.raises(ArrangerError) as caught:
        await client.create_queue(queue_message("team"))
    assert caught.value.code == grpc.StatusCode.ALREADY_EXISTS
    unknown = job_spec("lost", leader=sleep)
    unknown["metadata"]["queue"] = "nowhere"
    with pytest.raises(ArrangerError) as refused:
        await client.submit(unknown)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        refused.value.message
        == "metadata.queue: queue 'nowhere' does not exist (queues: default, team)"
    )

    for name in ("first", "second"):
        spec = job_spec(name, leader=sleep, cpu=0.5)  # 1 core each: the queue holds 2
        spec["metadata"]["queue"] = "team"
        await client.submit(spec)
    third = job_spec("third", leader=sleep, cpu=0.5)
    third["metadata"]["queue"] = "team"
    await client.submit(third)
    for name in ("first", "second"):
        await client.wait(name, stages=["Running"], timeout_s=30)

    async def capped() -> bool:
        st = (await client.get("third")).status
        # ... and says why nothing of its queue was evicted for it (equal priority)
        return st.stage == "Pending" and st.message.startswith("queue team at capability cpu")

    await eventually(capped, what="the third job to wait for its queue")
    team = next(q for q in await client.queues() if q.name == "team")
    assert (
        team.status.allocated.cpu == 2
        and team.status.running_jobs == 2
        and team.status.pending_jobs == 1
    )
    assert team.weight == 2 and team.capability.cpu == 2 and not team.capability.HasField("memory")
    with pytest.raises(ArrangerError) as busy:
        await client.delete_queue("team")
    assert busy.value.code == grpc.StatusCode.FAILED_PRECONDITION

    raised = queue_message("team", weight=2, cpu="3")
    await client.update_queue(raised)
    await client.wait("third", stages=["Running"], timeout_s=30)
    for name in ("first", "second", "third"):
        await client.delete(name)
    await client.delete_queue("team")
    assert [q.name for q in await client.queues()] == ["default"]


async def test_drain_moves_pods_without_counting_restarts_and_cordon_keeps_new_ones_away(
    client: AsyncClient, tmp_path: Path
) -> None:
    sleep = script(tmp_path, "s", SLEEP)
    await client.submit(job_spec("movable", leader=sleep, workers=2))
    before = (await client.wait("movable", stages=["Running"], timeout_s=30)).status
    drained = before.leader.node
    node = await client.drain(drained)
    assert node.cordoned

    async def moved() -> bool:
        # Every pod Running on the other node (the drained ones stop while the new run).
        st = (await client.get("movable")).status
        return (
            st.stage == "Running"
            and st.leader.node not in ("", drained)
            and all(w.node == st.leader.node and w.state == "Running" for w in st.workers)
        )

    await eventually(moved, what="the job to run on the other node")
    after = (await client.get("movable")).status
    assert after.leader_restarts == 0 and not after.worker_set_restarts
    await client.submit(job_spec("newcomer", leader=sleep))
    newcomer = (await client.wait("newcomer", stages=["Running"], timeout_s=30)).status
    assert newcomer.leader.node != drained
    uncordoned = await client.cordon(drained, cordon=False)
    assert not uncordoned.cordoned
    for name in ("movable", "newcomer"):
        await client.delete(name)
