"""nvml_stand_in: a pynvml module for tests, with no driver behind it.

It has the names the agent calls (the same constants, NVMLError with its `value`), GPUs by
UUID, XID events the test raises (`raise_xid`: they come out of nvmlEventSetWait in order,
each wait a real wait on a queue, never a sleep), uncorrectable ECC counts the test sets
(`ecc[index]`; None: the GPU does not keep them) and GPUs whose events cannot be registered
(`no_events`). Put in sys.modules["pynvml"], it is what `import pynvml` finds.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass, field
from types import SimpleNamespace


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass(frozen=True)
class Handle:
    index: int


@dataclass
class NvmlStandIn:
    uuids: list[str]
    ecc: dict[int, int | None] = field(default_factory=dict)
    no_events: set[int] = field(default_factory=set)
    registered: list[int] = field(default_factory=list)  # GPUs whose XID events are watched
    initialised: int = 0  # nvmlInit calls less nvmlShutdown calls
    ecc_reads: int = 0  # how many ECC counts were read
    freed: bool = False
    _events: queue.Queue[SimpleNamespace] = field(default_factory=queue.Queue)

    NVMLError = NVMLError
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_TIMEOUT = 10
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 0x8
    nvmlEventTypeSingleBitEccError = 0x1

    def raise_xid(self, index: int, xid: int, kind: int = 0x8) -> None:
        """raise_xid: NVML reports XID `xid` on GPU `index` (an event of type `kind`)."""
        self._events.put(SimpleNamespace(device=Handle(index), eventType=kind, eventData=xid))

    def nvmlInit(self) -> None:
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        return Handle(index)

    def nvmlDeviceGetUUID(self, handle: Handle) -> bytes:
        return self.uuids[handle.index].encode()  # older pynvml releases answer bytes

    def nvmlEventSetCreate(self) -> str:
        return "event set"

    def nvmlDeviceRegisterEvents(self, handle: Handle, kinds: int, events: str) -> None:
        if handle.index in self.no_events:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        assert kinds == self.nvmlEventTypeXidCriticalError and events == "event set"
        self.registered.append(handle.index)

    def nvmlEventSetWait(self, events: str, timeout_ms: int) -> SimpleNamespace:
        try:
            return self._events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise NVMLError(self.NVML_ERROR_TIMEOUT) from None

    def nvmlEventSetFree(self, events: str) -> None:
        self.freed = True

    def nvmlDeviceGetTotalEccErrors(self, handle: Handle, kind: int, counter: int) -> int:
        assert (kind, counter) == (1, 0), "uncorrected, volatile"
        self.ecc_reads += 1
        count = self.ecc.get(handle.index, 0)
        if count is None:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return count

    # What usage sampling reads (arranger.agent.usage.nvml_probe): idle GPUs, no processes.

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> SimpleNamespace:
        return SimpleNamespace(gpu=0)

    def nvmlDeviceGetProcessUtilization(self, handle: Handle, since: int) -> list[object]:
        raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[object]:
        return []
