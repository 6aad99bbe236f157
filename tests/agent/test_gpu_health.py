"""GPU health on the agent: which XIDs make a GPU unhealthy (the device plugin's rule), that a
GPU once unhealthy stays so, and the NVML watch over a stand-in pynvml (no driver): XID events
from its thread, uncorrectable ECC counts at each poll, fake GPUs never watched."""

from __future__ import annotations

import sys
import threading

import pytest

from arranger.agent.discovery import GpuDevice
from arranger.agent.gpu_health import (
    APPLICATION_XIDS,
    GpuHealth,
    GpuWatch,
    gpu_problems,
    watch_gpus,
    xid_problem,
)
from tests.agent.nvml_stand_in import NvmlStandIn
from tests.conftest import eventually

GPUS = [GpuDevice(i, f"GPU-{i}", "A100", 2**35) for i in range(2)]
FELL_OFF = "XID 79: GPU has fallen off the bus"


def test_application_xids_leave_a_gpu_healthy_and_every_other_xid_does_not() -> None:
    # The Kubernetes NVIDIA device plugin's list of application errors, and no other.
    assert frozenset({13, 31, 43, 45, 68, 109}) == APPLICATION_XIDS
    for xid in APPLICATION_XIDS:
        assert xid_problem(xid) == "", xid
    assert xid_problem(79) == FELL_OFF
    assert xid_problem(48) == "XID 48: double-bit ECC error"
    assert xid_problem(94) == "XID 94: contained ECC error"
    assert xid_problem(1234) == "XID 1234"  # unknown here: unhealthy all the same
    for xid in (1, 12, 14, 32, 44, 46, 67, 69, 108, 110):  # the neighbours count
        assert xid_problem(xid), xid


def test_a_gpu_once_unhealthy_stays_so_with_the_first_reason_found() -> None:
    health = GpuHealth()
    assert health.xid(1, 13) == "" and health.problems == {}
    assert health.xid(1, 79) == FELL_OFF
    assert health.xid(1, 48) == ""  # already unhealthy: nothing new
    assert health.ecc(0, 5) == ""  # counted before the agent started: where it starts from
    assert health.ecc(0, 5) == "" and health.ecc(0, 4) == ""  # no rise (a reset: fewer)
    assert health.ecc(0, 7) == "uncorrectable ECC errors: 2 new"
    assert health.ecc(0, 9) == "" and health.xid(0, 79) == ""
    assert health.problems == {1: FELL_OFF, 0: "uncorrectable ECC errors: 2 new"}


async def test_the_watch_marks_a_gpu_unhealthy_on_xid_79_but_not_on_xid_13() -> None:
    nvml = NvmlStandIn(["GPU-0", "GPU-1"])
    watch = GpuWatch(nvml, GPUS, wait_ms=20)
    assert nvml.registered == [0, 1] and nvml.initialised == 1
    watch.start()
    try:
        nvml.raise_xid(0, 13)  # an application error: GPU 0 stays healthy
        nvml.raise_xid(1, 79, kind=nvml.nvmlEventTypeSingleBitEccError)  # not an XID event
        nvml.raise_xid(1, 79)
        await eventually(watch.problems, timeout_s=10, what="GPU 1 unhealthy")
        assert watch.problems() == {1: FELL_OFF}  # the events came in order: 13 was seen
        assert gpu_problems(watch) == {1: FELL_OFF}
        nvml.raise_xid(1, 48)
        nvml.raise_xid(0, 31)
        nvml.raise_xid(0, 79)
        await eventually(lambda: 0 in watch.problems(), timeout_s=10, what="GPU 0 unhealthy")
        assert watch.problems() == {0: FELL_OFF, 1: FELL_OFF}  # the first reason kept
    finally:
        watch.stop()
    assert not [t for t in threading.enumerate() if t.name == "gpu-health"]
    assert nvml.freed and nvml.initialised == 0  # NVML let go


def test_a_rising_uncorrectable_ecc_count_makes_a_gpu_unhealthy_and_none_kept_is_ignored() -> None:
    nvml = NvmlStandIn(["GPU-0", "GPU-1"], ecc={0: 3, 1: None}, no_events={0})
    watch = GpuWatch(nvml, GPUS, wait_ms=20)
    assert nvml.registered == [1]  # GPU 0's events cannot be registered: its ECC still counts
    watch.poll_ecc()
    assert watch.problems() == {}  # 3 errors from before the agent started do not count
    nvml.ecc[0] = 4
    watch.poll_ecc()
    assert watch.problems() == {0: "uncorrectable ECC errors: 1 new"}
    nvml.ecc[1] = 100  # a GPU that said it does not keep the count is not read again
    watch.poll_ecc()
    assert watch.problems() == {0: "uncorrectable ECC errors: 1 new"}
    watch.stop()


def test_fake_gpus_are_never_watched_nor_gpus_without_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = NvmlStandIn(["GPU-0", "GPU-1"])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    fake = [GpuDevice(i, f"fake-n-{i}", "FakeGPU", 2**34, fake=True) for i in range(2)]
    assert watch_gpus(fake) is None and watch_gpus([]) is None
    assert gpu_problems(None) == {}
    watch = watch_gpus([*fake, GPUS[1]])
    assert watch is not None and nvml.registered == [1]
    watch.stop()
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: import fails
    assert watch_gpus(GPUS) is None
