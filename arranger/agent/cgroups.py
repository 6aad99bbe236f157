"""cgroups holds each plain-process pod to what it asked for: a cgroup per pod attempt with the
memory limit and CPU quota of its request, under `arranger/<node>/` in the host's hierarchy
(cgroup v2 if the unified hierarchy is the only one, else the v1 memory and cpu controllers).

The pod's shim joins the cgroup itself before it starts the pod (see process), so everything
the pod allocates is charged to it from the first byte. A pod the kernel killed for memory is
reported Failed with reason OOMKilled (the cgroup's oom_kill count). Where the hierarchy
cannot be written (no root, a read-only mount) `detect` says why, and pods run without limits.

A container pod's cgroup is the parent podman puts the container (and its conmon) under, each
in a cgroup of its own (`nested`): the limits bind at the pod's cgroup all the same. Under
cgroup v1 the kernel counts an OOM kill only in the victim's own cgroup, which podman removes
with the container, so there the agent asks the kernel to tell it of an OOM in the pod's
cgroup (an eventfd on memory.oom_control); v2 counts OOM kills up the tree.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000
V1 = ("memory", "cpu")
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass
class PodCgroup:
    """PodCgroup: one pod attempt's cgroup, a directory per hierarchy (v2: one)."""

    version: int
    dirs: tuple[Path, ...]
    nested: bool = False  # podman makes the cgroups of a container's processes below
    others: tuple[Path, ...] = ()  # v1, nested: the same path in the other hierarchies
    oom_fd: int = -1  # v1, nested: an eventfd the kernel signals on an OOM here

    @property
    def procs(self) -> tuple[Path, ...]:
        """procs: the files the shim writes its pid to, to join."""
        return tuple(d / "cgroup.procs" for d in self.dirs)

    @property
    def parent(self) -> str:
        """parent: the cgroup path a container runtime is given (`--cgroup-parent`)."""
        return "/" + "/".join(self.dirs[0].parts[-3:])

    def watch_oom(self) -> None:
        """watch_oom asks the kernel to signal an OOM in this v1 cgroup or below (where a
        nested pod's own count is lost with the container's cgroup). Best effort."""
        if self.version != 1 or not self.nested or self.oom_fd >= 0:
            return
        with contextlib.suppress(OSError):
            efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            try:
                control = os.open(self.dirs[0] / "memory.oom_control", os.O_RDONLY | os.O_CLOEXEC)
                try:
                    (self.dirs[0] / "cgroup.event_control").write_text(f"{efd} {control}")
                finally:
                    os.close(control)
            except OSError:
                os.close(efd)
                raise
            self.oom_fd = efd

    def oom_killed(self) -> bool:
        """oom_killed: whether the kernel killed a process here for want of memory. Ask
        before `remove`: under v1 the removal itself signals the OOM watch."""
        if self.oom_fd >= 0:
            with contextlib.suppress(BlockingIOError):
                if os.eventfd_read(self.oom_fd) > 0:
                    return True
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
        if self.oom_fd >= 0:
            os.close(self.oom_fd)
            self.oom_fd = -1
        for d in (*self.dirs, *self.others):
            _remove_tree(d, depth=3 if self.nested else 0)


class Cgroups:
    """Cgroups makes pod cgroups under this node's base directories."""

    def __init__(self, version: int, bases: tuple[Path, ...]) -> None:
        self.version = version
        self.bases = bases

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
                return cls(2, (root / base,)), ""
            bases = []
            for controller in V1:
                if not (root / controller).is_dir():
                    return None, f"no cgroup {controller} controller under {root}"
                (root / controller / base).mkdir(parents=True, exist_ok=True)
                bases.append(root / controller / base)
            return cls(1, tuple(bases)), ""
        except OSError as exc:
            return None, f"cannot write cgroups under {root}: {exc.strerror or exc}"

    def create(
        self, name: str, memory_bytes: int, cpu_milli: int, nested: bool = False
    ) -> PodCgroup:
        """create: a fresh cgroup for one pod attempt with its limits (0: none); `nested` for
        a container's parent. Raises OSError when the hierarchy refuses."""
        made = self.existing(name, nested)
        made.remove()  # a leftover of an earlier agent
        for d in made.dirs:
            d.mkdir(exist_ok=True)
        if nested and self.version == 2:  # the container's own cgroups get the controllers
            (made.dirs[0] / "cgroup.subtree_control").write_text("+memory +cpu")
        made.watch_oom()
        dirs = made.dirs
        quota = cpu_milli * PERIOD_US // 1000
        if self.version == 2:
            (d,) = dirs
            if memory_bytes:
                (d / "memory.max").write_text(str(memory_bytes))
                _maybe_write(d / "memory.swap.max", "0")  # out of memory means killed
            if quota:
                (d / "cpu.max").write_text(f"{max(quota, 1000)} {PERIOD_US}")
        else:
            memory, cpu = dirs
            if memory_bytes:
                (memory / "memory.limit_in_bytes").write_text(str(memory_bytes))
                _maybe_write(memory / "memory.memsw.limit_in_bytes", str(memory_bytes))
                _maybe_write(memory / "memory.swappiness", "0")
            if quota:
                (cpu / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                (cpu / "cpu.cfs_quota_us").write_text(str(max(quota, 1000)))
        return made

    def close(self) -> None:
        """close removes this node's pod cgroups that are empty (one whose removal failed
        while its last process was being reaped, for instance), then its base directories
        and the shared `arranger` directory above, when they are empty."""
        for base in (*self.bases, *self._other_bases()):
            _remove_tree(base)
            with contextlib.suppress(OSError):
                base.parent.rmdir()

    def existing(self, name: str, nested: bool = False) -> PodCgroup:
        """existing: the cgroup `create` made for `name` (for a run adopted after a restart)."""
        safe = _SAFE.sub("_", name)
        others = tuple(base / safe for base in self._other_bases()) if nested else ()
        return PodCgroup(self.version, tuple(base / safe for base in self.bases), nested, others)

    def _other_bases(self) -> tuple[Path, ...]:
        """_other_bases: under v1, this node's directory in the hierarchies other than memory
        and cpu, where podman makes a nested pod's cgroups too."""
        if self.version == 2:
            return ()
        root = self.bases[0].parents[2]
        relative = self.bases[0].relative_to(root / V1[0])
        with contextlib.suppress(OSError):
            return tuple(
                h / relative
                for h in sorted(root.iterdir())
                if h.name not in V1 and h.is_dir() and not h.is_symlink()
            )
        return ()


def _remove_tree(top: Path, depth: int = 3) -> None:
    """_remove_tree removes the empty cgroups below `top` (up to `depth` levels) and then `top`
    itself; a cgroup that still has processes stays."""
    if depth > 0:
        with contextlib.suppress(OSError):
            for child in top.iterdir():
                if child.is_dir():
                    _remove_tree(child, depth - 1)
    with contextlib.suppress(OSError):
        top.rmdir()


def _maybe_write(path: Path, value: str) -> None:
    """_maybe_write sets an optional knob (absent without swap accounting, for instance)."""
    with contextlib.suppress(OSError):
        path.write_text(value)
