"""discovery finds what this machine offers: CPU cores and memory (psutil), GPUs (NVML).

A machine without NVIDIA GPUs, or without the driver, reports zero GPUs and runs on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil
import structlog

log = structlog.get_logger("arranger.agent")


@dataclass(frozen=True)
class GpuDevice:
    """GpuDevice: one GPU as NVML (or the configuration, `fake`) names it; `minor` is the
    minor number of its /dev/nvidiaN (None: its index)."""

    index: int
    uuid: str
    model: str
    memory_bytes: int
    fake: bool = False
    minor: int | None = None

    @property
    def device_minor(self) -> int:
        return self.index if self.minor is None else self.minor


@dataclass(frozen=True)
class Capacity:
    cpu_milli: int
    memory_bytes: int
    gpus: tuple[GpuDevice, ...] = ()


def machine_capacity() -> Capacity:
    """machine_capacity: the CPUs this process may run on, total memory, NVML's GPUs."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = psutil.cpu_count(logical=True) or 1
    return Capacity(cores * 1000, psutil.virtual_memory().total, tuple(nvml_gpus()))


def nvml_gpus() -> list[GpuDevice]:
    """nvml_gpus lists the NVIDIA GPUs NVML sees, or none when NVML is unavailable."""
    try:
        import pynvml  # noqa: PLC0415 (optional at run time: no driver, no library)
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # pynvml raises NVMLError subclasses, or OSError without libnvidia-ml
        log.info("no NVIDIA GPUs found", reason=str(exc))
        return []
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid, name = pynvml.nvmlDeviceGetUUID(handle), pynvml.nvmlDeviceGetName(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total
            minor = int(pynvml.nvmlDeviceGetMinorNumber(handle))
            model = _gpu_model(_text(name))
            gpus.append(GpuDevice(index, _text(uuid), model, int(memory), minor=minor))
        return gpus
    except Exception as exc:
        log.warning("NVML failed while listing GPUs", reason=str(exc))
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception as exc:
            log.debug("nvmlShutdown failed", reason=str(exc))


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _gpu_model(name: str) -> str:
    """_gpu_model shortens NVML's name to the model users write: 'NVIDIA A100-SXM4-80GB' → 'A100'."""
    words = name.replace("NVIDIA", "").replace("Tesla", "").replace("GeForce", "").split()
    return words[0].split("-")[0] if words else name


def fake_gpus(count: int, model: str, node: str) -> list[GpuDevice]:
    """fake_gpus declares GPUs that do not exist, for trying GPU jobs without them."""
    return [GpuDevice(i, f"fake-{node}-{i}", model, 16 * 2**30, fake=True) for i in range(count)]


def usage() -> tuple[float, int]:
    """usage: whole-machine CPU percent since the last call, and memory in use (bytes)."""
    return psutil.cpu_percent(interval=None), psutil.virtual_memory().used
