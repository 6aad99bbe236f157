"""devices keeps a plain-process pod to the GPU device nodes it holds, as Slurm's
ConstrainDevices does: the kernel refuses the pod every other NVIDIA device node of its machine.

NVIDIA's device nodes are character devices: `/dev/nvidiaN` (major 195, one minor per GPU),
`/dev/nvidiactl` (195:255) and `/dev/nvidia-modeset` (195:254), and majors given out when the
driver's modules load, which /proc/devices names: `nvidia-uvm` (unified memory, which CUDA
opens), `nvidia-caps` (MIG and fabric capabilities), `nvidia-nvswitch`, and the like.

A pod that holds GPUs is refused the nodes of the machine's other GPUs, by minor (the GPUs the
agent reports, with NVML's minor numbers, and every `/dev/nvidiaN` found when it started), and
keeps the control nodes its GPUs need. A pod that holds none is refused every NVIDIA node:
major 195 whole and each other NVIDIA major. Rules name device numbers, never paths, so a node
made anywhere with those numbers (a stand-in under /tmp, or one a pod makes) is refused too.

The rules are the same for both kernels' filters (see cgroups): lines for the v1 devices
controller's `devices.deny` (`v1_lines`), or a cgroup-v2 device program (`program`), the eBPF
program of type BPF_PROG_TYPE_CGROUP_DEVICE that runc and systemd attach, which answers every
open and mknod of a device by the cgroup's processes.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

NVIDIA_MAJOR = 195  # /dev/nvidiaN, nvidiactl (255) and nvidia-modeset (254)
GPU_MINORS = range(0, 254)  # minors of /dev/nvidiaN; 254 and 255 are the control nodes
_GPU_NODE = re.compile(r"nvidia([0-9]+)")
_OTHER_MAJOR = re.compile(r"\s*([0-9]+)\s+(nvidia[-\w]*)\s*$")


@dataclass(frozen=True)
class Rule:
    """Rule: a character device number the pod may not open or make; `minor` None: every
    minor of `major`."""

    major: int
    minor: int | None = None


@dataclass(frozen=True)
class GpuNodes:
    """GpuNodes: the device numbers of a machine's NVIDIA GPUs. `minors` maps a GPU's index
    (as the agent reports it) to the minor of its /dev/nvidiaN where they differ; `gpu_minors`
    holds every GPU node's minor on the machine; `majors` the other NVIDIA majors."""

    minors: Mapping[int, int] = field(default_factory=dict)
    gpu_minors: frozenset[int] = frozenset()
    majors: tuple[int, ...] = ()
    driver: bool = False  # NVIDIA's driver is loaded, whatever nodes exist yet

    @classmethod
    def find(
        cls,
        gpus: Mapping[int, int],
        dev: Path = Path("/dev"),
        proc_devices: Path = Path("/proc/devices"),
        driver: Path = Path("/proc/driver/nvidia"),
    ) -> GpuNodes:
        """find: the machine's GPU device numbers, given the agent's GPUs (index -> minor):
        those, every `nvidiaN` character node of major 195 in `dev`, and the NVIDIA majors
        that `proc_devices` lists; and whether the driver is loaded (`driver` exists), which
        may make nodes later (nvidia-modprobe)."""
        found = set(gpus.values())
        with contextlib.suppress(OSError), os.scandir(dev) as entries:
            for entry in entries:
                if _GPU_NODE.fullmatch(entry.name):
                    with contextlib.suppress(OSError):
                        st = entry.stat(follow_symlinks=False)
                        if stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == NVIDIA_MAJOR:
                            found.add(os.minor(st.st_rdev))
        majors = set()
        with contextlib.suppress(OSError):
            text = proc_devices.read_text()
            chars = text.partition("Block devices:")[0]
            for line in chars.splitlines():
                match = _OTHER_MAJOR.match(line)
                if match and int(match[1]) != NVIDIA_MAJOR:
                    majors.add(int(match[1]))
        minors = frozenset(m for m in found if m in GPU_MINORS)
        return cls(dict(gpus), minors, tuple(sorted(majors)), driver.exists())

    @property
    def present(self) -> bool:
        """present: whether the machine has any NVIDIA device to keep pods from, or a driver
        that may make one."""
        return bool(self.gpu_minors or self.minors or self.majors or self.driver)

    def denied(self, held: Iterable[int]) -> tuple[Rule, ...]:
        """denied: what a pod holding the GPUs of these indexes may not open: the other GPUs'
        nodes, or, holding none, every NVIDIA node."""
        own = {self.minors.get(index, index) for index in held}
        if not own:
            return (Rule(NVIDIA_MAJOR), *(Rule(major) for major in self.majors))
        return tuple(Rule(NVIDIA_MAJOR, minor) for minor in sorted(self.gpu_minors - own))


