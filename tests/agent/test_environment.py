"""The contract of a pod's environment (environment.pod_environment): the names it sets, what
wins over what, and what an order may not override."""

from __future__ import annotations

from pathlib import Path

from arranger.agent.config import PodUser
from arranger.agent.discovery import GpuDevice
from arranger.agent.environment import (
    INHERITED_ENV,
    NodeEnvironment,
    inherited_env,
    pod_environment,
)
from arranger.agent.orders import GpuGrant, LaunchOrder, Volume
from arranger.agent.runtime import CONTAINER_SCRATCH
from arranger.agent.shares import held_share

SCRATCH = Path("/data/scratch/j/p")
NODE = NodeEnvironment(
    "n1", "10.0.0.1", {"PATH": "/usr/bin", "HOME": "/root", "LANG": "C.UTF-8"}, mps=True
)
USER = PodUser("jobs", 1001, 1002, (1002,), "/home/jobs")
GPU = GpuDevice(0, "GPU-aaaa", "H100", 80 * 2**30)
# What an order may set that the agent sets after it, whatever the order says.
AGENTS_OWN = {
    "ARRANGER_NODE_NAME": "spec",
    "ARRANGER_SCRATCH_DIR": "spec",
    "ARRANGER_PORT_RPC": "spec",
    "ARRANGER_LEADER_HOST": "spec",
    "ARRANGER_LEADER_PORT": "spec",
    "ARRANGER_LEADER_ADDR": "spec",
    "ARRANGER_GPU_FRACTION": "spec",
    "CUDA_VISIBLE_DEVICES": "spec",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "spec",
}


def env_of(order: LaunchOrder, node: NodeEnvironment = NODE, **kwargs: object) -> dict[str, str]:
    return pod_environment(node, order, {"rpc": 4000}, SCRATCH, **kwargs)  # type: ignore[arg-type]


def test_a_process_gets_the_contract_over_what_it_inherits() -> None:
    order = LaunchOrder("j/p", 0, env={"A": "1", "PATH": "/opt/bin"}, leader_port_name="rpc")
    env = env_of(order)
    assert env == {
        "PATH": "/opt/bin",  # the order's own wins over what the agent passes on
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "A": "1",
        "ARRANGER_NODE_NAME": "n1",
        "ARRANGER_SCRATCH_DIR": str(SCRATCH),
        "ARRANGER_PORT_RPC": "4000",
        "ARRANGER_LEADER_HOST": "10.0.0.1",
        "ARRANGER_LEADER_PORT": "4000",
        "ARRANGER_LEADER_ADDR": "10.0.0.1:4000",
        "CUDA_VISIBLE_DEVICES": "",
    }


def test_the_pods_account_replaces_the_agents_home_and_the_order_wins_over_both() -> None:
    env = env_of(LaunchOrder("j/p", 0), user=USER)
    assert (env["HOME"], env["USER"], env["LOGNAME"]) == ("/home/jobs", "jobs", "jobs")
    env = env_of(LaunchOrder("j/p", 0, env={"HOME": "/work"}), user=USER)
    assert env["HOME"] == "/work" and env["USER"] == "jobs"


def test_an_order_cannot_override_the_agents_own_variables() -> None:
    order = LaunchOrder("j/p", 0, env=AGENTS_OWN, gpus=(GpuGrant(3, 0.25),), leader_port_name="rpc")
    env = env_of(order)
    assert {k: env[k] for k in AGENTS_OWN} == {
        "ARRANGER_NODE_NAME": "n1",
        "ARRANGER_SCRATCH_DIR": str(SCRATCH),
        "ARRANGER_PORT_RPC": "4000",
        "ARRANGER_LEADER_HOST": "10.0.0.1",
        "ARRANGER_LEADER_PORT": "4000",
        "ARRANGER_LEADER_ADDR": "10.0.0.1:4000",
        "ARRANGER_GPU_FRACTION": "0.25",
        "CUDA_VISIBLE_DEVICES": "3",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
    }


