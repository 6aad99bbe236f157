"""gpu_health: which of this node's GPUs are unhealthy, as NVML tells of them.

Two signs make a GPU unhealthy, as in the Kubernetes NVIDIA device plugin:
- an XID critical error NVML reports for it, except the application errors (APPLICATION_XIDS:
  a program's own fault, after which the GPU serves the next one as before);
- its count of uncorrectable ECC errors (volatile: since the driver loaded) rising between two
  readings, polled every usage interval. Errors counted before the agent started are not
  held against the GPU: only a rise seen by this agent is. A GPU that does not keep the count
  (ECC off, a consumer card) is not checked this way.

A GPU once unhealthy stays so, with the first reason found, until the agent restarts: NVML
never says that a GPU has recovered (after an XID 79 it needs a reset or a reboot), and a GPU
that failed once would fail the next pod too. The server places nothing more on it; the pods
already on it run on, as on a Kubernetes node whose device plugin marks a GPU unhealthy.

`GpuHealth` is the rule, pure; `GpuWatch` is the NVML shell: a thread that waits for XID events
(a short wait at a time, so that it stops soon after it is asked to) and a poll of the ECC
counts. Fake GPUs (configured, not found by NVML) are never watched and never unhealthy.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from arranger.agent.discovery import GpuDevice

log = structlog.get_logger("arranger.agent")

# XIDs that are a program's error, not the GPU's: the device plugin's list of those it ignores
# (k8s-device-plugin internal/rm/health.go). Any other XID makes the GPU unhealthy.
APPLICATION_XIDS = frozenset(
    {
        13,  # graphics engine exception
        31,  # GPU memory page fault
        43,  # GPU stopped processing
        45,  # preemptive cleanup, due to previous errors
        68,  # video processor exception
        109,  # context switch timeout
    }
)
# What some XIDs that make a GPU unhealthy mean (NVIDIA's XID catalog), for the reason shown.
XID_MEANING = {
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping event",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
WAIT_MS = 500  # the longest one wait for an XID event lasts: how soon the watch stops


def xid_problem(xid: int) -> str:
    """xid_problem: why XID `xid` makes a GPU unhealthy ("XID 79: GPU has fallen off the
    bus"), or "" for an application error, which does not."""
    if xid in APPLICATION_XIDS:
        return ""
    meaning = XID_MEANING.get(xid)
    return f"XID {xid}: {meaning}" if meaning else f"XID {xid}"


@dataclass
class GpuHealth:
    """GpuHealth: the GPUs found unhealthy so far (`problems`: by index, the first reason
    found), and each GPU's uncorrectable ECC count when first read (`ecc_first`). A GPU in
    `problems` never leaves it."""

    problems: dict[int, str] = field(default_factory=dict)
    ecc_first: dict[int, int] = field(default_factory=dict)

    def xid(self, index: int, xid: int) -> str:
        """xid: GPU `index` reported XID `xid`; the problem it newly has ("" if none: an
        application error, or a GPU already unhealthy)."""
        return self._found(index, xid_problem(xid))

    def ecc(self, index: int, uncorrected: int) -> str:
        """ecc: GPU `index` has counted `uncorrected` uncorrectable ECC errors; the problem it
        newly has ("" if none). The first reading of a GPU is where its count starts from."""
        first = self.ecc_first.setdefault(index, uncorrected)
        if uncorrected <= first:
            return ""
        return self._found(index, f"uncorrectable ECC errors: {uncorrected - first} new")

    def _found(self, index: int, problem: str) -> str:
        if not problem or index in self.problems:
            return ""
        self.problems[index] = problem
        return problem


class GpuWatch:
    """GpuWatch watches the given GPUs through `nvml` (the pynvml module, or a stand-in with
    its names): XID events in a thread from `start()` to `stop()`, ECC counts at each
    `poll_ecc()`. `problems()` may be read from any thread. A GPU whose events NVML cannot
    register (too old, or not supported) is not watched for them; unlike the device plugin,
    the watch's own failure never marks a GPU unhealthy (it is logged)."""

    def __init__(self, nvml: Any, gpus: Sequence[GpuDevice], wait_ms: int = WAIT_MS) -> None:
        self._nvml = nvml
        self._wait_ms = wait_ms
        self._health = GpuHealth()
        self._lock = threading.Lock()  # the thread, poll_ecc and problems() share _health
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        nvml.nvmlInit()
        self._handles = {gpu.index: nvml.nvmlDeviceGetHandleByIndex(gpu.index) for gpu in gpus}
        self._by_uuid = {gpu.uuid: gpu.index for gpu in gpus}
        self._ecc_kept = set(self._handles)  # GPUs whose ECC count may be read
        self._watched = 0  # GPUs whose XID events come to the event set
        try:
            self._events: Any = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:  # ECC counts are still read
            log.warning("GPUs not watched for XID errors", reason=str(exc))
            self._events = None
        for index, handle in (self._handles if self._events is not None else {}).items():
            try:
                nvml.nvmlDeviceRegisterEvents(
                    handle, nvml.nvmlEventTypeXidCriticalError, self._events
                )
                self._watched += 1
            except nvml.NVMLError as exc:
                log.warning("GPU not watched for XID errors", gpu=index, reason=str(exc))

    def start(self) -> None:
        """start watches for XID events in a thread of its own (if any GPU has them)."""
        if self._watched and self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="gpu-health", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """stop ends the thread (within one wait) and lets NVML go; once."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=self._wait_ms / 1000 * 4)
        try:
            if self._events is not None:
                self._nvml.nvmlEventSetFree(self._events)
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as exc:
            log.debug("NVML not let go", reason=str(exc))

    def problems(self) -> dict[int, str]:
        """problems: the unhealthy GPUs by index, and why."""
        with self._lock:
            return dict(self._health.problems)

    def poll_ecc(self) -> None:
        """poll_ecc reads each GPU's uncorrectable ECC count (it reads the driver: call it off
        the event loop). A GPU that does not keep the count is not read again."""
        nvml = self._nvml
        for index in sorted(self._ecc_kept):
            try:
                count = nvml.nvmlDeviceGetTotalEccErrors(
                    self._handles[index],
                    nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                    nvml.NVML_VOLATILE_ECC,
                )
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) == nvml.NVML_ERROR_NOT_SUPPORTED:
                    self._ecc_kept.discard(index)
                else:
                    log.debug("ECC count not read", gpu=index, reason=str(exc))
                continue
            with self._lock:
                problem = self._health.ecc(index, int(count))
            if problem:
                log.error("GPU unhealthy: no new pods go to it", gpu=index, reason=problem)

    def _watch(self) -> None:
        nvml = self._nvml
        while not self._stopping.is_set():
            try:
                event = nvml.nvmlEventSetWait(self._events, self._wait_ms)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) == nvml.NVML_ERROR_TIMEOUT:
                    continue
                log.warning("XID errors are no longer watched", reason=str(exc))
                return
            if event.eventType != nvml.nvmlEventTypeXidCriticalError:
                continue
            try:
                uuid = _text(nvml.nvmlDeviceGetUUID(event.device))
            except nvml.NVMLError as exc:
                log.warning("XID error of an unknown GPU", xid=event.eventData, reason=str(exc))
                continue
            index = self._by_uuid.get(uuid)
            if index is None:
                continue
            with self._lock:
                problem = self._health.xid(index, int(event.eventData))
            if problem:
                log.error("GPU unhealthy: no new pods go to it", gpu=index, reason=problem)
            else:
                log.info("XID error", gpu=index, xid=event.eventData)


def watch_gpus(gpus: Sequence[GpuDevice]) -> GpuWatch | None:
    """watch_gpus: a watch over the real GPUs among `gpus`, or None where there is none or
    NVML cannot be loaded (no driver: nothing to watch)."""
    real = [gpu for gpu in gpus if not gpu.fake]
    if not real:
        return None
    try:
        import pynvml  # noqa: PLC0415 (optional at run time: no driver, no library)

        return GpuWatch(pynvml, real)
    except Exception as exc:  # pynvml raises NVMLError subclasses, or OSError without libnvidia-ml
        log.warning("GPU health is not watched", reason=str(exc))
        return None


def gpu_problems(watch: GpuWatch | None) -> dict[int, str]:
    """gpu_problems: the unhealthy GPUs by index, in index order, and why (none without a
    watch)."""
    found: Mapping[int, str] = watch.problems() if watch is not None else {}
    return dict(sorted(found.items()))


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
