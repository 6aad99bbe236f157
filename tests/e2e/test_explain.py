"""arranger explain and maxRuntimeSeconds on a real cluster."""

from __future__ import annotations

from pathlib import Path

from arranger.client.dev import DevCluster
from arranger.client.sdk import AsyncClient
from tests.client.test_cli import arranger
from tests.conftest import eventually, job_spec, script

SLEEP = "import signal; signal.pause()  # runs until stopped\n"


async def test_explain_a_waiting_job_and_stop_a_job_past_its_max_runtime(
    cluster: DevCluster, client: AsyncClient, tmp_path: Path
) -> None:
    sleep = script(tmp_path, "s", SLEEP)
    await client.submit(
        job_spec(
            "hog", leader=sleep, workers=6, cpu=1, priority=9, minWorkersNum=6, maxRuntimeSeconds=3
        )
    )
    hog = (await client.wait("hog", stages=["Running"], timeout_s=30)).status
    await client.submit(job_spec("waiter", leader=sleep, workers=2, cpu=1, minWorkersNum=2))

    async def explained() -> bool:
        reply = await client.explain("waiter")
        return reply.decision == "Unscheduled" and bool(reply.fits)

    await eventually(explained, what="an explanation of the wait")
    reply = await client.explain("waiter")
    assert (reply.queue_position, reply.queue_waiting) == (1, 1)
    assert [(f.pod, f.count, f.fitting_nodes, f.total_nodes) for f in reply.fits] == [
        ("waiter-learner", 1, 1, 2),
        ("waiter-actors-0", 2, 0, 2),  # with the learner placed: the message's count
    ]
    assert reply.message == (
        "0/2 nodes fit pod waiter-actors-0 of the gang minimum: 2 insufficient cpu"
        "; preempt refused (VictimNotLowerPriority): 1 running jobs not of lower priority"
        "; reclaim refused (ReclaimFromOwnQueue): 1 of its own queue (reclaim takes only from"
        " other queues)"
    )
    assert list(reply.could_preempt) == []  # hog has the higher priority
    assert [(r.action, r.reason) for r in reply.preemption_refused] == [
        ("preempt", "VictimNotLowerPriority"),
        ("reclaim", "ReclaimFromOwnQueue"),
    ]
    expected = hog.start_time.ToNanoseconds() / 1e9 + 3
    assert abs(reply.estimated_start.ToNanoseconds() / 1e9 - expected) < 0.01
    assert reply.queue.name == "default" and reply.queue.status.allocated.cpu == 7

    rc, out, err = await arranger("explain", "waiter", server=cluster.address)
    assert rc == 0, err
    for expected_text in (
        "waiter (queue default, priority 5): Pending, Unscheduled",
        "1st of 1 waiting jobs in queue default",
        "waiter-actors-0 x2",
        "0/2 nodes fit now; 2 insufficient cpu",
        "Estimated start",
        "refused (VictimNotLowerPriority)",
    ):
        assert expected_text in out, out

    done = await client.wait("hog", timeout_s=30)
    assert done.status.stage == "Failed" and done.status.reason == "MaxRuntimeExceeded"
    assert done.status.message == "ran longer than maxRuntimeSeconds (3)"
    await client.wait("waiter", stages=["Running"], timeout_s=30)
    await client.delete("waiter")
