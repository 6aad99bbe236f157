"""What a pod holding a share of one GPU is held to: the limits its MPS daemon is told, in the
form MPS takes them, and what the pod's environment says (pure: no daemon, no process)."""

from __future__ import annotations

from pathlib import Path

from arranger.agent.discovery import GpuDevice
from arranger.agent.shares import daemon_home, held_share, share_group

GI, MI = 2**30, 2**20
GPUS = {0: GpuDevice(0, "GPU-aaaa", "H200", 141 * GI), 3: GpuDevice(3, "", "X", 10 * GI)}
TOP = Path("/var/lib/arranger-agent/mps")


def test_a_share_is_held_to_its_part_of_the_gpus_memory_and_threads() -> None:
    held = held_share("j/p.0", [(0, 0.25)], GPUS, TOP, 1000)
    assert held is not None
    assert held.memory_bytes == 141 * GI // 4 // MI * MI and held.thread_percentage == 25
    assert held.commands() == [
        f"set_default_device_pinned_mem_limit GPU-aaaa {141 * 1024 // 4}M",
        "set_default_active_thread_percentage 25",
    ]
    assert held.group == share_group(1000, GPUS[0], 0.25) == "group:1000:GPU-aaaa:0.25"
    home = daemon_home(TOP, held.group)
    assert held.pipe_dir == home / "pipe" and held.log_dir == home / "log"
    assert home.parent == TOP and len(home.name) == 16 and held.socket_fits()
    assert held.daemon_env() == {
        "CUDA_MPS_PIPE_DIRECTORY": str(home / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(home / "log"),
        "CUDA_VISIBLE_DEVICES": "GPU-aaaa",
    }


def test_tiny_and_odd_shares_round_as_mps_takes_them() -> None:
    tiny = held_share("j/p.0", [(3, 0.001)], GPUS, TOP, 1000)
    assert tiny is not None and tiny.thread_percentage == 1  # never 0: MPS takes 1..100
    assert tiny.memory_bytes == 10 * MI  # whole MiB, rounded down
    third = held_share("j/p.0", [(3, 1 / 3)], GPUS, TOP, 1000)
    assert third is not None and third.thread_percentage == 33
    assert third.commands()[0] == "set_default_device_pinned_mem_limit 0 3413M"  # no UUID: 0


def test_whole_gpus_several_grants_and_unknown_gpus_are_not_held() -> None:
    assert held_share("j/p.0", [(0, 1.0)], GPUS, TOP, 1000) is None
    assert held_share("j/p.0", [(0, 0.5), (3, 0.5)], GPUS, TOP, 1000) is None
    assert held_share("j/p.0", [], GPUS, TOP, 1000) is None
    assert held_share("j/p.0", [(7, 0.5)], GPUS, TOP, 1000) is None
    assert held_share("j/p.0", [(0, 0.0)], GPUS, TOP, 1000) is None


def test_the_pods_environment_names_its_daemon_and_the_frameworks_caps() -> None:
    held = held_share("j/p.1", [(0, 0.5)], GPUS, TOP, 1000)
    assert held is not None
    env = held.pod_env({"PATH": "/bin"})
    assert env == {
        "CUDA_MPS_PIPE_DIRECTORY": str(held.pipe_dir),
        "CUDA_MPS_LOG_DIRECTORY": str(held.log_dir),
        "CUDA_VISIBLE_DEVICES": "GPU-aaaa",
        "ARRANGER_GPU_MEMORY_BYTES": str(held.memory_bytes),
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.45",
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
    }
    # What the pod set itself for a framework stays; PyTorch and XLA's preallocation are its own.
    own = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.2", "CUDA_MPS_PIPE_DIRECTORY": "/tmp/mine"}
    env = held.pod_env(own)
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in env
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(held.pipe_dir)
    assert not {"PYTORCH_CUDA_ALLOC_CONF", "XLA_PYTHON_CLIENT_PREALLOCATE"} & set(env)
    same = held_share("j/q.0", [(0, 0.5)], GPUS, TOP, 1000)
    assert same is not None and same.pipe_dir == held.pipe_dir  # one daemon: account, GPU, share
    others = [
        held_share("j/q.0", [(0, 0.5)], GPUS, TOP, 1001),  # another account
        held_share("j/q.0", [(0, 0.25)], GPUS, TOP, 1000),  # another share
        held_share("j/q.0", [(3, 0.5)], GPUS, TOP, 1000),  # another GPU
    ]
    pipes = {other.pipe_dir for other in others if other is not None}
    assert len(pipes) == 3 and held.pipe_dir not in pipes
