"""shares says what a pod holding a share of one GPU is held to under NVIDIA MPS: pure values
that mps (the daemons' I/O) carries out.

A pod whose only GPU grant is a share (0 < share < 1) of one GPU is held by an MPS control
daemon of its account's for that GPU and that share (its group, `share_group`), started by the
agent before the first such pod's program runs and stopped after the last one's ends (see
mps), with:

- its own pipe and log directories (CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY) under the
  agent's data directory, so the pod reaches this daemon and no other;
- CUDA_VISIBLE_DEVICES set to that one GPU (its UUID), so its server opens no other GPU;
- two defaults set through its control pipe before any client can connect:
  `set_default_device_pinned_mem_limit <GPU> <MiB>M` = share * the GPU's memory, and
  `set_default_active_thread_percentage <P>` with P = max(1, round(share * 100)).

Why the daemon's defaults and not the pod's environment: MPS clients (every CUDA process of the
pod) take both limits from their server; CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and
CUDA_MPS_PINNED_DEVICE_MEM_LIMIT in a client's own environment can only lower them ("this
environment variable will only further constrain the limit set by the control daemon ... If
the control daemon has a lower setting, the control daemon setting will be obeyed by the client
instead", docs.nvidia.com/deploy/mps, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE;
`set_default_device_pinned_mem_limit` "sets the default device pinned memory limit for each
MPS client", value "an integer followed by a qualifier, either G or M", MPS control commands).
Both were measured to hold on an H200 (a 4 GiB pinned limit failed a 6 GiB allocation; 25 %
of threads cut a matmul loop to about 45 %).

Why one daemon per account, GPU and share size, not one per GPU nor one per pod: a control
daemon runs one server per Unix user at a time and makes another user's server wait until the
first has no clients (nvidia-cuda-mps-control(1)); pods of different owners sharing one daemon
would run one after the other (measured on an H200: the second account's loop began after the
first's ended). And `set_default_*` binds only servers started after it, so one daemon cannot
give two pods different shares. But two daemons' servers on one GPU are two CUDA contexts the
GPU time-slices, each held to its threads while it runs: two owners' 0.5 pods at once each ran
at 30 % of the card's matmul rate (46 % of a 0.5 pod alone), where one owner's two 0.5 pods
under one daemon ran side by side at 47 % each (H200, bench/RESULTS.md). So the pods of one account holding
the same share of the same GPU (an actor set packed onto a card, the common case) share one
daemon, its limits per client as before, and run side by side; another account, or another
share size, gets a daemon of its own. NVIDIA's own Kubernetes drivers make a daemon per
resource or per claim the same way (k8s-device-plugin's mps-control-daemon,
k8s-dra-driver-gpu's MpsControlDaemon, which also names devices by UUID: "set
CUDA_VISIBLE_DEVICES to UUID_1,UUID_2", MPS environment variables). Unlike them, the agent
never changes a GPU's compute mode (nor MIG, nor clocks): two daemons on one GPU need it
left DEFAULT (EXCLUSIVE_PROCESS admits one server per GPU). One account's pods under one
server share its fate: a server that fails takes down the contexts of every pod it serves,
all that account's own.

What a pod's program can and cannot undo: raising or unsetting CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
or CUDA_MPS_PINNED_DEVICE_MEM_LIMIT changes nothing, the daemon's defaults hold. A program that
drops CUDA_MPS_PIPE_DIRECTORY connects to no daemon of its own and (the compute mode being
DEFAULT) gets an ordinary CUDA context without MPS limits: these limits hold a program that
uses the GPU as it is given, they are not a wall against one that leaves MPS on purpose. The
limits are per MPS client: each CUDA process of the pod is held to the share, several of them
together are not held to it in sum. Not verified here (no GPU): that a client whose
CUDA_VISIBLE_DEVICES names the GPU's UUID finds it behind a daemon started with the same
(NVIDIA documents that indices are remapped by the server and recommends UUIDs), and that the
pinned limit's <dev> may be a UUID (k8s-dra-driver-gpu sends UUIDs; with no UUID known the
daemon's only GPU is its device 0).

The pod's environment also carries the frameworks' own caps, so ordinary programs fit under the
limit instead of failing at it: XLA_PYTHON_CLIENT_MEM_FRACTION = share * 0.9 (JAX preallocates
that fraction of the device's memory, which MPS still reports whole; XLA_PYTHON_CLIENT_PREALLOCATE
is left as the pod sets it), TF_FORCE_GPU_ALLOW_GROWTH=true (TensorFlow grows instead of taking
nearly all memory), ARRANGER_GPU_MEMORY_BYTES = the limit. PyTorch gets nothing forced
(PYTORCH_CUDA_ALLOC_CONF is the pod's): its caching allocator raises CUDA out-of-memory at
the MPS limit, and `torch.cuda.set_per_process_memory_fraction(share)` is the program's to
call. A value the pod sets itself for a framework cap is kept; the MPS directories and
ARRANGER_GPU_MEMORY_BYTES are the agent's.

Only plain processes are held so far: a container given a share is refused where shares are
held (see mps.share_of), since its daemon's pipe directory and shared memory are not brought
into it. A daemon's
directory is named by a hash of its group, so its control socket's path stays within a Unix
socket address's 107 bytes whatever the job and pod are called.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from arranger.agent.discovery import GpuDevice

MIB = 2**20
XLA_HEADROOM = 0.9  # of the share, for JAX's preallocation: CUDA's context and libraries need room
PID_FILE = "nvidia-cuda-mps-control.pid"  # the daemon writes its pid here, in its pipe directory
CONTROL_SOCKET = "control"  # the daemon's socket in its pipe directory
SOCKET_PATH_MAX = 107  # bytes of a Unix socket's path (sun_path is 108, NUL included)


@dataclass(frozen=True)
class HeldShare:
    """HeldShare: one pod attempt's share of one GPU, as the MPS daemon of its group holds it.

    `key` is the run's (`<pod uid>.<attempt>`); `group` its daemon's (see share_group); `home`
    the daemon's directory, whose `pipe` and `log` it is given. `memory_bytes` is the limit as MPS applies it: share * the GPU's memory,
    rounded down to whole MiB (never below 1 MiB); `thread_percentage` is 1..100."""

    key: str
    group: str
    gpu_index: int
    gpu_uuid: str
    share: float
    memory_bytes: int
    thread_percentage: int
    home: Path

    @property
    def pipe_dir(self) -> Path:
        return self.home / "pipe"

    @property
    def log_dir(self) -> Path:
        return self.home / "log"

    @property
    def device(self) -> str:
        """device: the GPU as the daemon names it: its UUID, or 0, the one device it sees."""
        return self.gpu_uuid or "0"

    def daemon_env(self) -> dict[str, str]:
        """daemon_env: what the daemon (and every nvidia-cuda-mps-control run that talks to it)
        gets beyond the root PATH."""
        return {
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir),
            "CUDA_VISIBLE_DEVICES": self.gpu_uuid or str(self.gpu_index),
        }

    def commands(self) -> list[str]:
        """commands: what the daemon is told, in order, before the pod's program runs."""
        return [
            f"set_default_device_pinned_mem_limit {self.device} {self.memory_bytes // MIB}M",
            f"set_default_active_thread_percentage {self.thread_percentage}",
        ]

    def pod_env(self, own: Mapping[str, str]) -> dict[str, str]:
        """pod_env: what the pod's environment gets, given `own`, the one made so far (the
        framework caps the pod set itself are kept)."""
        caps = {
            "XLA_PYTHON_CLIENT_MEM_FRACTION": f"{round(self.share * XLA_HEADROOM, 4):g}",
            "TF_FORCE_GPU_ALLOW_GROWTH": "true",
        }
        env = {k: v for k, v in caps.items() if k not in own}
        env.update(
            CUDA_MPS_PIPE_DIRECTORY=str(self.pipe_dir),
            CUDA_MPS_LOG_DIRECTORY=str(self.log_dir),
            CUDA_VISIBLE_DEVICES=self.gpu_uuid or "0",  # as the daemon's server numbers it
            ARRANGER_GPU_MEMORY_BYTES=str(self.memory_bytes),
        )
        return env

    def socket_fits(self) -> bool:
        """socket_fits: whether the daemon's control socket path fits a Unix socket address."""
        return len(str(self.pipe_dir / CONTROL_SOCKET).encode()) <= SOCKET_PATH_MAX


