"""Per-pod usage from real processes: a pod's tree (its shim's descendants) and nothing else,
CPU as the change of CPU time over the sampler's clock (injected: no test waits for time to
pass), resident memory and its peak; GPU use attributed from what NVML says of each process
(the NVML boundary is a function the sampler is given)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from arranger.agent.usage import GpuProcess, GpuReading, UsageSampler
from tests.conftest import eventually

BUSY = """
import os, sys
block = bytearray(64 * 2**20)
for i in range(0, len(block), 4096):
    block[i] = 1
sys.stdout.write("ready\\n"); sys.stdout.flush()
while True:
    pass
"""


@pytest.fixture
def pod() -> Iterator[subprocess.Popen[str]]:
    """pod: a shell (the pod's root) whose child burns CPU and holds 64 MiB."""
    proc = subprocess.Popen(
        ["sh", "-c", f'{sys.executable} -c "$BUSY" & wait'],
        env={**os.environ, "BUSY": BUSY},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    try:
        yield proc
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def ticking() -> Iterator[float]:
    return itertools.count(0.0, 1.0)  # one second between samples


async def test_a_pods_tree_its_cpu_and_memory(pod: subprocess.Popen[str]) -> None:
    clock = ticking()
    sampler = UsageSampler(clock=lambda: next(clock))
    stranger = os.getpid()  # this test's process is no pod's
    first = sampler.sample({("job/learner", 0): pod.pid})
    assert len(first) == 1
    use = first[0]
    assert (use.uid, use.attempt, use.cpu_cores) == ("job/learner", 0, 0.0)
    assert use.memory_bytes >= 64 * 2**20 and use.memory_peak_bytes == use.memory_bytes
    mine = psutil.Process(stranger).memory_info().rss
    assert use.memory_bytes < mine + 200 * 2**20  # not the whole machine's

    child = psutil.Process(pod.pid).children()[0]
    spent = sum(child.cpu_times()[:2])
    await eventually(lambda: sum(child.cpu_times()[:2]) > spent + 0.2, what="CPU to be spent")
    second = sampler.sample({("job/learner", 0): pod.pid})[0]
    assert 0.2 <= second.cpu_cores <= 2.0  # CPU seconds over the one clock second
    assert second.memory_peak_bytes >= second.memory_bytes


def test_an_ended_pod_is_not_sampled_and_is_forgotten(pod: subprocess.Popen[str]) -> None:
    clock = ticking()
    sampler = UsageSampler(clock=lambda: next(clock))
    assert len(sampler.sample({("a/p", 1): pod.pid})) == 1
    os.killpg(pod.pid, 9)
    pod.wait()
    assert sampler.sample({("a/p", 1): pod.pid}) == []
    assert sampler.sample({}) == []


def test_gpu_use_is_attributed_per_process_or_per_gpu(pod: subprocess.Popen[str]) -> None:
    child = psutil.Process(pod.pid).children()[0].pid
    other = subprocess.Popen(["sleep", "60"])
    try:
        readings = [
            GpuReading(
                0, 80.0, [GpuProcess(child, 2 * 2**30, 55.0)]
            ),  # the driver says per process
            GpuReading(
                1, 90.0, [GpuProcess(child, 2**30, -1.0), GpuProcess(other.pid, 2**30, -1.0)]
            ),
            GpuReading(2, 10.0, [GpuProcess(12345678, 2**30, 10.0)]),  # no pod's process
        ]
        sampler = UsageSampler(gpus=lambda: readings)
        uses = {u.uid: u for u in sampler.sample({("a/p", 0): pod.pid, ("b/q", 0): other.pid})}
        a, b = uses["a/p"].gpus, uses["b/q"].gpus
        assert [(g.index, g.memory_bytes, g.utilization, g.whole_gpu) for g in a] == [
            (0, 2 * 2**30, 55.0, False),
            (1, 2**30, 90.0, True),  # the GPU's own figure, shared with b
        ]
        assert [(g.index, g.utilization, g.whole_gpu) for g in b] == [(1, 90.0, True)]
    finally:
        other.kill()
        other.wait()


def test_nvml_failing_costs_only_the_gpu_figures(pod: subprocess.Popen[str]) -> None:
    def broken() -> list[GpuReading]:
        raise RuntimeError("NVML: GPU is lost")

    uses = UsageSampler(gpus=broken).sample({("a/p", 0): pod.pid})
    assert len(uses) == 1 and uses[0].gpus == () and uses[0].memory_bytes > 0
