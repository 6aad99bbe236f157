"""resources is a small vector of the three scheduled resources, in integer units."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

UNLIMITED = 2**62  # a capability component that is not set


class HasRequest(Protocol):
    @property
    def request(self) -> Res: ...


@dataclass(frozen=True, slots=True)
class Res:
    """Res is milli-cores, bytes and milli-GPUs. Arithmetic is exact (integers)."""

    cpu_milli: int = 0
    memory_bytes: int = 0
    gpu_milli: int = 0

    def __add__(self, other: Res) -> Res:
        return Res(
            self.cpu_milli + other.cpu_milli,
            self.memory_bytes + other.memory_bytes,
            self.gpu_milli + other.gpu_milli,
        )

    def __sub__(self, other: Res) -> Res:
        return Res(
            self.cpu_milli - other.cpu_milli,
            self.memory_bytes - other.memory_bytes,
            self.gpu_milli - other.gpu_milli,
        )

    def scaled(self, factor: int) -> Res:
        return Res(self.cpu_milli * factor, self.memory_bytes * factor, self.gpu_milli * factor)

    def fits_in(self, other: Res) -> bool:
        """fits_in: every component is at most the other's."""
        return (
            self.cpu_milli <= other.cpu_milli
            and self.memory_bytes <= other.memory_bytes
            and self.gpu_milli <= other.gpu_milli
        )

    def exceeded(self, limit: Res) -> list[str]:
        """exceeded names the components above the limit: ["cpu", "gpu"]."""
        names = []
        if self.cpu_milli > limit.cpu_milli:
            names.append("cpu")
        if self.memory_bytes > limit.memory_bytes:
            names.append("memory")
        if self.gpu_milli > limit.gpu_milli:
            names.append("gpu")
        return names

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.cpu_milli, self.memory_bytes, self.gpu_milli)

    @staticmethod
    def total(items: Iterable[HasRequest]) -> Res:
        """total adds up the requests of pods (one pass, no intermediate vectors)."""
        cpu = memory = gpu = 0
        for item in items:
            request = item.request
            cpu += request.cpu_milli
            memory += request.memory_bytes
            gpu += request.gpu_milli
        return Res(cpu, memory, gpu)

    @staticmethod
    def minimum(a: Res, b: Res) -> Res:
        return Res(
            min(a.cpu_milli, b.cpu_milli),
            min(a.memory_bytes, b.memory_bytes),
            min(a.gpu_milli, b.gpu_milli),
        )


def ratio(held: int, deserved: int) -> float:
    """ratio: held over deserved in one resource (infinite when some is held of nothing
    deserved)."""
    if deserved > 0:
        return held / deserved
    return float("inf") if held > 0 else 0.0


def share(used: Res, total: Res) -> float:
    """share is the dominant share: the largest used/total over the resources total has."""
    best = 0.0
    for u, t in zip(used.as_tuple(), total.as_tuple(), strict=True):
        if t > 0:
            best = max(best, u / t)
        elif u > 0:
            best = max(best, float("inf"))
    return best