def v1_lines(rules: Sequence[Rule]) -> list[str]:
    """v1_lines: the rules as lines for a v1 devices cgroup's devices.deny, one write each.
    (A cgroup whose default is to allow keeps them as exceptions.)"""
    return [f"c {r.major}:{'*' if r.minor is None else r.minor} rwm" for r in rules]


# eBPF, as the kernel's uapi/linux/bpf.h encodes it: one instruction is 8 bytes, its opcode,
# its registers (destination in the low four bits), a 16-bit offset and a 32-bit immediate.
_LDX_W = 0x61  # BPF_LDX | BPF_MEM | BPF_W: dst = *(u32 *)(src + off)
_AND_K = 0x57  # BPF_ALU64 | BPF_AND | BPF_K: dst &= imm
_MOV_K = 0xB7  # BPF_ALU64 | BPF_MOV | BPF_K: dst = imm
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K: if dst == imm, skip `off` instructions
_JNE_K = 0x55  # BPF_JMP | BPF_JNE | BPF_K
_EXIT = 0x95  # BPF_JMP | BPF_EXIT: return r0
_CHAR = 2  # BPF_DEVCG_DEV_CHAR, in the low 16 bits of bpf_cgroup_dev_ctx.access_type


def program(rules: Sequence[Rule]) -> bytes:
    """program: the cgroup-v2 device program of the rules. It reads the device's type, major
    and minor from its context (struct bpf_cgroup_dev_ctx: access_type, major, minor, each a
    u32), answers 0 (refused) for a character device that a rule names and 1 for any other."""
    head = [
        (_LDX_W, 2, 1, 0, 0),  # r2 = ctx->access_type
        (_AND_K, 2, 0, 0, 0xFFFF),  # r2: the device's type
        (_LDX_W, 3, 1, 4, 0),  # r3 = ctx->major
        (_LDX_W, 4, 1, 8, 0),  # r4 = ctx->minor
    ]
    tests: list[tuple[int, int, int, int | str, int]] = [(_JNE_K, 2, 0, "allow", _CHAR)]
    for rule in rules:
        if rule.minor is None:
            tests.append((_JEQ_K, 3, 0, "deny", rule.major))
        else:
            tests.append((_JNE_K, 3, 0, 1, rule.major))  # another major: past the next test
            tests.append((_JEQ_K, 4, 0, "deny", rule.minor))
    allow = len(head) + len(tests)
    ends = {"allow": allow, "deny": allow + 2}
    code = bytearray()
    for op, dst, src, off, imm in head:
        code += _insn(op, dst, src, off, imm)
    for i, (op, dst, src, target, imm) in enumerate(tests, start=len(head)):
        off = ends[target] - (i + 1) if isinstance(target, str) else target
        code += _insn(op, dst, src, off, imm)
    for answer in (1, 0) if rules else (1,):  # allow: r0 = 1; deny: r0 = 0 (never unreachable)
        code += _insn(_MOV_K, 0, 0, 0, answer) + _insn(_EXIT, 0, 0, 0, 0)
    return bytes(code)


def _insn(op: int, dst: int, src: int, off: int, imm: int) -> bytes:
    return struct.pack("<BBhi", op, (src << 4) | dst, off, imm)
