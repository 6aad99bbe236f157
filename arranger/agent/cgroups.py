"""cgroups holds each plain-process pod to what it was granted: a cgroup per pod attempt under
`arranger/<node>/` in the host's hierarchy (cgroup v2 where the unified hierarchy is the only
one, else the v1 controllers), which the pod's shim joins before it starts the pod (see
process), so everything the pod does is held from its first instruction:

- memory and CPU (with `limits`): the memory limit and CPU quota of its request. A pod the
  kernel killed for memory is reported Failed with reason OOMKilled (the cgroup's oom_kill
  count);
- processes: a pids limit (the pods controller's `pids.max`), whatever `limits` says;
- devices: the GPU device nodes it does not hold are refused (see devices), whatever `limits`
  says: by the v1 devices controller, or by a device program attached to its v2 cgroup.

Each is had where the host lets the agent (root, a writable hierarchy, the controller mounted
or enabled); `detect` says what is held and why the rest is not, and pods run with what is.

CPU time under contention is shared by weight, as Kubernetes shares it: each pod's cgroup
weighs its request in cores, and `arranger/` and each node's directory weigh the machine's
cores, so the pods as a whole are not held to the share of one process of the host's.

A pod's cgroup is removed when the pod ends. One that still held a dying process then is
removed when the next pod ends or starts; and whichever agent starts on the node removes every
empty pod cgroup no live run owns (`sweep`): those of pods that ended while no agent watched,
or that an earlier agent left.

Making a pod's cgroup is on every launch's path, so it writes only what differs from what a new
cgroup has: a weight equal to the kernel's default is left alone, and in cgroup v1 the node's
directory holds `memory.swappiness` 0, which each new cgroup below it takes on when made.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from arranger.agent import bpf, devices
from arranger.agent.devices import NVIDIA_MAJOR, GpuNodes

ROOT = Path("/sys/fs/cgroup")
NO_DEVICES = "no NVIDIA device on this machine to filter"
DEFAULT_PIDS = 4096  # a pod's pids limit unless it, or the agent's pidsLimit, says another
PERIOD_US = 100_000  # the kernel's default period, which a new cgroup has
LIMITS = ("memory", "cpu")  # held together, with `limits`
SHARES_PER_CORE = 1024  # cgroup v1 cpu.shares (2..262144) of one core, as Kubernetes counts it
WEIGHT_PER_CORE = 100  # cgroup v2 cpu.weight (1..10000) of one core (100: v2's default)
DEFAULT_WEIGHT = {1: "1024", 2: "100"}  # what a new cgroup weighs, by version
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class PodCgroup:
    """PodCgroup: one pod attempt's cgroup: its directory for each controller that holds it
    (v2: one directory for all). `leftovers`, shared by the cgroups one Cgroups made, holds
    the directories of ended pods that could not be removed yet."""

    version: int
    dirs: Mapping[str, Path]
    leftovers: set[Path] | None = field(default=None, compare=False, repr=False)

    @property
    def procs(self) -> tuple[Path, ...]:
        """procs: the files the shim writes its pid to, to join."""
        return tuple(d / "cgroup.procs" for d in dict.fromkeys(self.dirs.values()))

    def oom_killed(self) -> bool:
        """oom_killed: whether the kernel killed a process here for want of memory."""
        memory = self.dirs.get("memory")
        if memory is None:
            return False
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        with contextlib.suppress(OSError, ValueError):
            for line in (memory / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value) > 0
        return False

    def kill(self) -> None:
        """kill sends SIGKILL to every process left in the cgroup (a pod whose shim is gone)."""
        pids: set[int] = set()
        for procs in self.procs:
            with contextlib.suppress(OSError, ValueError):
                pids.update(map(int, procs.read_text().split()))
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def remove(self) -> None:
        """remove removes the cgroup once its processes are gone, and any left over from pods
        that ended before: a directory that still holds a dying process is kept in
        `leftovers` for the next pod's end (or start, or the agent's close) to remove."""
        leftovers = self.leftovers if self.leftovers is not None else set()
        for d in [*dict.fromkeys(self.dirs.values()), *leftovers]:
            try:
                d.rmdir()  # refused while a process is in it
            except FileNotFoundError:
                pass
            except OSError:
                leftovers.add(d)
                continue
            leftovers.discard(d)


class Cgroups:
    """Cgroups makes pod cgroups under this node's base directories: `bases` maps each
    controller that holds pods (memory, cpu, pids, devices) to its node directory (v2: the
    same one); `lacking` says why each other is not had."""

    def __init__(
        self,
        version: int,
        bases: Mapping[str, Path],
        gpus: GpuNodes | None = None,
        lacking: Mapping[str, str] | None = None,
    ) -> None:
        self.version = version
        self.bases = dict(bases)
        self.gpus = gpus or GpuNodes()
        self.lacking = dict(lacking or {})
        self.limits = "memory" in self.bases
        self.isolates = "devices" in self.bases
        self._programs: dict[tuple[devices.Rule, ...], int] = {}  # v2: loaded, by rules
        self._leftovers: set[Path] = set()  # of ended pods, not removed yet (PodCgroup.remove)
        memory = self.bases.get("memory")
        # Without swap accounting v1 has no memsw knob: looked for once, not on every launch.
        self._memsw = (
            version == 1
            and memory is not None
            and (memory / "memory.memsw.limit_in_bytes").exists()
        )
        self._swappiness_inherited = (
            version == 1 and memory is not None and _read(memory / "memory.swappiness") == "0"
        )

    @property
    def description(self) -> str:
        """description: what holds pods here: "cgroup v2: memory, cpu, pids, devices"."""
        return f"cgroup v{self.version}: {', '.join(self.bases)}"

    @property
    def isolation_detail(self) -> str:
        """isolation_detail: how GPU device nodes are filtered here, or why they are not."""
        if self.isolates:
            return "cgroup v1 devices" if self.version == 1 else "cgroup v2 device program"
        return self.lacking.get("devices", "no device filter")

    @classmethod
    def detect(
        cls,
        node: str,
        limits: bool = True,
        gpus: GpuNodes | None = None,
        root: Path = ROOT,
    ) -> tuple[Cgroups | None, str]:
        """detect: the node's pod cgroups, or None and why none can be had here. Memory and
        CPU are held only with `limits`; pids always, and devices wherever the machine has an
        NVIDIA device (`gpus`), where the host lets us."""
        base = Path("arranger") / _safe(node)
        wanted: tuple[str, ...] = (*LIMITS, "pids", "devices") if limits else ("pids", "devices")
        if gpus is None or not gpus.present:  # nothing to filter: no cgroup per pod for it
            wanted = wanted[:-1]
        try:
            if (root / "cgroup.controllers").is_file():
                found, why = cls._detect_v2(root, base, wanted, gpus)
            else:
                found, why = cls._detect_v1(root, base, wanted, gpus)
        except OSError as exc:
            return None, f"cannot write cgroups under {root}: {exc.strerror or exc}"
        if found is not None and "devices" not in wanted:
            found.lacking["devices"] = NO_DEVICES
        return found, why

    @classmethod
    def _detect_v2(
        cls, root: Path, base: Path, wanted: Sequence[str], gpus: GpuNodes | None
    ) -> tuple[Cgroups | None, str]:
        have = set((root / "cgroup.controllers").read_text().split())
        controllers = [c for c in wanted if c != "devices"]  # v2 filters devices by program
        lacking = _lacking(controllers, lambda c: c in have, "cgroup v2 lacks {}")
        if "devices" in wanted and (why := _device_programs()):
            lacking["devices"] = why
        held = [c for c in wanted if c not in lacking]
        if not held:
            return None, "; ".join(dict.fromkeys(lacking.values()))
        enable = " ".join(f"+{c}" for c in held if c != "devices")
        path = root
        for part in ("", *base.parts):  # each level hands the controllers down
            path = path / part if part else path
            path.mkdir(exist_ok=True)
            if enable:
                (path / "cgroup.subtree_control").write_text(enable)
            if path != root and "cpu" in held:
                _maybe_write(path / "cpu.weight", _weight(2, _machine_cpu_milli()))
        return cls(2, {c: root / base for c in held}, gpus, lacking), ""

    @classmethod
    def _detect_v1(
        cls, root: Path, base: Path, wanted: Sequence[str], gpus: GpuNodes | None
    ) -> tuple[Cgroups | None, str]:
        lacking = _lacking(
            wanted, lambda c: (root / c).is_dir(), f"no cgroup {{}} controller under {root}"
        )
        held = [c for c in wanted if c not in lacking]
        if not held:
            return None, "; ".join(dict.fromkeys(lacking.values()))
        bases = {c: root / c / base for c in held}
        for path in bases.values():
            path.mkdir(parents=True, exist_ok=True)
        if "cpu" in bases:
            for path in (root / "cpu" / base.parent, root / "cpu" / base):
                _maybe_write(path / "cpu.shares", _weight(1, _machine_cpu_milli()))
        if "memory" in bases:
            _maybe_write(bases["memory"] / "memory.swappiness", "0")  # pods' cgroups take it on
        return cls(1, bases, gpus, lacking), ""

    def create(
        self,
        name: str,
        memory_bytes: int,
        cpu_milli: int,
        pids: int = 0,
        gpus: Sequence[int] = (),
    ) -> PodCgroup:
        """create: a fresh cgroup for one pod attempt with its limits (memory, CPU and pids;
        0: none) and its device filter (it holds the GPUs of indexes `gpus`). Raises OSError
        when the hierarchy refuses; what it made is removed then."""
        safe = _safe(name)
        dirs = {c: f"{base}/{safe}" for c, base in self.bases.items()}
        made = PodCgroup(self.version, {c: Path(d) for c, d in dirs.items()}, self._leftovers)
        self._leftovers.difference_update(made.dirs.values())  # this pod's now, not to remove
        for d in dict.fromkeys(dirs.values()):
            try:
                os.mkdir(d)
            except FileExistsError:  # a leftover of an earlier agent
                with contextlib.suppress(OSError):
                    os.rmdir(d)
                with contextlib.suppress(FileExistsError):
                    os.mkdir(d)
        try:
            self._limit(dirs, memory_bytes, cpu_milli, pids)
            if "devices" in dirs:
                rules = self.gpus.denied(gpus)
                if self.version == 2:
                    if rules:
                        bpf.attach_device_program(dirs["devices"], self._program(rules))
                else:
                    for line in devices.v1_lines(rules):
                        _write(f"{dirs['devices']}/devices.deny", line)
        except OSError:
            made.remove()
            raise
        return made

    def _program(self, rules: tuple[devices.Rule, ...]) -> int:
        """_program: the loaded device program of these rules, loaded once per agent: pods
        holding the same GPUs (or none) share it."""
        program = self._programs.get(rules)
        if program is None:
            program = self._programs[rules] = bpf.load_device_program(devices.program(rules))
        return program

    def _limit(self, dirs: Mapping[str, str], memory_bytes: int, cpu_milli: int, pids: int) -> None:
        """_limit writes the memory, CPU and pids limits into the pod's new cgroup."""
        if pids and "pids" in dirs:
            _write(f"{dirs['pids']}/pids.max", str(pids))
        if "memory" not in dirs:
            return
        memory, cpu = dirs["memory"], dirs["cpu"]
        quota = cpu_milli * PERIOD_US // 1000
        if self.version == 2:
            if memory_bytes:
                _write(f"{memory}/memory.max", str(memory_bytes))
                _maybe_write(f"{memory}/memory.swap.max", "0")  # out of memory means killed
            if quota:
                _write(f"{cpu}/cpu.max", f"{max(quota, 1000)} {PERIOD_US}")
        else:
            if memory_bytes:
                _write(f"{memory}/memory.limit_in_bytes", str(memory_bytes))
                if self._memsw:
                    _maybe_write(f"{memory}/memory.memsw.limit_in_bytes", str(memory_bytes))
                if not self._swappiness_inherited:  # a kernel that refused it on the node's
                    _maybe_write(f"{memory}/memory.swappiness", "0")
            if quota:
                _write(f"{cpu}/cpu.cfs_quota_us", str(max(quota, 1000)))
        weight = _weight(self.version, cpu_milli)
        if quota and weight != DEFAULT_WEIGHT[self.version]:
            knob = "cpu.weight" if self.version == 2 else "cpu.shares"
            _maybe_write(f"{cpu}/{knob}", weight)

    def close(self) -> None:
        """close removes this node's pod cgroups that are empty (one whose removal failed
        while its last process was being reaped, for instance), then its base directories
        and the shared `arranger` directory above, when they are empty; and lets go of the
        device programs it loaded (those attached stay with their cgroups)."""
        for program in self._programs.values():
            os.close(program)
        self._programs.clear()
        self.sweep()
        for base in dict.fromkeys(self.bases.values()):
            for d in (base, base.parent):
                with contextlib.suppress(OSError):
                    d.rmdir()

    def sweep(self, keep: Collection[str] = ()) -> list[str]:
        """sweep removes this node's pod cgroups that are empty, whoever made them: those of
        pods that ended while no agent watched, or whose removal failed while their last
        process was reaped, by this agent or an earlier one. A cgroup with a process in it
        stays (the kernel refuses its removal), as do those of the runs named in `keep`
        (`<pod uid>.<attempt>`), which may be empty only because their shim has not joined
        yet. Returns the names of the cgroups it removed (directory names, as `_safe` makes
        them)."""
        kept = {_safe(name) for name in keep}
        removed: set[str] = set()
        for base in dict.fromkeys(self.bases.values()):
            try:
                children = [c for c in base.iterdir() if c.is_dir() and c.name not in kept]
            except OSError:
                continue
            for child in children:
                try:
                    child.rmdir()
                except OSError:
                    continue
                self._leftovers.discard(child)
                removed.add(child.name)
        return sorted(removed)

    def existing(self, name: str) -> PodCgroup:
        """existing: the cgroup `create` made for `name` (for a run adopted after a restart;
        a controller this agent holds that the earlier one did not is simply absent)."""
        safe = _safe(name)
        dirs = {c: base / safe for c, base in self.bases.items()}
        return PodCgroup(self.version, dirs, self._leftovers)