def daemon_home(top: Path, key: str) -> Path:
    """daemon_home: the directory of the daemon `key` names (a group, or the run of a daemon
    an earlier release made per run) under `top`: named by a hash of the key, so that the
    socket's path stays short whatever the job and pod are called."""
    return top / hashlib.sha256(key.encode()).hexdigest()[:16]


def share_group(account: int, gpu: GpuDevice, share: float) -> str:
    """share_group: the daemon a share is held by: one per account, GPU and share size (see
    above why). The "group:" prefix keeps it apart from a run's key."""
    return f"group:{account}:{gpu.uuid or gpu.index}:{share:.6g}"


def held_share(
    key: str,
    grants: Sequence[tuple[int, float]],
    gpus: Mapping[int, GpuDevice],
    top: Path,
    account: int,
) -> HeldShare | None:
    """held_share: what run `key`, whose programs run as `account`, is held to, given its GPU
    grants (index, share) and the node's GPUs; None unless its one grant is a share below a
    whole GPU of a GPU known here."""
    if len(grants) != 1:
        return None
    index, share = grants[0]
    gpu = gpus.get(index)
    if not 0 < share < 1 or gpu is None:
        return None
    memory = max(MIB, int(share * gpu.memory_bytes) // MIB * MIB)
    percentage = min(100, max(1, round(share * 100)))
    group = share_group(account, gpu, share)
    home = daemon_home(top, group)
    return HeldShare(key, group, index, gpu.uuid, share, memory, percentage, home)
