"""cgroups holds each plain-process pod to what it asked for: a cgroup per pod attempt with the
memory limit and CPU quota of its request, under `arranger/<node>/` in the host's hierarchy
(cgroup v2 if the unified hierarchy is the only one, else the v1 memory and cpu controllers).

The pod's shim joins the cgroup itself before it starts the pod (see process), so everything
the pod allocates is charged to it from the first byte. A pod the kernel killed for memory is
reported Failed with reason OOMKilled (the cgroup's oom_kill count). Where the hierarchy
cannot be written (no root, a read-only mount) `detect` says why, and pods run without limits.

CPU time under contention is shared by weight, as Kubernetes shares it: each pod's cgroup
weighs its request in cores, and `arranger/` and each node's directory weigh the machine's
cores, so the pods as a whole are not held to the share of one process of the host's.

Making a pod's cgroup is on every launch's path, so it writes only what differs from what a new
cgroup has: a weight equal to the kernel's default is left alone, and in cgroup v1 the node's
directory holds `memory.swappiness` 0, which each new cgroup below it takes on when made.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000  # the kernel's default period, which a new cgroup has
V1 = ("memory", "cpu")
SHARES_PER_CORE = 1024  # cgroup v1 cpu.shares (2..262144) of one core, as Kubernetes counts it
WEIGHT_PER_CORE = 100  # cgroup v2 cpu.weight (1..10000) of one core (100: v2's default)
DEFAULT_WEIGHT = {1: "1024", 2: "100"}  # what a new cgroup weighs, by version
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class PodCgroup:
    """PodCgroup: one pod attempt's cgroup, a directory per hierarchy (v2: one)."""

    version: int
    dirs: tuple[Path, ...]

    @property
    def procs(self) -> tuple[Path, ...]:
        """procs: the files the shim writes its pid to, to join."""
        return tuple(d / "cgroup.procs" for d in self.dirs)

    def oom_killed(self) -> bool:
        """oom_killed: whether the kernel killed a process here for want of memory."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        with contextlib.suppress(OSError, ValueError):
            for line in (self.dirs[0] / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value) > 0
        return False

    def kill(self) -> None:
        """kill sends SIGKILL to every process left in the cgroup (a pod whose shim is gone)."""
        for procs in self.procs:
            with contextlib.suppress(OSError, ValueError):
                for pid in procs.read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)

    def remove(self) -> None:
        for d in self.dirs:
            with contextlib.suppress(OSError):
                d.rmdir()  # empty once its processes are gone


class Cgroups:
    """Cgroups makes pod cgroups under this node's base directories."""

    def __init__(self, version: int, bases: tuple[Path, ...]) -> None:
        self.version = version
        self.bases = bases
        self._base_names = tuple(map(str, bases))
        # Without swap accounting v1 has no memsw knob: looked for once, not on every launch.
        self._memsw = version == 1 and (bases[0] / "memory.memsw.limit_in_bytes").exists()
        self._swappiness_inherited = version == 1 and _read(bases[0] / "memory.swappiness") == "0"

    @property
    def description(self) -> str:
        return f"cgroup v{self.version}"

    @classmethod
    def detect(cls, node: str, root: Path = ROOT) -> tuple[Cgroups | None, str]:
        """detect: the node's pod cgroups, or None and why they cannot be had here."""
        base = Path("arranger") / _SAFE.sub("_", node)
        try:
            if (root / "cgroup.controllers").is_file():
                wanted = {"memory", "cpu"}
                have = set((root / "cgroup.controllers").read_text().split())
                if not wanted <= have:
                    return None, f"cgroup v2 lacks {', '.join(sorted(wanted - have))}"
                path = root
                for part in ("", *base.parts):  # each level hands the controllers down
                    path = path / part if part else path
                    path.mkdir(exist_ok=True)
                    (path / "cgroup.subtree_control").write_text("+memory +cpu")
                    if path != root:
                        _maybe_write(path / "cpu.weight", _weight(2, _machine_cpu_milli()))
                return cls(2, (root / base,)), ""
            bases = []
            for controller in V1:
                if not (root / controller).is_dir():
                    return None, f"no cgroup {controller} controller under {root}"
                (root / controller / base).mkdir(parents=True, exist_ok=True)
                bases.append(root / controller / base)
            for path in (root / "cpu" / base.parent, root / "cpu" / base):
                _maybe_write(path / "cpu.shares", _weight(1, _machine_cpu_milli()))
            _maybe_write(bases[0] / "memory.swappiness", "0")  # pods' cgroups take it on
            return cls(1, tuple(bases)), ""
        except OSError as exc:
            return None, f"cannot write cgroups under {root}: {exc.strerror or exc}"

    def create(self, name: str, memory_bytes: int, cpu_milli: int) -> PodCgroup:
        """create: a fresh cgroup for one pod attempt with its limits (0: none). Raises
        OSError when the hierarchy refuses."""
        safe = _SAFE.sub("_", name)
        dirs = tuple(f"{base}/{safe}" for base in self._base_names)
        for d in dirs:
            try:
                os.mkdir(d)
            except FileExistsError:  # a leftover of an earlier agent
                PodCgroup(self.version, (Path(d),)).remove()
                with contextlib.suppress(FileExistsError):
                    os.mkdir(d)
        quota = cpu_milli * PERIOD_US // 1000
        weight = _weight(self.version, cpu_milli)
        if self.version == 2:
            (d,) = dirs
            if memory_bytes:
                _write(f"{d}/memory.max", str(memory_bytes))
                _maybe_write(f"{d}/memory.swap.max", "0")  # out of memory means killed
            if quota:
                _write(f"{d}/cpu.max", f"{max(quota, 1000)} {PERIOD_US}")
        else:
            memory, cpu = dirs
            if memory_bytes:
                _write(f"{memory}/memory.limit_in_bytes", str(memory_bytes))
                if self._memsw:
                    _maybe_write(f"{memory}/memory.memsw.limit_in_bytes", str(memory_bytes))
                if not self._swappiness_inherited:  # a kernel that refused it on the node's
                    _maybe_write(f"{memory}/memory.swappiness", "0")
            if quota:
                _write(f"{cpu}/cpu.cfs_quota_us", str(max(quota, 1000)))
        if quota and weight != DEFAULT_WEIGHT[self.version]:  # the cpu controller's directory
            knob = "cpu.weight" if self.version == 2 else "cpu.shares"
            _maybe_write(f"{dirs[-1]}/{knob}", weight)
        return PodCgroup(self.version, tuple(map(Path, dirs)))

    def close(self) -> None:
        """close removes this node's pod cgroups that are empty (one whose removal failed
        while its last process was being reaped, for instance), then its base directories
        and the shared `arranger` directory above, when they are empty."""
        for base in self.bases:
            with contextlib.suppress(OSError):
                for child in base.iterdir():
                    if child.is_dir():
                        PodCgroup(self.version, (child,)).remove()
            for d in (base, base.parent):
                with contextlib.suppress(OSError):
                    d.rmdir()

    def existing(self, name: str) -> PodCgroup:
        """existing: the cgroup `create` made for `name` (for a run adopted after a restart)."""
        safe = _SAFE.sub("_", name)
        return PodCgroup(self.version, tuple(base / safe for base in self.bases))


def _weight(version: int, cpu_milli: int) -> str:
    """_weight: the cgroup CPU weight of `cpu_milli` cores, within the version's range."""
    if version == 2:
        return str(min(10_000, max(1, cpu_milli * WEIGHT_PER_CORE // 1000)))
    return str(min(262_144, max(2, cpu_milli * SHARES_PER_CORE // 1000)))


def _machine_cpu_milli() -> int:
    try:
        return len(os.sched_getaffinity(0)) * 1000
    except AttributeError:  # not Linux
        return (os.cpu_count() or 1) * 1000


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _write(path: str, value: str) -> None:
    """_write sets a knob in one open, write and close (no buffered file object)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _maybe_write(path: Path | str, value: str) -> None:
    """_maybe_write sets an optional knob (absent without swap accounting, for instance)."""
    with contextlib.suppress(OSError):
        _write(str(path), value)