def _safe(name: str) -> str:
    """_safe: a name as a cgroup directory's: letters, digits, `_`, `.` and `-`, and never `.`
    or `..`."""
    safe = _SAFE.sub("_", name)
    return safe.replace(".", "_") if set(safe) <= {"."} else safe


def pids_ceiling(pid_max: Path = Path("/proc/sys/kernel/pid_max")) -> int:
    """pids_ceiling: the most processes and threads one user's pods may hold on this machine
    (each pod's RLIMIT_NPROC, which the kernel counts over all of a user's processes), and so
    the most a pod's pids limit may be: the kernel's pid_max less an eighth of it (at least
    1,024), kept for the system and the agent. 0 where pid_max cannot be read."""
    try:
        most = int(pid_max.read_text())
    except (OSError, ValueError):
        return 0
    return max(1, most - max(1024, most // 8))


def pod_pids(asked: int, default: int, ceiling: int) -> int:
    """pod_pids: a pod's pids limit: what it asked (0: the node's default), at most the
    ceiling (0: none); 0 means no limit."""
    wanted = asked or default
    return min(wanted, ceiling) if wanted and ceiling else wanted or ceiling


def _lacking(wanted: Sequence[str], has: Callable[[str], bool], saying: str) -> dict[str, str]:
    """_lacking: why each wanted controller the hierarchy lacks cannot be had (`saying` with
    the missing controllers' names); memory and CPU are had together or not at all."""
    missing = [c for c in LIMITS if c in wanted and not has(c)]
    lacking = {c: saying.format(c) for c in wanted if c not in LIMITS and not has(c)}
    if missing:
        lacking.update((c, saying.format(" or ".join(missing))) for c in LIMITS)
    return lacking


def _device_programs() -> str:
    """_device_programs: why cgroup-v2 device programs cannot be had here ("": they can),
    found by loading one that refuses NVIDIA's major."""
    try:
        os.close(bpf.load_device_program(devices.program((devices.Rule(NVIDIA_MAJOR),))))
    except OSError as exc:
        return f"cgroup v2 device programs cannot be loaded: {exc.strerror or exc}"
    return ""


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
