"""bpf loads cgroup-v2 device programs (see devices.program) and attaches them to a cgroup,
through the bpf(2) system call, as runc does: BPF_PROG_LOAD, then BPF_PROG_ATTACH with
BPF_F_ALLOW_MULTI, so the program runs beside any an ancestor holds (systemd's), and a device
is opened only if every one of them allows it.

An attached program stays with its cgroup, whoever closes the descriptor, until the cgroup is
removed: the pod's processes, which join the cgroup before the pod's program starts, are held
by it from their first instruction. Needs CAP_SYS_ADMIN (an agent running as root).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform

# bpf(2)'s number by machine (the agent's two: x86-64 and 64-bit Arm, both little-endian).
_SYSCALL = {"x86_64": 321, "aarch64": 280}
_PROG_LOAD, _PROG_ATTACH = 5, 8
_PROG_TYPE_CGROUP_DEVICE = 15
_CGROUP_DEVICE = 6  # the attach type
_ALLOW_MULTI = 2
_LICENSE = b"Apache-2.0"  # the program calls no kernel helper, so any license loads
_LOG_BYTES = 16_384


class _Load(ctypes.Structure):
    """_Load: union bpf_attr as BPF_PROG_LOAD reads it, up to expected_attach_type."""

    _fields_ = [
        ("prog_type", ctypes.c_uint32),
        ("insn_cnt", ctypes.c_uint32),
        ("insns", ctypes.c_uint64),
        ("license", ctypes.c_uint64),
        ("log_level", ctypes.c_uint32),
        ("log_size", ctypes.c_uint32),
        ("log_buf", ctypes.c_uint64),
        ("kern_version", ctypes.c_uint32),
        ("prog_flags", ctypes.c_uint32),
        ("prog_name", ctypes.c_char * 16),
        ("prog_ifindex", ctypes.c_uint32),
        ("expected_attach_type", ctypes.c_uint32),
    ]


class _Attach(ctypes.Structure):
    """_Attach: union bpf_attr as BPF_PROG_ATTACH reads it."""

    _fields_ = [
        ("target_fd", ctypes.c_uint32),
        ("attach_bpf_fd", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("attach_flags", ctypes.c_uint32),
        ("replace_bpf_fd", ctypes.c_uint32),
    ]


_libc = ctypes.CDLL(None, use_errno=True)


def _bpf(command: int, attr: ctypes.Structure) -> int:
    number = _SYSCALL.get(platform.machine())
    if number is None:
        raise OSError(f"no bpf(2) number known for {platform.machine()}")
    result = int(_libc.syscall(number, command, ctypes.byref(attr), ctypes.sizeof(attr)))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def load_device_program(code: bytes) -> int:
    """load_device_program: a descriptor of the device program `code` (8 bytes an
    instruction), checked by the kernel's verifier; the caller closes it. Raises OSError with
    the verifier's words where it refuses the program."""
    insns = ctypes.create_string_buffer(code, len(code))
    license = ctypes.create_string_buffer(_LICENSE)
    log = ctypes.create_string_buffer(_LOG_BYTES)
    attr = _Load(
        prog_type=_PROG_TYPE_CGROUP_DEVICE,
        insn_cnt=len(code) // 8,
        insns=ctypes.addressof(insns),
        license=ctypes.addressof(license),
        prog_name=b"arranger_dev",
        expected_attach_type=_CGROUP_DEVICE,
    )
    try:
        return _bpf(_PROG_LOAD, attr)
    except OSError as exc:
        if exc.errno is None:
            raise
        attr.log_level, attr.log_size, attr.log_buf = 1, _LOG_BYTES, ctypes.addressof(log)
        with contextlib.suppress(OSError):  # again, for the verifier's reason
            os.close(_bpf(_PROG_LOAD, attr))
        words = log.value.decode(errors="replace").strip().splitlines()[-1:] or [""]
        raise OSError(exc.errno, f"{exc.strerror} {words[0]}".strip()) from None


def attach_device_program(cgroup_dir: str, program: int) -> None:
    """attach_device_program attaches a loaded device program (its descriptor, which the
    caller keeps and may attach again elsewhere) to the cgroup-v2 directory. Raises OSError
    where the kernel refuses."""
    target = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        attr = _Attach(
            target_fd=target,
            attach_bpf_fd=program,
            attach_type=_CGROUP_DEVICE,
            attach_flags=_ALLOW_MULTI,
        )
        _bpf(_PROG_ATTACH, attr)
    finally:
        os.close(target)
