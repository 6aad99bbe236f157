"""Per-pod usage end to end: real agents sample a real pod's processes and the server shows
the latest figures in `get` (each live pod) and in listings (the job's pods added up), lets go
of them when the pod ends, and keeps the job's peaks and averages in its history record."""

from __future__ import annotations

import sys

from arranger.client.dev import DevCluster
from arranger.client.sdk import AsyncClient
from tests.conftest import eventually, job_spec

HOLDS_AND_SPINS = [
    sys.executable,
    "-c",
    """
block = bytearray(96 * 2**20)
for i in range(0, len(block), 4096):
    block[i] = 1
while True:
    pass
""",
]
MIB = 2**20


async def test_get_and_list_show_live_usage(cluster: DevCluster, client: AsyncClient) -> None:
    spec = job_spec(
        "spinner", HOLDS_AND_SPINS, worker=[sys.executable, "-c", "import signal; signal.pause()"]
    )
    await client.submit(spec)

    async def measured() -> bool:
        status = (await client.get("spinner")).status
        leader, workers = status.leader.usage, status.workers
        return (
            leader.cpu_cores > 0.2
            and leader.memory_bytes >= 96 * MIB
            and all(w.usage.memory_bytes > 0 for w in workers)
        )

    await eventually(measured, timeout_s=30, what="the leader's usage")
    job = await client.get("spinner")
    leader = job.status.leader.usage
    assert leader.memory_peak_bytes >= leader.memory_bytes
    assert leader.time.seconds > 0 and not leader.gpus
    worker = job.status.workers[0].usage
    assert worker.memory_bytes > 0 and worker.cpu_cores < leader.cpu_cores

    [summary] = [j for j in await client.jobs() if j.name == "spinner"]
    assert summary.usage.memory_bytes >= leader.memory_bytes + worker.memory_bytes - 8 * MIB
    totals = cluster.server.usage.totals[summary.id]
    assert totals.cpu_core_s > 0 and totals.peak_memory_bytes >= 96 * MIB

    await client.stop("spinner")
    await client.wait("spinner", timeout_s=30)
    stopped = await client.get("spinner")
    assert not stopped.status.leader.HasField("usage")
    assert summary.id not in cluster.server.usage.totals
    assert not cluster.server.usage.latest

    # The job's history keeps its pods' peaks and averages (stored: read back through the API).
    [record] = [r for r in await client.history() if r.name == "spinner"]
    assert record.peak_memory_bytes >= 96 * MIB
    assert 0 < record.avg_cpu_cores <= record.peak_cpu_cores
    assert not record.HasField("avg_gpu_utilization")  # no GPU: no figure, not a zero