def test_what_the_agent_sets_only_where_it_applies_is_the_orders_elsewhere() -> None:
    # A worker's rendezvous variables come with its order (it has no leader port of its own).
    order = LaunchOrder("j/w", 0, env={"ARRANGER_LEADER_ADDR": "10.0.0.9:5000"})
    env = env_of(order)
    assert env["ARRANGER_LEADER_ADDR"] == "10.0.0.9:5000" and "ARRANGER_LEADER_HOST" not in env
    whole = LaunchOrder(
        "j/p", 0, gpus=(GpuGrant(0), GpuGrant(2)), env={"ARRANGER_GPU_FRACTION": "x"}
    )
    env = env_of(whole)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,2" and env["ARRANGER_GPU_FRACTION"] == "x"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env


def test_a_share_exports_its_fraction_and_mps_percentage_only_where_configured() -> None:
    order = LaunchOrder("j/p", 0, gpus=(GpuGrant(3, 0.25),))
    assert env_of(order)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    plain = NodeEnvironment("n1", "10.0.0.1")
    env = env_of(order, plain)
    assert env["ARRANGER_GPU_FRACTION"] == "0.25" and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env


def test_a_held_share_names_its_daemon_over_the_order_but_keeps_the_orders_framework_caps() -> None:
    held = held_share("j/p.0", [(0, 0.5)], {0: GPU}, Path("/data/mps"), 1000)
    assert held is not None
    own = {
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.2",
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/mine",
        "ARRANGER_GPU_MEMORY_BYTES": "1",
    }
    env = env_of(LaunchOrder("j/p", 0, env=own, gpus=(GpuGrant(0, 0.5),)), held=held)
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.2"  # the order's own cap
    assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(held.pipe_dir)
    assert env["CUDA_MPS_LOG_DIRECTORY"] == str(held.log_dir)
    assert env["ARRANGER_GPU_MEMORY_BYTES"] == str(held.memory_bytes)
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-aaaa"  # as the daemon's server numbers it
    container = env_of(LaunchOrder("j/p", 0, gpus=(GpuGrant(0, 0.5),)), container=True, held=held)
    assert "CUDA_MPS_PIPE_DIRECTORY" not in container  # a container's share is not held


def test_a_container_gets_nothing_of_the_agents_and_its_paths_as_it_sees_them() -> None:
    node = NodeEnvironment("n1", "10.0.0.1", {"PATH": "/usr/bin"}, gpu_uuids={0: "GPU-a"})
    order = LaunchOrder(
        "j/p",
        0,
        env={"NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VISIBLE_DEVICES": "7"},
        volumes=(Volume("data", "/srv/data", "/data"),),
    )
    env = env_of(order, node, container=True, user=USER)
    assert "PATH" not in env and "HOME" not in env  # the image has its own
    assert env["ARRANGER_SCRATCH_DIR"] == CONTAINER_SCRATCH
    assert env["ARRANGER_VOLUME_DATA"] == "/data"
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert "ARRANGER_VOLUME_DATA" not in env_of(order, node)  # a process reaches the host path


def test_a_container_names_its_gpus_by_uuid_where_every_one_is_known_else_from_0() -> None:
    node = NodeEnvironment("n1", "10.0.0.1", gpu_uuids={0: "GPU-a", 2: "GPU-c"})
    known = LaunchOrder("j/p", 0, gpus=(GpuGrant(2), GpuGrant(0)))
    env = env_of(known, node, container=True)
    assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] == "GPU-c,GPU-a"
    unknown = LaunchOrder("j/p", 0, gpus=(GpuGrant(2), GpuGrant(1)))
    env = env_of(unknown, node, container=True)
    assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] == "0,1"


def test_a_process_inherits_only_the_listed_variables_with_the_path_prefix() -> None:
    agents = {"PATH": "/usr/bin", "LD_PRELOAD": "/evil.so", "TZ": "UTC", "SECRET": "x"}
    assert inherited_env(agents) == {"PATH": "/usr/bin", "TZ": "UTC"}
    assert inherited_env(agents, ("/opt/a", "/opt/b"))["PATH"] == "/opt/a:/opt/b:/usr/bin"
    assert set(inherited_env({k: "v" for k in INHERITED_ENV})) == set(INHERITED_ENV)
